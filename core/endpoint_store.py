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
| payload bytes                 | keyed map     | on arrival; removed once the event   | read as is                 |
|                               |               | row is durable (or with delivery)    |                            |
| overflow queue (spilled       | keyed map by  | when an endpoint holds more than its | head..tail read back a     |
| waiting deliveries, intent)   | sequence no.  | memory window; moved back to the     | page at a time; entries of |
|                               | + head/tail   | pending map a page at a time, FIFO   | an earlier incarnation are |
|                               |               |                                      | CHECKed like the others    |
| retry queue (retries moved    | keyed map by  | when memory is full and earlier-due  | bucket index read back;    |
| out of memory, intent)        | bucket:seq    | work waits for it, latest next       | a bucket comes back once   |
|                               | + keyed map   | attempt first; moved back to the     | it starts; entries of an   |
|                               | bucket ->     | pending map once due (bucket start)  | earlier incarnation are    |
|                               | RetryBucket   | or past the bucket's earliest        | CHECKed like the others    |
|                               |               | deadline                             |                            |
| ordering key, operator's skip | in the        | with the entry; a skip as it arrives | re-joins its key (a head   |
| of a pending delivery         | pending entry |                                      | sent before stays head);   |
|                               |               |                                      | applies the skip           |
| replay requests to load       | keyed map     | on arrival; removed once loaded      | loads them again           |
| replay request ids seen       | keyed map     | on arrival (TTL 7 days)              | dedupes against them       |
| endpoint config               | keyed value   | on a newer config version            | read as is                 |
| breaker, token bucket, 410    | keyed values  | on change                            | read as is                 |
| (the breaker's failing        |               |                                      | (an episode re-run after   |
| episode count)                |               |                                      | the restore has its number)|
| signals (core.records)        | Kafka sink    | flushed at each checkpoint           | re-observed: an exhausted  |
|                               |               |                                      | delivery when CHECKed      |
| stage, intent, in-flight I/O  | driver memory | never                                | gone: CHECK redoes it      |
| write failures and refusals,  | driver memory | never                                | counted again from zero    |
| tries not sent, gauge indexes |               |                                      | (the indexes rebuilt)      |
| tenant slots                  | scheduler     | never                                | gone with their requests   |

A traced delivery's entry also holds the traceparent its attempts continue (NewDelivery.trace),
so a retry after a restore is a span of the same trace; an entry without one keeps its old shape.

Rules the driver keeps: (1) no request leaves before its attempt row is durable in Cassandra
(the intent); (2) a delivery leaves keyed state only after its final record is durable;
(3) a restored entry is not sent before its durable record was read (CHECK): final there means
never sent again, and attempt numbering continues after the highest stored number. So a crash
re-sends only what was in flight or recorded-but-not-yet-durable, and every re-send has its own
attempt row.

The overflow queue keeps the driver's memory bounded by its window whatever the backlog (issue
18): a waiting delivery beyond the window leaves memory *and* the pending map (so a restore reads
only the window back), in arrival order, which for fresh deliveries is also next-attempt and
deadline order. A spilled entry keeps its reserved intent: paged back in by the incarnation that
spilled it, it is sent with that intent at once; paged in after a restore it is CHECKed first,
because that incarnation may have paged it in and sent it after the checkpoint.

The retry queue keeps memory for the work due soonest: retries the receiver keeps refusing would
otherwise fill it for a day and hold fresh work in the overflow queue behind them. Its entries
are keyed by due-time bucket (``retry_bucket_ms``) and, within one, by a sequence number (FIFO), so
it is read back in due-time order with an index of one entry per bucket -- bounded by the longest
back-off, not by how many retries wait. An entry keeps its reserved intent and is CHECKed after a
restore, like the overflow queue's. Both are new state names: a savepoint taken before they
existed restores with both queues empty.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from core.breaker import BreakerState
from core.dispatch import Intent, ManualRequest, Pending, Stage
from core.fanout import NewDelivery
from core.ratelimit import TokenBucket
from core.records import EndpointConfig, EventRecord

# -- the stored form of a pending delivery --------------------------------------------------------
# A plain tuple, not a pickled dataclass: no class paths or field names in every entry (719 ->
# ~230 bytes for a typical delivery), and a version tag so a later shape can still read this one.
# The endpoint id is the state key and the delivery id the map key, so neither is repeated; the
# payload is not here (it has its own entry, see the table above).
STORED_V1 = 1
STORED_V2 = 2  # + the ordering key and an operator's skip
# + the traceparent its attempts continue (NewDelivery.trace). Written only for a delivery that
# has one: without tracing an entry stays V2, as long as it was.
STORED_V3 = 3
StoredDelivery = tuple
_MANUAL = 17  # index of the manual requests in a stored delivery (every version)
_SKIP = 19  # index of an operator's skip (v2 and v3)


def _request(m: ManualRequest) -> tuple[str, str, int, str]:
    return (m.request_id, m.requested_by, m.requested_at_ms, m.tenant_id)


def encode(p: Pending) -> StoredDelivery:
    d, e = p.delivery, p.delivery.event
    stored = (STORED_V2, e.event_id, e.tenant_id, e.event_type, e.schema_version, e.object_id, e.object_version,
              e.occurred_at_ms, e.target_endpoint_id, d.endpoint_config_version, d.created_at_ms, d.expires_at_ms,
              p.stage is Stage.PERSIST, p.attempt_count, p.issued, p.next_attempt_at_ms, p.auto_retry_active,
              # a manual request being sent is still owed until its record is durable
              tuple(_request(m) for m in ((p.sending_manual,) if p.sending_manual else ()) + p.manual),
              d.ordering_key, _request(p.skip) if p.skip else ())
    if d.trace is not None:
        return (STORED_V3, *stored[1:], d.trace)
    return stored


def _compact(t: StoredDelivery) -> StoredDelivery:
    """A current-shape entry as it is stored: v2 when it has no trace."""
    return (STORED_V2, *t[1:-1]) if t[-1] is None else t


def _current(t: StoredDelivery) -> StoredDelivery:
    """A stored delivery in the current shape (a v1 entry had no ordering key and no skip, a
    v2 entry no trace)."""
    if t[0] == STORED_V1:
        return (STORED_V3, *t[1:], "", (), None)
    if t[0] == STORED_V2:
        return (STORED_V3, *t[1:], None)
    if t[0] != STORED_V3:
        raise ValueError(f"unknown stored delivery version {t[0]!r}")
    return t


def decode(t: StoredDelivery, endpoint_id: str, delivery_id: str) -> Pending:
    (_, event_id, tenant_id, event_type, schema_version, object_id, object_version, occurred_at_ms,
     target, config_version, created_at_ms, expires_at_ms, persist, attempt_count, issued, next_at, auto,
     manual, ordering_key, skip, trace) = _current(t)
    event = EventRecord(event_id=event_id, tenant_id=tenant_id, event_type=event_type,
                        schema_version=schema_version, object_id=object_id, object_version=object_version,
                        occurred_at_ms=occurred_at_ms, payload=b"", target_endpoint_id=target)
    delivery = NewDelivery(delivery_id=delivery_id, event=event, endpoint_id=endpoint_id, tenant_id=tenant_id,
                           endpoint_config_version=config_version, created_at_ms=created_at_ms,
                           expires_at_ms=expires_at_ms, ordering_key=ordering_key, trace=trace)
    return Pending(delivery=delivery, stage=Stage.PERSIST if persist else Stage.READY,
                   attempt_count=attempt_count, issued=issued, next_attempt_at_ms=next_at,
                   auto_retry_active=auto, manual=tuple(ManualRequest(*m) for m in manual),
                   skip=ManualRequest(*skip) if skip else None)


SpilledDelivery = tuple


def encode_spilled(p: Pending) -> SpilledDelivery:
    """A spilled delivery (the map key is a sequence number): its id, stored form and, when it
    has one, its reserved intent."""
    intent = (p.intent.number, p.intent.attempt_id) if p.intent is not None else ()
    return (p.delivery_id, encode(p), *intent)


def decode_spilled(t: SpilledDelivery, endpoint_id: str) -> tuple[Pending, Intent | None]:
    return decode(t[1], endpoint_id, t[0]), (Intent(t[2], t[3]) if len(t) > 2 else None)


NO_DEADLINE = 2**62


@dataclass
class RetryBucket:
    """The index of one retry-queue bucket: a FIFO of sequence numbers [head, tail), and a bound on
    its earliest deadline kept in two parts, so that it is exact again once the entries read past
    are gone: ``older_min`` bounds [head, mark) -- exact when the mark was set, a lower bound once
    entries from its head have left -- and ``newer_min`` is exact for [mark, tail)."""

    head: int = 0
    mark: int = 0
    tail: int = 0
    older_min: int = NO_DEADLINE
    newer_min: int = NO_DEADLINE

    @property
    def size(self) -> int:
        return self.tail - self.head

    @property
    def earliest_deadline_ms(self) -> int:
        return min(self.older_min if self.head < self.mark else NO_DEADLINE,
                   self.newer_min if self.mark < self.tail else NO_DEADLINE)

    def append(self, deadline_ms: int) -> int:
        """The sequence number of a new entry."""
        self.newer_min = min(self.newer_min, deadline_ms)
        self.tail += 1
        return self.tail - 1

    def take(self, n: int) -> range:
        """The sequence numbers of the ``n`` oldest entries, which leave the bucket."""
        seqs = range(self.head, self.head + n)
        self.head += n
        if self.head >= self.mark:  # the older part is gone: the newer one becomes it
            self.older_min, self.mark, self.newer_min = self.newer_min, self.tail, NO_DEADLINE
        return seqs

    def stored(self) -> tuple[int, int, int, int, int]:
        return (self.head, self.mark, self.tail, self.older_min, self.newer_min)


def with_manual(t: StoredDelivery, requests: tuple[ManualRequest, ...]) -> StoredDelivery:
    """The stored delivery with more manual requests owed, and nothing else of it changed."""
    return (*t[:_MANUAL], (*t[_MANUAL], *(_request(m) for m in requests)), *t[_MANUAL + 1:])


def with_skip(t: StoredDelivery, request: ManualRequest) -> StoredDelivery:
    """The stored delivery with an operator's skip owed, and nothing else of it changed."""
    c = _current(t)
    return _compact((*c[:_SKIP], _request(request), *c[_SKIP + 1:]))


class EndpointStore(Protocol):
    """One endpoint's keyed state (the adapter binds it to the current key)."""

    def entries(self, endpoint_id: str) -> Iterable[Pending]: ...
    def put(self, p: Pending) -> None: ...
    def add_manual(self, delivery_id: str, requests: tuple[ManualRequest, ...]) -> None: ...
    def add_skip(self, delivery_id: str, request: ManualRequest) -> None: ...
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

    def spill_range(self) -> tuple[int, int]: ...
    def put_spill_range(self, head: int, tail: int) -> None: ...
    def spill(self, seq: int, p: Pending) -> None: ...
    def unspill(self, endpoint_id: str, seqs: range) -> list[tuple[int, Pending, Intent | None]]: ...
    def peek_spilled(self, endpoint_id: str, seq: int) -> Pending | None: ...

    def retry_buckets(self) -> Iterable[tuple[int, RetryBucket]]: ...
    def put_retry_bucket(self, bucket: int, index: RetryBucket) -> None: ...
    def queue_retry(self, bucket: int, seq: int, p: Pending) -> None: ...
    def unqueue_retries(self, endpoint_id: str, bucket: int,
                        seqs: range) -> list[tuple[int, Pending, Intent | None]]: ...


class InMemoryEndpointStore:
    """The same contract in plain dicts: unit and model-based tests, no Flink. Entries go through
    the same stored form as keyed state, so what a restore gets back is exactly what it would."""

    def __init__(self) -> None:
        self.pending: dict[str, StoredDelivery] = {}
        self.replay_requests: dict[str, tuple[ManualRequest, ...]] = {}
        self.request_ids: dict[str, int] = {}
        self.cfg: EndpointConfig | None = None
        self.breaker_state: BreakerState | None = None
        self.bucket_state: TokenBucket | None = None
        self.gone: int | None = None
        self.spilled: dict[int, SpilledDelivery] = {}
        self.spill_head_tail = (0, 0)
        self.retry_queue: dict[tuple[int, int], SpilledDelivery] = {}  # (bucket, seq) -> entry
        self.retry_bucket_index: dict[int, tuple[int, int, int, int, int]] = {}  # RetryBucket.stored()
        self.writes = 0  # state writes, for tests that bound them

    def entries(self, endpoint_id: str) -> Iterable[Pending]:
        return [decode(t, endpoint_id, did) for did, t in self.pending.items()]

    def put(self, p: Pending) -> None:
        self.writes += 1
        self.pending[p.delivery_id] = encode(p)

    def add_manual(self, delivery_id: str, requests: tuple[ManualRequest, ...]) -> None:
        self.writes += 1
        self.pending[delivery_id] = with_manual(self.pending[delivery_id], requests)

    def add_skip(self, delivery_id: str, request: ManualRequest) -> None:
        self.writes += 1
        self.pending[delivery_id] = with_skip(self.pending[delivery_id], request)

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

    def spill_range(self) -> tuple[int, int]:
        return self.spill_head_tail

    def put_spill_range(self, head: int, tail: int) -> None:
        self.writes += 1
        self.spill_head_tail = (head, tail)

    def spill(self, seq: int, p: Pending) -> None:
        self.writes += 2
        self.pending.pop(p.delivery_id, None)
        self.spilled[seq] = encode_spilled(p)

    def unspill(self, endpoint_id: str, seqs: range) -> list[tuple[int, Pending, Intent | None]]:
        out = []
        for seq in seqs:
            t = self.spilled.pop(seq, None)
            if t is None:
                continue
            self.writes += 1
            out.append((seq, *decode_spilled(t, endpoint_id)))
        return out

    def peek_spilled(self, endpoint_id: str, seq: int) -> Pending | None:
        t = self.spilled.get(seq)
        return decode_spilled(t, endpoint_id)[0] if t is not None else None

    def spilled_ids(self) -> set[str]:
        return {t[0] for t in self.spilled.values()}

    def retry_buckets(self) -> Iterable[tuple[int, RetryBucket]]:
        return [(bucket, RetryBucket(*t)) for bucket, t in self.retry_bucket_index.items()]

    def put_retry_bucket(self, bucket: int, index: RetryBucket) -> None:
        self.writes += 1
        if index.size == 0:
            self.retry_bucket_index.pop(bucket, None)
        else:
            self.retry_bucket_index[bucket] = index.stored()

    def queue_retry(self, bucket: int, seq: int, p: Pending) -> None:
        self.writes += 2
        self.pending.pop(p.delivery_id, None)
        self.retry_queue[(bucket, seq)] = encode_spilled(p)

    def unqueue_retries(self, endpoint_id: str, bucket: int,
                        seqs: range) -> list[tuple[int, Pending, Intent | None]]:
        out = []
        for seq in seqs:
            t = self.retry_queue.pop((bucket, seq), None)
            if t is None:
                continue
            self.writes += 1
            out.append((seq, *decode_spilled(t, endpoint_id)))
        return out

    def queued_retry_ids(self) -> set[str]:
        return {t[0] for t in self.retry_queue.values()}
