"""What the dispatcher keeps per endpoint in checkpointed keyed state, and the durability policy.

The driver (:mod:`core.endpoint_driver`) writes through this interface; the Flink adapter backs it
with keyed state (:mod:`operators.endpoint_state`), unit tests with :class:`InMemoryEndpointStore`.
Cassandra, not keyed state, is the authority for finished work, which is what lets keyed state be
written rarely and lag behind:

| what                          | where         | written                              | a restore                  |
|-------------------------------|---------------|--------------------------------------|----------------------------|
| pending delivery (no payload) | keyed map     | on arrival; after each durable       | CHECKs it against          |
|                               |               | record (next time, counts); removed  | Cassandra before anything  |
|                               |               | once its final record is durable     | else                       |
| payload bytes                 | keyed map     | on arrival; removed with delivery    | read as is                 |
| replay requests to load       | keyed map     | on arrival; removed once loaded      | loads them again           |
| replay request ids seen       | keyed map     | on arrival (TTL 7 days)              | dedupes against them       |
| endpoint config               | keyed value   | on a newer config version            | read as is                 |
| breaker, token bucket, 410    | keyed values  | on change                            | read as is                 |
| stage, intent, in-flight I/O  | driver memory | never                                | gone: CHECK redoes it      |
| tenant slots                  | scheduler     | never                                | gone with their requests   |

Rules the driver keeps: (1) no request leaves before its attempt row is durable in Cassandra
(the intent); (2) a delivery leaves keyed state only after its final record is durable;
(3) a restored entry is not sent before its durable record was read (CHECK): final there means
never sent again, and attempt numbering continues after the highest stored number. So a crash
re-sends only what was in flight or recorded-but-not-yet-durable, and every re-send has its own
attempt row.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from core.breaker import BreakerState
from core.dispatch import ManualRequest, Pending, for_storage
from core.ratelimit import TokenBucket
from core.records import EndpointConfig


class EndpointStore(Protocol):
    """One endpoint's keyed state (the adapter binds it to the current key)."""

    def entries(self) -> Iterable[Pending]: ...
    def put(self, p: Pending) -> None: ...
    def remove(self, delivery_id: str) -> None: ...

    def replays(self) -> Iterable[tuple[str, tuple[ManualRequest, ...]]]: ...
    def put_replay(self, delivery_id: str, requests: tuple[ManualRequest, ...]) -> None: ...
    def remove_replay(self, delivery_id: str) -> None: ...
    def seen_request(self, request_id: str) -> bool: ...
    def mark_request(self, request_id: str, at_ms: int) -> None: ...

    def config(self) -> EndpointConfig | None: ...
    def put_config(self, cfg: EndpointConfig) -> None: ...
    def breaker(self) -> BreakerState | None: ...
    def put_breaker(self, b: BreakerState) -> None: ...
    def bucket(self) -> TokenBucket | None: ...
    def put_bucket(self, b: TokenBucket | None) -> None: ...
    def gone_at(self) -> int | None: ...
    def put_gone_at(self, version: int | None) -> None: ...


class InMemoryEndpointStore:
    """The same contract in plain dicts: unit and model-based tests, no Flink."""

    def __init__(self) -> None:
        self.pending: dict[str, Pending] = {}
        self.replay_requests: dict[str, tuple[ManualRequest, ...]] = {}
        self.request_ids: dict[str, int] = {}
        self.cfg: EndpointConfig | None = None
        self.breaker_state: BreakerState | None = None
        self.bucket_state: TokenBucket | None = None
        self.gone: int | None = None
        self.writes = 0  # state writes, for tests that bound them

    def entries(self) -> Iterable[Pending]:
        return list(self.pending.values())

    def put(self, p: Pending) -> None:
        self.writes += 1
        self.pending[p.delivery_id] = for_storage(p)

    def remove(self, delivery_id: str) -> None:
        self.writes += 1
        self.pending.pop(delivery_id, None)

    def replays(self) -> Iterable[tuple[str, tuple[ManualRequest, ...]]]:
        return list(self.replay_requests.items())

    def put_replay(self, delivery_id: str, requests: tuple[ManualRequest, ...]) -> None:
        self.replay_requests[delivery_id] = requests

    def remove_replay(self, delivery_id: str) -> None:
        self.replay_requests.pop(delivery_id, None)

    def seen_request(self, request_id: str) -> bool:
        return request_id in self.request_ids

    def mark_request(self, request_id: str, at_ms: int) -> None:
        self.request_ids[request_id] = at_ms

    def config(self) -> EndpointConfig | None:
        return self.cfg

    def put_config(self, cfg: EndpointConfig) -> None:
        self.cfg = cfg

    def breaker(self) -> BreakerState | None:
        return self.breaker_state

    def put_breaker(self, b: BreakerState) -> None:
        self.breaker_state = b

    def bucket(self) -> TokenBucket | None:
        return self.bucket_state

    def put_bucket(self, b: TokenBucket | None) -> None:
        self.bucket_state = b

    def gone_at(self) -> int | None:
        return self.gone

    def put_gone_at(self, version: int | None) -> None:
        self.gone = version
