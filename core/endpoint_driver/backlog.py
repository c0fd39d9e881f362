"""One endpoint's backlog: what its memory window holds and the two queues in keyed state.

An endpoint keeps at most ``memory_window`` fresh deliveries (never attempted) in memory, and
twice that in all. Fresh waiting ones beyond it go to the *overflow queue* (FIFO, by sequence
number) and come back a page at a time. When memory is full and fresh work or a queued retry that
is due waits for it, the retries in memory whose next attempt is latest go to the *retry queue*
(by due-time bucket, a FIFO each) and come back when their bucket starts, or at once when one of
them is past its deadline. So retries a receiver keeps refusing cost keyed state, not memory, and
never keep fresh work out. :mod:`core.endpoint_store` has the stored form and the restore rules.

:class:`Backlog` decides what moves between memory and the queues; the memory itself (the
deliveries held and their indexes) is the driver's, seen through :class:`Memory`. A delivery
paged back is sendable with its reserved intent only if this incarnation queued it and no other
copy can be queued; otherwise it is CHECKed first (its durable record decides).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping
from typing import Protocol

from core import dispatch as d
from core.dispatch import Intent, Pending, Stage, replace
from core.endpoint_driver.decision import Decision
from core.endpoint_driver.policy import DriverPolicy
from core.endpoint_store import EndpointStore, RetryBucket


class Memory(Protocol):
    """The driver's memory as the backlog sees it."""

    @property
    def items(self) -> Mapping[str, Pending]:
        """Every delivery held in memory, by id."""
        ...

    @property
    def fresh_count(self) -> int:
        """How many of them were never attempted (what the memory window counts)."""
        ...

    def in_key(self, delivery_id: str) -> bool:
        """Whether it is a member of an ordering key (whose order lives in memory)."""
        ...

    def note_version(self, config_version: int) -> None:
        """A delivery paged back was fanned out with this endpoint config version."""
        ...

    def page_back(self, p: Pending) -> None:
        """``p`` comes back into memory (persisted, joined to its key, indexed)."""
        ...

    def release(self, delivery_id: str) -> None:
        """A retry leaves memory for the retry queue."""
        ...


class Backlog:
    def __init__(self, endpoint_id: str, policy: DriverPolicy, store: EndpointStore, counts: Counter[str],
                 memory: Memory) -> None:
        self.endpoint_id = endpoint_id
        self.policy = policy
        self.store = store
        self.counts = counts
        self.memory = memory
        # The overflow queue: sequence numbers [head, tail) in keyed state. Entries from
        # own_from on were spilled by this incarnation (their intent is unused); earlier ones
        # are a restore's and are CHECKed. superseded: queued deliveries (either queue) a replay
        # or a re-creation loaded into memory meanwhile -- their queued copy is CHECKed too when it
        # comes back, and the memory copy is queued without its intent (CHECKed too).
        self.spill_head, self.spill_tail = store.spill_range()
        self.own_from = self.spill_tail
        self.superseded: set[str] = set()
        self.head_expires = self._peek_spill_head()
        # The retry queue (core.endpoint_store): bucket start -> its index, each bucket a FIFO
        # of sequence numbers in keyed state. Entries of a bucket from rq_own_from[bucket] on
        # were queued by this incarnation (their intent is unused); earlier ones are a restore's
        # and are CHECKed. Both heaps skip entries of buckets gone or changed.
        self.rq: dict[int, RetryBucket] = {}
        self.rq_own_from: dict[int, int] = {}
        self._rq_starts: list[int] = []
        self._rq_deadlines: list[tuple[int, int]] = []
        self.queued_retries = 0
        for bucket, index in store.retry_buckets():
            self.rq[bucket] = index
            self.rq_own_from[bucket] = index.tail
            self._rq_starts.append(bucket)
            self._rq_deadlines.append((index.earliest_deadline_ms, bucket))
            self.queued_retries += index.size
        heapq.heapify(self._rq_starts)
        heapq.heapify(self._rq_deadlines)
        # Retries in memory that could go to the retry queue, latest next attempt first
        # (-next attempt, arrival, delivery); stale entries are skipped when popped.
        self._latest: list[tuple[int, int, str]] = []
        # In memory, and a copy of it may wait in the retry queue (restored with one there, or
        # paged in CHECKed): queued again, it goes without its intent, to be CHECKed when it comes
        # back -- a queued copy sent with its intent while another was sent meanwhile would be an
        # automatic request past the delivery's durable state. Dropped when it leaves memory.
        self._may_have_twin: set[str] = set()

    @property
    def spilled(self) -> int:
        """Deliveries in the overflow queue (keyed state only)."""
        return self.spill_tail - self.spill_head

    # -- what memory tells the backlog --------------------------------------------------------------

    def restored(self, delivery_id: str) -> None:
        """An entry a restore read back into memory: a copy of it may wait in the retry queue."""
        if self.queued_retries:
            self._may_have_twin.add(delivery_id)

    def supersede(self, delivery_id: str) -> None:
        """Loaded into memory from history (a replay, a re-creation): a copy queued in either
        queue, if any, is CHECKed when it comes back."""
        if self.spilled or self.queued_retries:
            self.superseded.add(delivery_id)

    def forget(self, delivery_id: str) -> None:
        """It left memory for good."""
        self._may_have_twin.discard(delivery_id)

    def offer(self, p: Pending, seq: int) -> None:
        """``p`` (arrival ``seq``) now waits for its next automatic attempt: index it as a retry
        that may go to the retry queue."""
        items = self.memory.items
        if len(self._latest) > 2 * len(items) + 64:  # mostly stale entries: rebuild it
            self._latest = [(-q.next_attempt_at_ms, 0, q.delivery_id) for q in items.values() if self.may_queue(q)]
            heapq.heapify(self._latest)
        elif self.may_queue(p):
            heapq.heappush(self._latest, (-p.next_attempt_at_ms, seq, p.delivery_id))

    # -- the overflow queue ------------------------------------------------------------------------

    def overflowing(self, p: Pending) -> bool:
        """A fresh delivery now waiting goes behind the queue once there is one (arrival order),
        or starts it when memory holds a window's worth."""
        return (p.stage is Stage.READY and not p.manual and p.auto_retry_active and p.attempt_count == 0
                and (self.spilled > 0 or self.memory.fresh_count > self.policy.memory_window
                     or len(self.memory.items) > 2 * self.policy.memory_window)
                # a copy of a delivery that may be queued already stays in memory: two queued
                # copies could both come back as sendable
                and p.delivery_id not in self.superseded)

    def spill(self, p: Pending) -> None:
        """``p``, out of memory already, goes to the back of the overflow queue."""
        self.store.spill(self.spill_tail, p)
        if not self.spilled:
            self.head_expires = p.delivery.expires_at_ms
        self.spill_tail += 1
        self.store.put_spill_range(self.spill_head, self.spill_tail)
        self.counts["spilled"] += 1

    def page_in(self, now_ms: int, dec: Decision) -> None:
        """Bring a page back when memory has room for it, or the queue's head is past its
        deadline (then as many as one step expires, within twice the window)."""
        if not self.spilled:
            return
        window, n = self.policy.memory_window, 0
        items = self.memory.items
        page = min(self.policy.page_size, max(1, window // 2), self.spilled)
        expired = self.head_expires is not None and self.head_expires <= now_ms
        if window - self.memory.fresh_count >= page:
            # Fresh work waits: retries in memory not due within a bucket make room for it.
            self._make_room(page, now_ms + self.policy.retry_bucket_ms, now_ms)
        if min(window - self.memory.fresh_count, 2 * window - len(items)) >= page:
            n = page
        elif expired and len(items) < 2 * window:
            n = min(self.policy.max_expiries_per_step, self.spilled)
        if n:
            head = self.spill_head
            for seq, p, intent in self.store.unspill(self.endpoint_id, range(head, head + n)):
                self.counts["paged_in"] += 1
                self._take_back(p, intent, ours=seq >= self.own_from)
            self.spill_head = head + n
            self.store.put_spill_range(self.spill_head, self.spill_tail)
            self.head_expires = self._peek_spill_head()
            if not self.spilled and not self.queued_retries:
                self.superseded.clear()
        at = self.head_expires
        if at is None:
            return
        if at > now_ms:
            dec.wake_at(at, "deadline")  # the queue's head has its earliest deadline (arrival order)
        elif n:
            dec.wake_at(now_ms, "more deliveries past their deadline")
        else:
            # Past its deadline with memory full of expiries being written: their writes drive
            # the endpoint; look again within a second in any case.
            dec.wake_at(now_ms + self.policy.slot_wait_max_ms, "overflow queue waits for memory")

    def _peek_spill_head(self) -> int | None:
        if not self.spilled:
            return None
        got = self.store.peek_spilled(self.endpoint_id, self.spill_head)
        return got.delivery.expires_at_ms if got is not None else None

    # -- the retry queue ---------------------------------------------------------------------------

    def may_queue(self, p: Pending) -> bool:
        """A retry waiting for its next attempt, with the attempt row reserved, that nothing else
        holds in memory (a member of an ordering key stays: its key's order lives in memory)."""
        return (p.stage is Stage.READY and not p.busy and p.auto_retry_active and not p.manual
                and p.attempt_count > 0 and p.intent is not None and p.skip is None
                and not self.memory.in_key(p.delivery_id))

    def _queue_later_retries(self, n: int, later_than_ms: int | None, now_ms: int) -> None:
        """Move up to ``n`` retries out of memory, latest next attempt first, each due after
        ``later_than_ms`` (None: whenever, to make room for work past its deadline)."""
        while n > 0 and self._latest:
            neg_at, _, did = self._latest[0]
            p = self.memory.items.get(did)
            if (p is None or p.next_attempt_at_ms != -neg_at or not self.may_queue(p)
                    # past its deadline: it expires from memory (moved out, it would come back
                    # for the same reason and be moved out again, for ever)
                    or p.delivery.expires_at_ms <= now_ms):
                heapq.heappop(self._latest)
                continue
            if later_than_ms is not None and p.next_attempt_at_ms <= later_than_ms:
                return  # the rest are due sooner: memory already holds what is due soonest
            heapq.heappop(self._latest)
            self._queue_retry(p)
            n -= 1

    def _queue_retry(self, p: Pending) -> None:
        did = p.delivery_id
        # (may_queue: not fresh, not in a key, no storage work, no manual request, no skip)
        self.memory.release(did)
        if did in self.superseded or did in self._may_have_twin:
            self._may_have_twin.discard(did)
            p = replace(p, intent=None)  # another copy may be queued: CHECKed when it comes back
        bucket = p.next_attempt_at_ms - p.next_attempt_at_ms % self.policy.retry_bucket_ms
        index = self.rq.get(bucket)
        if index is None:
            index = self.rq[bucket] = RetryBucket()
            heapq.heappush(self._rq_starts, bucket)
        before = index.earliest_deadline_ms
        self.store.queue_retry(bucket, index.append(p.delivery.expires_at_ms), p)
        self.store.put_retry_bucket(bucket, index)
        if index.earliest_deadline_ms != before:
            heapq.heappush(self._rq_deadlines, (index.earliest_deadline_ms, bucket))
        self.queued_retries += 1
        self.counts["retries_queued"] += 1

    def page_in_retries(self, now_ms: int, dec: Decision) -> None:
        """Bring back the retries that are due (a bucket once it starts) while memory has room or
        can make it from retries due later; and the buckets past their earliest deadline in any
        case (their expiries are written and leave memory; the others take the room of retries
        moved out, due or not)."""
        if not self.queued_retries:
            return
        window, budget = self.policy.memory_window, self.policy.page_size
        page = max(1, window // 2)
        late_paged = False
        while budget > 0:
            late = self._rq_top_deadline()
            start = self._rq_top_start()
            if late is not None and late[0] <= now_ms:
                bucket, later_than = late[1], None
            elif start is not None and start <= now_ms:
                bucket, later_than = start, now_ms + self.policy.retry_bucket_ms
            else:
                break
            n = self._make_room(min(budget, page, self.rq[bucket].size), later_than, now_ms)
            if n <= 0:
                break  # memory holds work due as soon: finished work drives the endpoint
            self._unqueue(bucket, n)
            budget -= n
            late_paged = late_paged or later_than is None
        start, late = self._rq_top_start(), self._rq_top_deadline()
        if start is None or late is None:
            if not self.spilled:
                self.superseded.clear()
            return
        room = len(self.memory.items) < 2 * window
        if budget <= 0 and not room and start <= now_ms:
            # Out of budget, due retries still queued, memory full: the latest retry in memory, if
            # due after this bucket, goes out now, so memory holds what is due soonest between
            # passes too, and the next pass (at once) brings the next page into its room.
            room = self._make_room(1, now_ms + self.policy.retry_bucket_ms, now_ms) > 0
        if start > now_ms:
            dec.wake_at(start, "queued retry due")
        elif late[0] <= now_ms and late_paged:
            dec.wake_at(now_ms, "more deliveries past their deadline")
        elif budget <= 0 and room:
            dec.wake_at(now_ms, "more queued retries due")
        elif late[0] > now_ms:
            dec.wake_at(late[0], "deadline")  # due, waiting for memory: at the latest by its deadline
        else:
            # Past a deadline, memory full of what cannot be moved (in flight, being written):
            # finished work drives the endpoint; look again within a second in any case.
            dec.wake_at(now_ms + self.policy.slot_wait_max_ms, "retry queue waits for memory")

    def _take_back(self, p: Pending, intent: Intent | None, ours: bool) -> None:
        """One delivery paged back into memory from either queue. ``ours``: put there by this
        incarnation (its unused reserved attempt still holds) rather than by one before a restore."""
        did = p.delivery_id
        self.memory.note_version(p.delivery.endpoint_config_version)
        if did in self.memory.items:
            return  # a replay loaded it meanwhile: that copy owns its schedule
        if intent is not None and ours and did not in self.superseded:
            p = replace(p, stage=Stage.READY, intent=intent)  # queued by us, intent unused
        else:
            p = d.adopt(p)  # a restore's, or superseded: read its durable record first
            self._may_have_twin.add(did)
        self.memory.page_back(p)

    def _make_room(self, n: int, later_than_ms: int | None, now_ms: int) -> int:
        """Room for up to ``n`` in memory, made by moving retries due after ``later_than_ms`` to the
        retry queue as needed; returns the room there is."""
        room = 2 * self.policy.memory_window - len(self.memory.items)
        if room < n:
            self._queue_later_retries(n - room, later_than_ms, now_ms)
        return min(n, 2 * self.policy.memory_window - len(self.memory.items))

    def _unqueue(self, bucket: int, n: int) -> None:
        index = self.rq[bucket]
        own_from = self.rq_own_from.get(bucket, 0)
        before = index.earliest_deadline_ms
        for seq, p, intent in self.store.unqueue_retries(self.endpoint_id, bucket, index.take(n)):
            self.counts["retries_paged_in"] += 1
            self._take_back(p, intent, ours=seq >= own_from)
        self.queued_retries -= n
        self.store.put_retry_bucket(bucket, index)
        if not index.size:
            del self.rq[bucket]
            self.rq_own_from.pop(bucket, None)
        elif index.earliest_deadline_ms != before:
            heapq.heappush(self._rq_deadlines, (index.earliest_deadline_ms, bucket))

    def _rq_top_start(self) -> int | None:
        while self._rq_starts and self._rq_starts[0] not in self.rq:
            heapq.heappop(self._rq_starts)
        return self._rq_starts[0] if self._rq_starts else None

    def _rq_top_deadline(self) -> tuple[int, int] | None:
        """(earliest deadline, its bucket) over the retry queue."""
        while self._rq_deadlines:
            at, bucket = self._rq_deadlines[0]
            index = self.rq.get(bucket)
            if index is not None and index.earliest_deadline_ms == at:
                return at, bucket
            heapq.heappop(self._rq_deadlines)
        return None
