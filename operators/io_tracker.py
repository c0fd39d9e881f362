"""The dispatcher's I/O in flight: HTTP requests and Cassandra reads/writes, per endpoint.

Futures complete on the I/O loop's thread; the dispatcher only looks at them from its own task
thread, in the endpoint's keyed context, when a timer or an element for that endpoint arrives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.endpoint_driver import IoKind
from operators.write_batcher import Completion


@dataclass(frozen=True)
class Finished:
    kind: IoKind
    key: str  # delivery_id
    result: Any
    exc: BaseException | None
    tag: Any  # what the starter attached (e.g. the event id a persist claimed)


class IoTracker:
    def __init__(self) -> None:
        self._by_endpoint: dict[str, dict[tuple[IoKind, str], tuple[Completion, int, Any]]] = {}
        self.storage_in_flight = 0  # everything but HTTP requests: bounded operator-wide

    def add(self, endpoint_id: str, kind: IoKind, key: str, fut: Completion, now_ms: int, tag: Any = None) -> None:
        self._by_endpoint.setdefault(endpoint_id, {})[(kind, key)] = (fut, now_ms, tag)
        if kind != "send":
            self.storage_in_flight += 1

    def finished(self, endpoint_id: str) -> list[Finished]:
        io = self._by_endpoint.get(endpoint_id)
        if not io:
            return []
        out = []
        for (kind, key), (fut, _, tag) in list(io.items()):
            if not fut.done():
                continue
            del io[(kind, key)]
            if kind != "send":
                self.storage_in_flight -= 1
            exc = fut.exception()
            out.append(Finished(kind, key, None if exc is not None else fut.result(), exc, tag))
        if not io:
            del self._by_endpoint[endpoint_id]
        return out

    def busy(self, endpoint_id: str) -> bool:
        return bool(self._by_endpoint.get(endpoint_id))

    def poll_at(self, endpoint_id: str, now_ms: int, base_ms: int) -> int | None:
        """When to look at this endpoint's I/O again (None: nothing in flight). Young I/O is
        checked every ``base_ms``; I/O that has run a while at a quarter of its age (at most once
        a second), so a thousand hanging requests cost about a thousand timer calls per second
        instead of a hundred thousand, and a slow answer is noticed within ~25 % of its latency."""
        io = self._by_endpoint.get(endpoint_id)
        if not io:
            return None
        youngest = max(started for _, started, _ in io.values())
        return now_ms + max(base_ms, min(1000, (now_ms - youngest) // 4))
