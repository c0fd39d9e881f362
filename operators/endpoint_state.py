"""Keyed state of the dispatcher: :class:`core.endpoint_store.EndpointStore` over Flink state.

Every method acts on the current key, so the dispatcher calls it only from process_element and
on_timer. The durability policy (what is written when, what a restore does) is in the docstring
of :mod:`core.endpoint_store`.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyflink.common import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream.functions import RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, StateTtlConfig, ValueStateDescriptor

from core.breaker import BreakerState
from core.dispatch import Intent, ManualRequest, Pending
from core.endpoint_store import (
    RetryBucket,
    decode,
    decode_spilled,
    encode,
    encode_spilled,
    with_manual,
    with_skip,
)
from core.ratelimit import TokenBucket
from core.records import EndpointConfig

# Replay request ids are remembered this long: longer than any redelivery of the replays topic.
_REPLAY_ID_TTL_S = 7 * 24 * 3600


def _map(rc: RuntimeContext, name: str, value_type=None):  # type: ignore[no-untyped-def]
    return rc.get_map_state(MapStateDescriptor(name, Types.STRING(), value_type or Types.PICKLED_BYTE_ARRAY()))


def _value(rc: RuntimeContext, name: str, value_type=None):  # type: ignore[no-untyped-def]
    return rc.get_state(ValueStateDescriptor(name, value_type or Types.PICKLED_BYTE_ARRAY()))


class FlinkEndpointStore:
    def __init__(self, rc: RuntimeContext) -> None:
        # "-v2": the entries' shape changed with the endpoint driver; an older savepoint's
        # "pending" map is not read back as if it were this one.
        self._pending = _map(rc, "pending-v2")
        self._payloads = _map(rc, "payloads")
        self._replays = _map(rc, "replays-to-load")
        ids = MapStateDescriptor("replay-request-ids", Types.STRING(), Types.LONG())
        # Incremental cleanup on access: PyFlink's background cleanup builds a java Duration
        # through the client gateway, which does not exist inside a TaskManager.
        ids.enable_time_to_live(StateTtlConfig.new_builder(Time.seconds(_REPLAY_ID_TTL_S))
                                .disable_cleanup_in_background().cleanup_incrementally(10, False).build())
        self._request_ids = rc.get_map_state(ids)
        self._config = _value(rc, "endpoint-config")
        self._breaker = _value(rc, "breaker")
        self._bucket = _value(rc, "bucket")
        self._gone = _value(rc, "gone-at-version", Types.LONG())
        self._spilled = rc.get_map_state(MapStateDescriptor("spilled", Types.LONG(), Types.PICKLED_BYTE_ARRAY()))
        self._spill_range = _value(rc, "spill-range")
        # The retry queue: entries by "bucket:seq", and its index by bucket (core.endpoint_store).
        self._retry_queue = _map(rc, "retry-queue")
        self._retry_buckets = rc.get_map_state(
            MapStateDescriptor("retry-queue-buckets", Types.LONG(), Types.PICKLED_BYTE_ARRAY()))
        # Deliveries whose payload entry exists, in memory: a state removal costs as much as a
        # put (a JNI call and, on RocksDB, a tombstone), and removing entries that were not there
        # was a large share of the dispatcher's task thread
        # (docs/performance.md#the-taskmanagers-interpreter). A restore learns the entries back
        # in entries(); they are few (only payloads not yet durable in Cassandra).
        self._held: set[str] = set()

    def entries(self, endpoint_id: str) -> Iterable[Pending]:
        self._held.update(self._payloads.keys())
        return [decode(t, endpoint_id, did) for did, t in self._pending.items()]

    def put(self, p: Pending) -> None:
        self._pending.put(p.delivery_id, encode(p))

    def add_manual(self, delivery_id: str, requests: tuple[ManualRequest, ...]) -> None:
        self._pending.put(delivery_id, with_manual(self._pending.get(delivery_id), requests))

    def add_skip(self, delivery_id: str, request: ManualRequest) -> None:
        self._pending.put(delivery_id, with_skip(self._pending.get(delivery_id), request))

    def remove(self, delivery_id: str) -> None:
        self._pending.remove(delivery_id)
        self.remove_payload(delivery_id)

    def payload(self, delivery_id: str) -> bytes | None:
        return self._payloads.get(delivery_id) if delivery_id in self._held else None

    def put_payload(self, delivery_id: str, payload: bytes) -> None:
        self._payloads.put(delivery_id, payload)
        self._held.add(delivery_id)

    def remove_payload(self, delivery_id: str) -> None:
        if delivery_id in self._held:
            self._held.discard(delivery_id)
            self._payloads.remove(delivery_id)

    def replays(self) -> Iterable[tuple[str, tuple[ManualRequest, ...]]]:
        return list(self._replays.items())

    def put_replay(self, delivery_id: str, requests: tuple[ManualRequest, ...]) -> None:
        self._replays.put(delivery_id, requests)

    def remove_replay(self, delivery_id: str) -> None:
        self._replays.remove(delivery_id)

    def seen_request(self, request_id: str) -> bool:
        return self._request_ids.contains(request_id)

    def mark_request(self, request_id: str, at_ms: int) -> None:
        self._request_ids.put(request_id, at_ms)

    def config(self) -> EndpointConfig | None:
        return self._config.value()

    def put_config(self, cfg: EndpointConfig) -> None:
        self._config.update(cfg)

    def breaker(self) -> BreakerState | None:
        return self._breaker.value()

    def put_breaker(self, b: BreakerState) -> None:
        self._breaker.update(b)

    def bucket(self) -> TokenBucket | None:
        return self._bucket.value()

    def put_bucket(self, b: TokenBucket | None) -> None:
        if b is None:
            self._bucket.clear()
        else:
            self._bucket.update(b)

    def gone_at(self) -> int | None:
        return self._gone.value()

    def put_gone_at(self, version: int | None) -> None:
        if version is None:
            self._gone.clear()
        else:
            self._gone.update(version)

    def spill_range(self) -> tuple[int, int]:
        return self._spill_range.value() or (0, 0)

    def put_spill_range(self, head: int, tail: int) -> None:
        if head == tail:
            self._spill_range.clear()
        else:
            self._spill_range.update((head, tail))

    def spill(self, seq: int, p: Pending) -> None:
        self._pending.remove(p.delivery_id)
        self._spilled.put(seq, encode_spilled(p))

    def unspill(self, endpoint_id: str, seqs: range) -> list[tuple[int, Pending, Intent | None]]:
        out = []
        for seq in seqs:
            t = self._spilled.get(seq)
            if t is None:
                continue
            self._spilled.remove(seq)
            out.append((seq, *decode_spilled(t, endpoint_id)))
        return out

    def peek_spilled(self, endpoint_id: str, seq: int) -> Pending | None:
        t = self._spilled.get(seq)
        return decode_spilled(t, endpoint_id)[0] if t is not None else None

    def retry_buckets(self) -> Iterable[tuple[int, RetryBucket]]:
        return [(bucket, RetryBucket(*t)) for bucket, t in self._retry_buckets.items()]

    def put_retry_bucket(self, bucket: int, index: RetryBucket) -> None:
        if index.size == 0:
            self._retry_buckets.remove(bucket)
        else:
            self._retry_buckets.put(bucket, index.stored())

    def queue_retry(self, bucket: int, seq: int, p: Pending) -> None:
        self._pending.remove(p.delivery_id)
        self._retry_queue.put(f"{bucket}:{seq}", encode_spilled(p))

    def unqueue_retries(self, endpoint_id: str, bucket: int,
                        seqs: range) -> list[tuple[int, Pending, Intent | None]]:
        out = []
        for seq in seqs:
            key = f"{bucket}:{seq}"
            t = self._retry_queue.get(key)
            if t is None:
                continue
            self._retry_queue.remove(key)
            out.append((seq, *decode_spilled(t, endpoint_id)))
        return out
