"""One endpoint's dispatch, as a pure driver: plain data in, decisions out.

The Flink operator (:mod:`operators.dispatcher`) owns one driver per endpoint key. It feeds the
driver what happened (a new delivery, a replay request, a config, finished I/O) and asks it to
:meth:`EndpointDriver.step`; the step returns a :class:`Decision` -- the I/O to start (check,
persist, reserve, send, record, load) and when to be woken again *and why*. The driver never
does I/O, never reads a clock and never sleeps; ``now_ms`` and the random source come in, keyed
state goes through :class:`core.endpoint_store.EndpointStore` (whose docstring is the durability
policy), and tenant slots come from the operator-wide :class:`core.fairness.FairScheduler`.

Wake times are reasons, never polls: the earliest of the next retry, the breaker's probe time,
the token bucket's refill, a slot back-off (short for the keys next in line for a slot), the
earliest deadline, a manual request's wait, a write retry, or the end of a hold after an
internal error. An endpoint that is blocked (open breaker, disabled, waiting for its config) is
woken O(1) times per second at most. Work that only an input can unblock (a config, finished
I/O) is not polled for: the input drives the endpoint.

On an ordered endpoint (:mod:`core.ordering`) only a key's head is indexed as due; the rest of
the key waits unindexed (no timer, no poll) until the head's final record, which indexes the next.

Slots are conserved: the driver asks for slots only when breaker, bucket and its own in-flight
cap would let a request go, gives back every grant it cannot use in the same step, and cancels
its ticket whenever it stops wanting one. ``in_flight`` is exactly the slots it holds.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from core import breaker as brk
from core import dispatch as d
from core import ordering, ratelimit, telemetry
from core.dispatch import Intent, Pending, Stage, replace
from core.endpoint_store import EndpointStore, RetryBucket
from core.fairness import FairScheduler
from core.fanout import NewDelivery
from core.ordering import KeyQueues
from core.outcomes import ErrorClass, HttpResult
from core.records import SKIP, EndpointConfig, EndpointSignal, EndpointStatus, ReplayRequest
from core.retry import RetrySchedule

# -- what the driver asks for ----------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """Read the delivery's durable record (status, counts, highest attempt number)."""
    p: Pending


@dataclass(frozen=True)
class Persist:
    """Write the creation rows and the reserved attempt row ``p.intent``."""
    p: Pending


@dataclass(frozen=True)
class Reserve:
    """Write the reserved attempt row ``p.intent``."""
    p: Pending


@dataclass(frozen=True)
class Send:
    """Make the HTTP request for ``p.intent`` (manual when ``p.sending_manual``)."""
    p: Pending
    config: EndpointConfig


@dataclass(frozen=True)
class Record:
    """Write ``p.record``; ``p.intent`` (if any) is the next attempt row, reserved in the same write.
    ``key_row``: the head of an ordering key failed (its key is blocked) or is final (free again)."""
    p: Pending
    key_row: ordering.KeyRowChange | None = None


@dataclass(frozen=True)
class Load:
    """Load a delivery this endpoint does not hold, for a replay."""
    delivery_id: str


Action = Check | Persist | Reserve | Send | Record | Load
IoKind = Literal["check", "persist", "reserve", "send", "record", "load"]


@dataclass(frozen=True)
class Wake:
    at_ms: int
    reason: str


@dataclass
class Decision:
    actions: list[Action] = field(default_factory=list)
    signals: list[EndpointSignal] = field(default_factory=list)
    wake: Wake | None = None

    def wake_at(self, at_ms: int | None, reason: str) -> None:
        if at_ms is not None and (self.wake is None or at_ms < self.wake.at_ms):
            self.wake = Wake(at_ms, reason)


@dataclass(frozen=True)
class DriverPolicy:
    schedule: RetrySchedule
    breaker: brk.BreakerConfig
    default_max_in_flight: int
    # Deliveries created before this (Kafka time) may have been handled by an earlier
    # incarnation (the topic is re-read from the last checkpoint after a restore): they CHECK
    # their durable record before anything else. The operator sets it to its start time plus a
    # margin for clock skew between the brokers and the TaskManagers.
    check_created_before_ms: int = 0
    # Deliveries older than this are re-creations (topic re-read, re-snapshot): CHECK them too.
    fresh_window_ms: int = 10 * 60_000
    # Fan-out's dedupe window: an event whose own time is older than this may have been fanned
    # out before fan-out forgot it, and a record published again (a relay re-snapshot) carries a
    # fresh Kafka time -- so its delivery CHECKs too; final in history means it is not re-sent.
    dedupe_window_ms: int = 7 * 24 * 3_600_000
    # How long a manual replay may wait for its endpoint before it ends visibly as not sent.
    manual_wait_ms: int = 60_000
    # Expiries written per step; the rest follow at once in the next step.
    max_expiries_per_step: int = 500
    # After an internal error (a signing key that does not decrypt, a bug) the endpoint is held
    # for a doubling period; everything else keeps flowing.
    hold_base_ms: int = 1_000
    hold_max_ms: int = 300_000
    # Slot back-off while the pool or the tenant quota is full: doubling from here to ~1 s,
    # jittered, so a thousand endpoints that started waiting together do not wake together.
    slot_wait_base_ms: int = 10
    slot_wait_max_ms: int = 1_000
    # Storage work that did not fit the operator's write budget is retried this much later,
    # doubling while it keeps waiting (up to slot_wait_max_ms).
    write_budget_wait_ms: int = 10
    # A replay's load that failed is retried after 1 s, doubling up to this.
    load_retry_max_ms: int = 300_000
    # Fresh deliveries (never attempted) one endpoint keeps in memory; fresh waiting ones beyond it
    # go to the overflow queue in keyed state (core.endpoint_store) and come back a page at a
    # time, so a backlog of millions behind a failing endpoint costs memory for the window only.
    # Memory as a whole holds twice the window, and it holds the work due soonest: when it is full
    # and fresh work or a queued retry that is due waits for it, the retries in memory whose next
    # attempt is latest go to the retry queue in keyed state (ordered by due time) and come back
    # when they are due. So retries the receiver keeps refusing, however many, never keep a fresh
    # delivery out of memory while the receiver accepts others; they cost keyed state, not memory.
    memory_window: int = 20_000
    page_size: int = 1_000
    # The retry queue's buckets: retries due within the same bucket_ms share one (a FIFO), so the
    # queue's index in memory is one entry per bucket that holds retries -- bounded by the longest
    # back-off, not by how many retries wait. A bucket comes back when it starts; each retry in it
    # is still sent at its own time.
    retry_bucket_ms: int = 1_000
    # A delivery whose history write or read has kept failing this long, and is this far past its
    # deadline, is let go from memory (counted ``expired_unrecorded``): its row stays pending, past
    # due, and reconciliation names it orphaned and redrives it -- checked first, so it expires
    # there once Cassandra takes the write. Without a bound it was retried for ever, held for good.
    storage_give_up_ms: int = 3_600_000
    # A delivery whose own write was refused for its values (core.dispatch.WriteRejected) this
    # many times, each after some other write succeeded, ends failed with a record that carries
    # none of those values (dispatch.end_rejected): a few seconds of back-off, well within its deadline.
    rejected_write_tries: int = 3


@dataclass
class StorageHealth:
    """When a history write last succeeded, over every endpoint that shares it (the operator gives
    all its drivers one): what tells one delivery's poison write from a fault of every write."""
    last_ok_ms: int | None = None


def light(delivery: NewDelivery) -> NewDelivery:
    """The delivery without its payload bytes (kept once, by the adapter, in its own entry)."""
    return replace(delivery, event=replace(delivery.event, payload=b""))


class EndpointDriver:
    def __init__(self, endpoint_id: str, policy: DriverPolicy, rng: random.Random, store: EndpointStore,
                 scheduler: FairScheduler, counts: Counter[str] | None = None,
                 storage: StorageHealth | None = None) -> None:
        self.endpoint_id = endpoint_id
        self.storage = storage if storage is not None else StorageHealth()
        self.policy = policy
        self.rng = rng
        self.store = store
        self.scheduler = scheduler
        self.counts: Counter[str] = counts if counts is not None else Counter()
        self.items: dict[str, Pending] = {}
        self.in_flight = 0  # requests in flight == tenant slots this endpoint holds
        self.config: EndpointConfig | None = store.config()
        self.breaker: brk.BreakerState = store.breaker() or brk.BreakerState()
        self.bucket: ratelimit.TokenBucket | None = store.bucket()
        self.gone_at: int | None = store.gone_at()
        self.needs_version = 0  # the newest config version a delivery was fanned out with
        self.held_until_ms = 0
        self.held_reason = ""
        self._hold_failures = 0
        self._slot_waits = 0
        self._budget_waits = 0
        self._tenant = self.config.tenant_id if self.config else ""
        # Indexes over items; stale heap entries are skipped when popped.
        # Waiting automatic work by (next attempt time, READY before ADOPTED, arrival), and by
        # deadline; entries that no longer match items[] are stale and skipped when popped.
        self._due: list[tuple[int, int, int, str]] = []
        self._deadlines: list[tuple[int, int, int, str]] = []
        self._readying: set[str] = set()  # restored deliveries being checked to be sent
        self._manual: set[str] = set()  # READY with a manual request waiting
        # (oldest waiting request's time, delivery) over _manual; stale entries skipped when popped
        self._manual_heap: list[tuple[int, str]] = []
        # delivery -> (its oldest request's time, when that request reached the front of the queue)
        self._front_since: dict[str, tuple[int, int]] = {}
        self._work: set[str] = set()  # storage stages whose I/O has not started
        self._fresh: set[str] = set()  # never attempted: what the memory window counts
        # (created at, delivery) of items as they became fresh / attempted, for the gauges' oldest
        # ages (summary); entries no longer matching items[] are stale, skipped when they come up.
        self._fresh_by_age: list[tuple[int, str]] = []
        self._tried_by_age: list[tuple[int, str]] = []
        self._seq = 0
        self._loads: dict[str, tuple[d.ManualRequest, ...]] = dict(store.replays())
        self._loading: set[str] = set()
        self._load_retry_at: dict[str, int] = {}
        self._load_failures: dict[str, int] = {}
        self._signals: list[EndpointSignal] = []
        # Ordering keys (core.ordering): which held delivery of each key may be sent automatically,
        # and the heads an operator asked to skip.
        self._order = KeyQueues()
        self._skips: set[str] = set()
        # The overflow queue: sequence numbers [head, tail) in keyed state. Entries from
        # _own_from on were spilled by this incarnation (their intent is unused); earlier ones
        # are a restore's and are CHECKed. _superseded: queued deliveries (either queue) a replay
        # or a re-creation loaded into memory meanwhile -- their queued copy is CHECKed too when it
        # comes back, and the memory copy is queued without its intent (CHECKed too).
        self._spill_head, self._spill_tail = store.spill_range()
        self._own_from = self._spill_tail
        self._superseded: set[str] = set()
        self._spill_head_expires = self._peek_spill_head()
        # The retry queue (core.endpoint_store): bucket start -> its index, each bucket a FIFO
        # of sequence numbers in keyed state. Entries of a bucket from _rq_own_from[bucket] on
        # were queued by this incarnation (their intent is unused); earlier ones are a restore's
        # and are CHECKed. Both heaps skip entries of buckets gone or changed.
        self._rq: dict[int, RetryBucket] = {}
        self._rq_own_from: dict[int, int] = {}
        self._rq_starts: list[int] = []
        self._rq_deadlines: list[tuple[int, int]] = []
        self.queued_retries = 0
        for bucket, index in store.retry_buckets():
            self._rq[bucket] = index
            self._rq_own_from[bucket] = index.tail
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
        for p in store.entries(endpoint_id):
            # Work an earlier incarnation held: its durable record decides what happens next.
            self.counts["adopted_after_restore"] += 1
            if self.queued_retries:
                self._may_have_twin.add(p.delivery_id)
            self.needs_version = max(self.needs_version, p.delivery.endpoint_config_version)
            self._join_key(p, started=p.attempt_count > 0)
            self._put(d.adopt(p))

    # -- inputs --------------------------------------------------------------------------------

    def add_new(self, delivery: NewDelivery, now_ms: int, recheck: bool = False) -> bool:
        """A delivery from fan-out (payload already stored by the adapter). False: known.
        ``recheck``: a re-creation (reconciliation's redrive) whatever its age: CHECK it first."""
        did = delivery.delivery_id
        if did in self.items:
            return False
        if recheck:
            delivery = self._keyed_now(delivery)  # a redrive, rebuilt from history
        self._tenant = self._tenant or delivery.tenant_id
        self.needs_version = max(self.needs_version, delivery.endpoint_config_version)
        # The first attempt is due by this TaskManager's clock, which schedules everything the
        # driver does: a delivery is due when it arrives, or at its Kafka time if that is earlier.
        # A broker clock ahead of ours must not delay it by the skew; the deadline
        # stays counted from the Kafka time (a skew moves it by that much, either way).
        p = Pending(delivery=light(delivery), stage=Stage.PERSIST,
                    next_attempt_at_ms=min(delivery.created_at_ms, now_ms))
        if (recheck or delivery.created_at_ms < self.policy.check_created_before_ms
                or now_ms - delivery.created_at_ms > self.policy.fresh_window_ms
                or now_ms - delivery.event.occurred_at_ms > self.policy.dedupe_window_ms):
            p = replace(p, stage=Stage.CHECK)
            if self.spilled or self.queued_retries:
                self._superseded.add(did)  # a re-creation: its queued copy, if any, CHECKs too
        else:
            p = d.reserve(p, self.rng, now_ms)
        self.store.put(p)
        self._join_key(p)
        self._put(p)
        return True

    def add_replay(self, r: ReplayRequest, now_ms: int) -> str:
        """A person's replay request; returns what became of it (queued/loading/duplicate/refused)."""
        self.counts["replays"] += 1
        if r.endpoint_id != self.endpoint_id:
            self.counts["replays_refused"] += 1
            return "refused"
        if r.request_id:
            if self.store.seen_request(r.request_id):
                self.counts["replays_duplicate"] += 1
                return "duplicate"
            self.store.mark_request(r.request_id, now_ms)
        req = d.ManualRequest(r.request_id, r.requested_by, now_ms, r.tenant_id)
        if r.action == SKIP:
            return self._add_skip(r.delivery_id, req)
        p = self.items.get(r.delivery_id)
        if p is not None:
            if p.delivery.tenant_id != r.tenant_id:
                self.counts["replays_refused"] += 1
                return "refused"
            # Keyed state gets the request and nothing else: the in-memory delivery may hold
            # decisions not durable yet (an expiry or outcome being written).
            self.store.add_manual(r.delivery_id, (req,))
            self._put(_with_manual(p, (req,)))
            return "queued"
        # The tenant is checked once the delivery is loaded (it is not known before).
        self._loads[r.delivery_id] = (*self._loads.get(r.delivery_id, ()), req)
        self.store.put_replay(r.delivery_id, self._loads[r.delivery_id])
        return "loading"

    def _add_skip(self, did: str, req: d.ManualRequest) -> str:
        """An operator skips an ordering key's head: it ends failed once it is idle."""
        p = self.items.get(did)
        if p is None:
            self.counts["skips_not_held"] += 1  # final already, or never this endpoint's
            return "not held"
        if p.delivery.tenant_id != req.tenant_id:
            self.counts["replays_refused"] += 1
            return "refused"
        if not self._order.key_of(did) or not self._order.is_head(did):
            self.counts["skips_not_head"] += 1
            return "not a head"
        self.store.add_skip(did, req)  # durable with the rest of the entry: a restore applies it
        self._put(replace(p, skip=req))
        self.counts["skips"] += 1
        return "skipping"

    def set_config(self, cfg: EndpointConfig) -> bool:
        """A config for this endpoint; an older version than the one held is ignored."""
        if self.config is not None and cfg.config_version < self.config.config_version:
            return False
        was_ordered = self._ordered
        self.config = cfg
        if was_ordered and not self._ordered:
            self._requeue(*self.items)  # held behind heads: free to go now
        self._tenant = cfg.tenant_id
        self.store.put_config(cfg)
        # A new config may be the fix (a rotated key, a corrected URL): stop holding at once.
        self.held_until_ms = 0
        self._slot_waits = 0
        return True

    def refuse_config(self, reason: str) -> None:
        """A record for this endpoint could not be read: keep its last readable config but send
        nothing until a readable one replaces it (it may have changed the URL or the keys)."""
        if self.config is not None and self.config.refused != reason:
            self.config = replace(self.config, refused=reason)
            self.store.put_config(self.config)

    def io_done(self, kind: IoKind, key: str, result: object, exc: BaseException | None, now_ms: int) -> None:
        """Finished I/O for delivery ``key``: a DurableRecord (check), None (persist, reserve,
        record), a SendReport (send), or (NewDelivery, DurableRecord) | None (load)."""
        if kind == "load":
            self._finish_load(key, result, exc, now_ms)
            return
        p = self.items.get(key)
        if p is None:
            return
        if kind == "send":
            self.in_flight -= 1
            self.scheduler.release(self._tenant)
            if isinstance(exc, d.NotSent):
                self._failed_before_leaving(p, str(exc), now_ms)
                return
            if exc is not None:
                report = d.SendReport(
                    result=HttpResult(status=None, error=ErrorClass.INTERNAL, detail=type(exc).__name__),
                    started_at_ms=now_ms, finished_at_ms=now_ms, url="",
                    endpoint_config_version=p.delivery.endpoint_config_version)
            else:
                assert isinstance(result, d.SendReport)
                report = result
            self._apply_report(p, report, now_ms)
            return
        if exc is not None:
            self.counts["history_write_failures"] += 1
            self._put(d.after_write_failed(p, now_ms, isinstance(exc, d.WriteRejected), self.storage.last_ok_ms))
            return
        if kind != "check":
            # Writes only: reads may well work while a write fails for everyone (a bad migration).
            self.storage.last_ok_ms = now_ms
        if kind == "check":
            assert isinstance(result, d.DurableRecord)
            if result.status is None:
                # Never persisted, so never queued (a queued copy was persisted first): after a long
                # consumer lag every delivery arrives "old" and is checked, and must still be able
                # to wait in the queue rather than in memory.
                self._superseded.discard(key)
            nxt = d.after_check(p, result, self.rng, now_ms)
            if nxt is None:
                self.counts["final_not_resent"] += 1
                self._forget(key)
            else:
                self._put(nxt)
        elif kind in ("persist", "reserve"):
            nxt = d.after_reserved(p)
            # Only a delivery this incarnation has just persisted is queued: one that went through
            # CHECK (restored, re-created, loaded) may have a copy queued already, and two queued
            # copies could both come back sendable.
            if kind == "persist" and self._overflowing(nxt):
                self._spill(nxt)
            else:
                self._put(nxt)
        elif kind == "record":
            assert p.record is not None
            if p.record.delivery_status in d.FINAL_STATUSES:
                self._leave_key(key)  # its automatic life is over: the key's next may go
            nxt = d.after_record_written(p)
            if nxt is None:
                self._forget(key)
            else:
                self.store.put(nxt)  # the next attempt time and counts survive a restore
                self._put(nxt)

    def send_not_started(self, delivery_id: str, reason: str, now_ms: int, hold: bool = True) -> None:
        """The adapter could not build the request (e.g. no signing key decrypts): nothing was
        sent, so it is no attempt. The delivery goes back unchanged and the endpoint is held,
        visibly -- unless the caller holds it once itself for the error that stopped a whole pass
        (``hold=False``), which would otherwise double the hold once per request handed back."""
        p = self.items[delivery_id]
        self.in_flight -= 1
        self.scheduler.release(self._tenant)
        self.counts["attempts"] -= 1
        self._put(d.send_not_started(p))
        if hold:
            self.hold(now_ms, reason)

    def hold(self, now_ms: int, reason: str) -> None:
        """Stop sending to this endpoint for a doubling period (an internal error)."""
        self._hold_failures += 1
        period = min(self.policy.hold_max_ms, self.policy.hold_base_ms * 2 ** min(self._hold_failures - 1, 20))
        self.held_until_ms = now_ms + period
        self.held_reason = reason
        self.counts["endpoint_holds"] += 1

    # -- the step ------------------------------------------------------------------------------

    def step(self, now_ms: int, write_budget: int) -> Decision:
        """Everything this endpoint can do now, and when to look again."""
        dec = Decision(signals=self._signals)
        self._signals = []
        self._page_in(now_ms, dec)
        self._page_in_retries(now_ms, dec)
        blocked = self._blocked(now_ms)
        if blocked == "deleted":
            self._end_all(now_ms)
        self._apply_skips(now_ms)
        self._expire(now_ms, dec)
        self._close_stale_manual(now_ms, blocked, dec)
        self._storage(now_ms, write_budget, dec)
        self._send(now_ms, blocked, dec)
        if self.held_until_ms > now_ms:
            dec.wake_at(self.held_until_ms, "hold after internal error ends")
        top = self._top(self._deadlines)
        if top is not None:
            dec.wake_at(top.delivery.expires_at_ms, "deadline")
        return dec

    @property
    def tenant_id(self) -> str:
        return self._tenant

    @property
    def held(self) -> int:
        """Deliveries this driver holds: in memory, in the overflow queue and in the retry queue."""
        return len(self.items) + self.spilled + self.queued_retries

    @property
    def idle(self) -> bool:
        """Nothing pending, loading or in flight: the operator may drop this driver."""
        return (not self.items and not self._loads and self.in_flight == 0 and not self.spilled
                and not self.queued_retries)

    @property
    def spilled(self) -> int:
        """Deliveries in the overflow queue (keyed state only)."""
        return self._spill_tail - self._spill_head

    def view(self, now_ms: int, retry_window_ms: int) -> telemetry.EndpointView:
        """This endpoint as the gauges see it (core.telemetry). Parked: nothing may be sent now
        (disabled, gone, held, or the breaker open and not yet probing)."""
        parked = self._parked(now_ms)
        head = self._spill_head_expires
        return telemetry.EndpointView(
            pending=tuple(telemetry.PendingView(p.delivery.created_at_ms, p.attempt_count > 0)
                          for p in self.items.values()),
            spilled=self.spilled, spilled_oldest_ms=head - retry_window_ms if head is not None else None,
            breaker=self.breaker.state, parked=parked, consecutive_failures=self.breaker.consecutive_failures)

    def summary(self, now_ms: int, retry_window_ms: int) -> telemetry.EndpointSummary:
        """``telemetry.summarize(self.view(...))`` without visiting each delivery: counts from the
        fresh set, oldest ages from the age indexes (amortised O(log n) a delivery, kept by _put).
        The gauges refresh every endpoint a pass touched each second, and a view of one draining
        a large backlog built a record per held delivery each time."""
        head = self._spill_head_expires
        spilled = self.spilled
        oldest_new = self._oldest_by_age(self._fresh_by_age, fresh=True)
        if spilled and head is not None:
            queued = head - retry_window_ms
            oldest_new = queued if oldest_new is None else min(oldest_new, queued)
        fresh = len(self._fresh)
        return telemetry.EndpointSummary(
            new=spilled + fresh, retry=len(self.items) - fresh, oldest_new_ms=oldest_new,
            oldest_retry_ms=self._oldest_by_age(self._tried_by_age, fresh=False), breaker=self.breaker.state,
            parked=self._parked(now_ms), consecutive_failures=self.breaker.consecutive_failures,
            held=len(self.items) + spilled)

    def _parked(self, now_ms: int) -> bool:
        """Nothing may be sent now (disabled, gone, held, or the breaker open and not yet probing)."""
        return self._blocked_reason(now_ms) is not None or (
            self.breaker.state is brk.CircuitState.OPEN and (self.breaker.open_until_ms or 0) > now_ms)

    def _blocked_reason(self, now_ms: int) -> str | None:
        """Why nothing may be sent to this endpoint now (None: it may). No side effect."""
        cfg = self.config
        if cfg is None:
            return "no config"
        if cfg.status is EndpointStatus.DELETED:
            return "deleted"
        if cfg.status not in (EndpointStatus.ACTIVE, EndpointStatus.PENDING_VERIFICATION):
            # (a pending endpoint only ever holds its challenge: fan-out sends it nothing else)
            return "disabled"
        if cfg.refused is not None:
            return "config unreadable"
        if self.gone_at is not None and cfg.config_version <= self.gone_at:
            return "gone (410)"
        if cfg.config_version < self.needs_version:
            return "config older than its deliveries"
        if self.held_until_ms > now_ms:
            return f"held: {self.held_reason}"
        return None

    def _blocked(self, now_ms: int) -> str | None:
        cfg = self.config
        if (cfg is not None and cfg.status is EndpointStatus.ACTIVE and cfg.refused is None
                and self.gone_at is not None and cfg.config_version > self.gone_at):
            self.gone_at = None  # a person re-enabled or changed the endpoint after the 410
            self.store.put_gone_at(None)
        return self._blocked_reason(now_ms)

    def _end_all(self, now_ms: int) -> None:
        for p in list(self.items.values()):
            # Waiting manual requests are closed first (_close_stale_manual), each with its row.
            if p.stage is Stage.ADOPTED and not p.busy:
                self._put(replace(p, stage=Stage.CHECK))  # read its durable record first
            elif p.stage is Stage.READY and not p.busy and not p.manual:
                self._put(d.end_without_sending(p, now_ms, "failed", "failed", "endpoint deleted"))

    def _expire(self, now_ms: int, dec: Decision) -> None:
        for _ in range(self.policy.max_expiries_per_step):
            p = self._top(self._deadlines)
            if p is None or p.delivery.expires_at_ms > now_ms:
                return
            heapq.heappop(self._deadlines)
            if p.stage is Stage.ADOPTED:
                # Restored: read its durable record first (it may be final, or have more attempts
                # than keyed state knows); it expires after that if still due to.
                self._put(replace(p, stage=Stage.CHECK))
                continue
            self._put(d.end_without_sending(p, now_ms, "expired", "expired", "retry deadline passed while waiting"))
        nxt = self._top(self._deadlines)
        if nxt is not None and nxt.delivery.expires_at_ms <= now_ms:
            dec.wake_at(now_ms, "more deliveries past their deadline")

    def _close_stale_manual(self, now_ms: int, blocked: str | None, dec: Decision) -> None:
        """A manual request waits at most manual_wait_ms, then ends with an attempt row that says
        why it was not sent. While blocked, wake when the oldest wait ends."""
        # Oldest first from the heap: a pass looks at the requests whose wait ended and one more,
        # not at every waiting request (tens of thousands after a bulk replay).
        while self._manual:
            if blocked == "deleted":
                did = next(iter(self._manual))
            else:
                top = self._oldest_manual(1)
                start = top[0].manual[0].requested_at_ms
                if blocked is None and brk.allow(self.breaker, now_ms)[0]:
                    # The endpoint may send: the wait counts from when the request reached the
                    # front of the manual queue, not from its arrival -- a bulk replay larger
                    # than a minute of the endpoint's capacity is served, not timed out while
                    # it queues behind itself. Blocked or behind an open breaker, the
                    # endpoint's state is why it waits, and the wait counts from arrival.
                    front = self._front_since.get(top[0].delivery_id)
                    if front is None or front[0] != start:
                        return  # not at the front yet: the requests ahead of it go first
                    start = front[1]
                waited_until = start + self.policy.manual_wait_ms
                if now_ms < waited_until:
                    if blocked is not None:
                        dec.wake_at(waited_until, "manual request wait")
                    return
                did = top[0].delivery_id
            why = blocked or ("circuit breaker open" if not brk.allow(self.breaker, now_ms)[0]
                              else "no capacity for it within the wait")
            self.counts["manual_not_sent"] += 1
            self._put(d.manual_not_sent(self.items[did], now_ms, f"manual attempt not sent: {why}"))

    def _storage(self, now_ms: int, budget: int, dec: Decision) -> None:
        for did in list(self._work):
            p = self.items[did]
            if p.write_failures and now_ms >= (max(p.delivery.expires_at_ms, p.failing_since_ms)
                                               + self.policy.storage_give_up_ms):
                # Failing for the whole bound, and past its deadline (a replay of an old delivery
                # is always past it: the bound counts from the first failure). Manual requests it
                # carried end with it, counted: no row can be written for them either.
                self.counts["expired_unrecorded"] += 1
                self.counts["manual_unrecorded"] += len(p.manual) + (p.sending_manual is not None)
                self._forget(did)
                continue
            if p.rejections >= self.policy.rejected_write_tries:
                # Poison, not an outage: this one write keeps being refused for its own values
                # while other writes go through (dispatch.after_write_failed counts only such
                # failures). Retried, it would fail until the give-up bound, past its deadline. A
                # timeout or an unavailable Cassandra is never a rejection: then nothing ends
                # here, and nothing is sent before its record is durable.
                if p.record is not None and p.record.detail == d.WITHOUT_VALUES:
                    # Even the record without its values was refused: nothing of it can be written.
                    # Its row, if any, stays pending for reconciliation (as expired_unrecorded).
                    self.counts["rejected_unrecorded"] += 1
                    self.counts["manual_unrecorded"] += len(p.manual)
                    self._forget(did)
                    continue
                self.counts["writes_rejected"] += 1
                if p.record is None:  # it ends: the requests owed end with it
                    self.counts["manual_unrecorded"] += len(p.manual) + (p.sending_manual is not None)
                p = d.end_rejected(p, now_ms)
                self._put(p)  # ended, whether its record starts in this step or a later one
            elif p.write_retry_at_ms > now_ms:
                dec.wake_at(p.write_retry_at_ms, "storage retry")
                continue
            if budget <= 0:
                # The operator's writes in flight are at their cap (a slow Cassandra): back off
                # like a slot wait rather than poll; finished writes of this endpoint drive it too.
                self._budget_waits += 1
                wait = self.policy.write_budget_wait_ms * 2 ** min(self._budget_waits - 1, 7)
                dec.wake_at(now_ms + min(self.policy.slot_wait_max_ms, wait), "write budget")
                break
            budget -= 1
            self._budget_waits = 0
            if p.stage is Stage.CHECK:
                p = replace(p, busy=True)
                dec.actions.append(Check(p))
            elif p.stage is Stage.PERSIST:
                p = replace(d.reserve(p, self.rng, now_ms), busy=True)
                dec.actions.append(Persist(p))
            elif p.stage is Stage.RESERVE:
                p = replace(d.reserve(p, self.rng, now_ms), busy=True)
                dec.actions.append(Reserve(p))
            else:
                p = replace(d.with_next_intent(p, self.rng, now_ms), busy=True)
                dec.actions.append(Record(p, self._key_row(p)))
            self._put(p)
        for did in list(self._loads):
            if did in self._loading:
                continue
            if self._load_retry_at.get(did, 0) > now_ms:
                dec.wake_at(self._load_retry_at[did], "replay load retry")
                continue
            self._loading.add(did)
            dec.actions.append(Load(did))

    def _send(self, now_ms: int, blocked: str | None, dec: Decision) -> None:
        oldest_manual = self._oldest_manual(1)
        manual_ok = len(self._manual)
        if manual_ok and blocked is None and not brk.allow(self.breaker, now_ms)[0]:
            # A replay checks the endpoint's state first: an open breaker holds manual
            # requests too -- a person's replay would otherwise hammer a receiver known to be
            # down. They wait for the probe, within their own wait (_close_stale_manual), and
            # one may be the probe itself once the breaker half-opens.
            manual_ok = 0
            dec.wake_at(_probe_at(self.breaker), "breaker probe")
            dec.wake_at(oldest_manual[0].manual[0].requested_at_ms + self.policy.manual_wait_ms,
                        "manual request wait")
        elif self.breaker.state is not brk.CircuitState.CLOSED:
            manual_ok = min(manual_ok, 1)  # half-open: one request is the probe
        auto_top = self._top(self._due)
        auto_due = auto_top is not None and auto_top.next_attempt_at_ms <= now_ms
        if auto_top is not None and not auto_due and blocked is None:
            dec.wake_at(auto_top.next_attempt_at_ms, "next retry due")
        if (not manual_ok and not auto_due) or blocked is not None:
            self.scheduler.cancel(self.endpoint_id)
            return
        assert self.config is not None
        cap = self.config.max_in_flight or self.policy.default_max_in_flight
        if manual_ok:
            for m in self._oldest_manual(cap):  # the front of the manual queue: its wait starts
                at = m.manual[0].requested_at_ms
                if self._front_since.get(m.delivery_id, (None,))[0] != at:
                    self._front_since[m.delivery_id] = (at, now_ms)
        free = cap - self.in_flight
        if free <= 0:
            # Its own cap is full: a finished request drives the endpoint again.
            self.scheduler.cancel(self.endpoint_id)
            return
        # What breaker and bucket would let go, before asking for any slot.
        auto_ok = 0
        if auto_due:
            allowed, _ = brk.allow(self.breaker, now_ms)
            if allowed:
                auto_ok = 1 if self.breaker.state is not brk.CircuitState.CLOSED else free
            else:
                dec.wake_at(_probe_at(self.breaker), "breaker probe")
        tokens = free
        if self.config.rate_limit_per_s:
            self.bucket = (ratelimit.new_bucket(self.config.rate_limit_per_s, now_ms) if self.bucket is None
                           else ratelimit.reconfigure(self.bucket, self.config.rate_limit_per_s)
                           if self.bucket.rate_per_s != self.config.rate_limit_per_s else self.bucket)
            tokens, wait_ms = ratelimit.available(self.bucket, now_ms)
            if tokens == 0:
                self.counts["throttled_rate_limit"] += 1
                dec.wake_at(now_ms + wait_ms, "rate limit refill")
        elif self.bucket is not None:  # the limit was removed: stop taking from the old bucket
            self.bucket = None
            self.store.put_bucket(None)
        want = min(free, tokens, manual_ok + auto_ok)
        if want <= 0:
            self.scheduler.cancel(self.endpoint_id)
            return
        kind: Literal["new", "retry"] = (
            "new" if manual_ok or (auto_top is not None and auto_top.attempt_count == 0) else "retry")
        since = (oldest_manual[0].manual[0].requested_at_ms if manual_ok
                 else auto_top.next_attempt_at_ms if auto_top else now_ms)
        slots = self._take_slots(want, kind, since, now_ms)
        if slots == 0:
            self.counts["throttled_slots"] += 1
            if self.scheduler.next_in_line(self.endpoint_id):
                # A grant may come to it while it sleeps, and nothing but its own timer can wake
                # it (core.fairness): ask again before such a grant would lapse, not after a
                # back-off of up to a second with the slot idle.
                dec.wake_at(now_ms + self.scheduler.grant_pickup_ms, "next in line for a tenant or pool slot")
            else:
                dec.wake_at(now_ms + self._slot_wait_ms(), "waiting for a tenant or pool slot")
            return
        self._slot_waits = 0
        sent = 0
        breaker, bucket = self.breaker, self.bucket
        queue = self._oldest_manual(min(slots, manual_ok))
        for m in queue:
            allowed, after = brk.allow(breaker, now_ms)
            if not allowed:
                break
            breaker = after
            if bucket is not None:
                _, bucket, _ = ratelimit.try_take(bucket, now_ms)
            self._start_send(m, dec)
            sent += 1
        checks = 0
        # Restored deliveries are read ahead of the sends while the breaker is closed (up to four
        # times the endpoint's cap in flight, not one read per slot granted): one read per slot
        # drained a restored backlog at slots / (read + reserve + request latency), ~270/s with
        # 64 in flight. A probing breaker reads only what it may send.
        closed = self.breaker.state is brk.CircuitState.CLOSED
        read_ahead = max(slots, min(self.policy.page_size, 4 * cap)) if closed else slots
        while auto_ok > 0:
            top = self._top(self._due)
            if top is None or top.next_attempt_at_ms > now_ms:
                break
            p = top
            if p.stage is Stage.ADOPTED:
                if len(self._readying) >= read_ahead or (not closed and sent + checks >= slots):
                    break  # enough being read ahead of the sends: no more reads yet
                # Restored and now due: read its durable record first (it may be final already).
                heapq.heappop(self._due)
                self._readying.add(p.delivery_id)
                self._put(replace(p, stage=Stage.CHECK))
                checks += 1
                continue
            if sent >= slots:
                break
            allowed, after = brk.allow(breaker, now_ms)
            if not allowed:
                break
            if bucket is not None:
                ok, bucket, _ = ratelimit.try_take(bucket, now_ms)
                if not ok:
                    break
            breaker = after
            heapq.heappop(self._due)
            self._start_send(p, dec)
            sent += 1
        if slots > sent:
            self.scheduler.release(self._tenant, slots - sent)
        if checks:
            dec.wake_at(now_ms, "restored deliveries due: read their records")
        if breaker != self.breaker:
            self.breaker = breaker
            self.store.put_breaker(breaker)
        if bucket is not self.bucket or (bucket is not None and sent):
            self.bucket = bucket
            self.store.put_bucket(bucket)
        t = self._top(self._due)
        more_auto = t is not None and t.next_attempt_at_ms <= now_ms
        if more_auto and t is not None and t.stage is Stage.ADOPTED and self._readying:
            more_auto = False  # restored work waits for the reads in progress: they drive it
        elif more_auto and not brk.allow(self.breaker, now_ms)[0]:
            more_auto = False  # what is left waits for the breaker, not for a slot
            dec.wake_at(_probe_at(self.breaker), "breaker probe")
        if (self._manual and manual_ok) or more_auto:
            # More is due than this step could send: ask again after a short, growing wait.
            dec.wake_at(now_ms + self._slot_wait_ms(), "more due than slots granted")
        else:
            if t is not None and t.next_attempt_at_ms > now_ms:  # the next retry is the reason to wake
                dec.wake_at(t.next_attempt_at_ms, "next retry due")
            self.scheduler.cancel(self.endpoint_id)

    def _take_slots(self, want: int, kind: Literal["new", "retry"], since_ms: int, now_ms: int) -> int:
        got = self.scheduler.acquire_uncontended(self._tenant, want, kind)
        if got:
            return got
        self.scheduler.request(self.endpoint_id, self._tenant, kind, since_ms)
        self.scheduler.grant(now_ms)
        got = self.scheduler.take_grant(self.endpoint_id)
        if got > want:  # granted on two tickets (new and retry) at once
            self.scheduler.release(self._tenant, got - want)
            got = want
        return got

    def _slot_wait_ms(self) -> int:
        self._slot_waits += 1
        wait = min(self.policy.slot_wait_max_ms, self.policy.slot_wait_base_ms * 2 ** min(self._slot_waits - 1, 10))
        return max(1, int(wait * (0.5 + 0.5 * self.rng.random())))

    def _start_send(self, p: Pending, dec: Decision) -> None:
        assert self.config is not None
        if not p.manual:
            self._order.mark_started(p.delivery_id)  # head of its key until it is final
        p = d.start_sending(p)
        self.in_flight += 1
        self._put(p)
        self.counts["attempts"] += 1
        dec.actions.append(Send(p, self.config))

    # -- results -------------------------------------------------------------------------------

    def _apply_report(self, p: Pending, report: d.SendReport, now_ms: int) -> None:
        before = self.breaker
        p, self.breaker = d.apply_result(p, report, before, self.policy.breaker, self.policy.schedule, self.rng)
        if self.breaker != before:
            self.store.put_breaker(self.breaker)
        if report.result.error is not ErrorClass.INTERNAL:
            self._hold_failures = 0
        r = p.record
        assert r is not None
        self.counts[{"succeeded": "succeeded", "retry": "retried", "failed": "failed",
                     "expired": "expired"}[r.outcome]] += 1
        # Labelled counts ("name:label"): the operator exports them as one counter per label.
        self.counts[f"attempts_by_class:{telemetry.status_class(report.result)}"] += 1
        if r.intent is not None and r.intent.number == 1 and not r.manual:
            first_ms = report.started_at_ms - p.delivery.created_at_ms
            for le in telemetry.bucket_labels(first_ms):
                self.counts[f"first_attempt_latency_ms:{le}"] += 1
        if r.disable_endpoint:
            # Stop sending at once; the control plane makes it a real, audited disable.
            self.gone_at = report.endpoint_config_version
            self.store.put_gone_at(self.gone_at)
            self.counts["endpoints_disabled"] += 1
            self._signals.append(EndpointSignal(
                endpoint_id=self.endpoint_id, tenant_id=p.delivery.tenant_id,
                config_version=report.endpoint_config_version, signal="gone",
                detail=f"receiver answered 410 Gone for delivery {p.delivery_id}", at_ms=now_ms))
        self._put(p)

    def _failed_before_leaving(self, p: Pending, detail: str, now_ms: int) -> None:
        """No request left (dispatch.failed_before_leaving): no attempt, and no news of the endpoint."""
        self.counts["attempts"] -= 1
        self.counts["failed_before_sending"] += 1
        before = self.breaker
        self.breaker = brk.on_inconclusive(before)  # a probe that never left frees the probe slot
        if self.breaker != before:
            self.store.put_breaker(self.breaker)
        self._put(d.failed_before_leaving(p, now_ms, detail, self.policy.schedule, self.rng))

    def _drop_load(self, did: str) -> None:
        self._loads.pop(did, None)
        self._load_retry_at.pop(did, None)
        self._load_failures.pop(did, None)
        self.store.remove_replay(did)

    def _finish_load(self, did: str, result: object, exc: BaseException | None, now_ms: int) -> None:
        self._loading.discard(did)
        requests = self._loads.get(did, ())
        if exc is not None:
            # A load that keeps failing backs off -- 1, 2, 4... s, then every load_retry_max_ms --
            # instead of trying every second for ever. The person's request is kept:
            # it can only end with its own attempt row (sent or not_sent), and that row is
            # written for the delivery this load could not read.
            failures = self._load_failures[did] = self._load_failures.get(did, 0) + 1
            self._load_retry_at[did] = now_ms + min(self.policy.load_retry_max_ms, 1_000 * 2 ** min(failures - 1, 20))
            return
        self._drop_load(did)
        if result is None:
            self.counts["replays_unknown"] += 1
            return
        assert isinstance(result, tuple)
        delivery, durable = result
        assert isinstance(delivery, NewDelivery) and isinstance(durable, d.DurableRecord)
        # A forged or misrouted request: never send one tenant's payload to another's URL. Only
        # that request is refused; valid ones loaded with it go ahead.
        valid = () if delivery.endpoint_id != self.endpoint_id else tuple(
            r for r in requests if r.tenant_id == delivery.tenant_id)
        self.counts["replays_refused"] += len(requests) - len(valid)
        if not valid:
            return
        requests = valid
        self.needs_version = max(self.needs_version, delivery.endpoint_config_version)
        p = self.items.get(did)
        if p is None and (self.spilled or self.queued_retries):
            self._superseded.add(did)  # it may be in a queue too: that copy CHECKs
        if p is not None:
            self.store.add_manual(did, requests)
            self._put(_with_manual(p, requests))
            return
        else:
            self._tenant = self._tenant or delivery.tenant_id
            delivery = self._keyed_now(delivery)
            auto = durable.auto_retry_active and not durable.final
            p = Pending(delivery=light(delivery), stage=Stage.RESERVE, attempt_count=durable.attempt_count,
                        issued=durable.max_attempt_number, auto_retry_active=auto,
                        next_attempt_at_ms=durable.next_attempt_at_ms or delivery.created_at_ms, manual=requests)
        self.store.put(p)
        if auto:
            self._join_key(p, started=p.attempt_count > 0)
        # else final (or automatic retries stopped): only the person's request is owed, which no
        # key holds back -- and it must not join its key as a started member, which would make it
        # the head in place of the delivery really retrying there.
        self._put(p)

    # -- the overflow queue ------------------------------------------------------------------------

    def _overflowing(self, p: Pending) -> bool:
        """A fresh delivery now waiting goes behind the queue once there is one (arrival order),
        or starts it when memory holds a window's worth."""
        return (p.stage is Stage.READY and not p.manual and p.auto_retry_active and p.attempt_count == 0
                and (self.spilled > 0 or len(self._fresh) > self.policy.memory_window
                     or len(self.items) > 2 * self.policy.memory_window)
                # a copy of a delivery that may be queued already stays in memory: two queued
                # copies could both come back as sendable
                and p.delivery_id not in self._superseded)

    def _spill(self, p: Pending) -> None:
        did = p.delivery_id
        # Out of memory, out of its key: it joins again when paged back in (arrival order, so
        # normally behind the versions held now; one that arrived late goes after them).
        self._leave_key(did)
        self.items.pop(did, None)
        self._fresh.discard(did)
        self._front_since.pop(did, None)
        self._work.discard(did)
        self._manual.discard(did)
        self._readying.discard(did)
        self.store.spill(self._spill_tail, p)
        if not self.spilled:
            self._spill_head_expires = p.delivery.expires_at_ms
        self._spill_tail += 1
        self.store.put_spill_range(self._spill_head, self._spill_tail)
        self.counts["spilled"] += 1

    def _page_in(self, now_ms: int, dec: Decision) -> None:
        """Bring a page back when memory has room for it, or the queue's head is past its
        deadline (then as many as one step expires, within twice the window)."""
        if not self.spilled:
            return
        window, n = self.policy.memory_window, 0
        page = min(self.policy.page_size, max(1, window // 2), self.spilled)
        expired = self._spill_head_expires is not None and self._spill_head_expires <= now_ms
        if window - len(self._fresh) >= page:
            # Fresh work waits: retries in memory not due within a bucket make room for it.
            self._make_room(page, now_ms + self.policy.retry_bucket_ms, now_ms)
        if min(window - len(self._fresh), 2 * window - len(self.items)) >= page:
            n = page
        elif expired and len(self.items) < 2 * window:
            n = min(self.policy.max_expiries_per_step, self.spilled)
        if n:
            head = self._spill_head
            for seq, p, intent in self.store.unspill(self.endpoint_id, range(head, head + n)):
                self.counts["paged_in"] += 1
                self._take_back(p, intent, ours=seq >= self._own_from)
            self._spill_head = head + n
            self.store.put_spill_range(self._spill_head, self._spill_tail)
            self._spill_head_expires = self._peek_spill_head()
            if not self.spilled and not self.queued_retries:
                self._superseded.clear()
        at = self._spill_head_expires
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
        got = self.store.peek_spilled(self.endpoint_id, self._spill_head)
        return got.delivery.expires_at_ms if got is not None else None

    # -- the retry queue ---------------------------------------------------------------------------

    def _may_queue(self, p: Pending) -> bool:
        """A retry waiting for its next attempt, with the attempt row reserved, that nothing else
        holds in memory (a member of an ordering key stays: its key's order lives in memory)."""
        return (p.stage is Stage.READY and not p.busy and p.auto_retry_active and not p.manual
                and p.attempt_count > 0 and p.intent is not None and p.skip is None
                and not self._order.key_of(p.delivery_id))

    def _queue_later_retries(self, n: int, later_than_ms: int | None, now_ms: int) -> None:
        """Move up to ``n`` retries out of memory, latest next attempt first, each due after
        ``later_than_ms`` (None: whenever, to make room for work past its deadline)."""
        while n > 0 and self._latest:
            neg_at, _, did = self._latest[0]
            p = self.items.get(did)
            if (p is None or p.next_attempt_at_ms != -neg_at or not self._may_queue(p)
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
        # (_may_queue: not fresh, not in a key, no storage work, no manual request, no skip)
        self.items.pop(did, None)
        self._front_since.pop(did, None)
        if did in self._superseded or did in self._may_have_twin:
            self._may_have_twin.discard(did)
            p = replace(p, intent=None)  # another copy may be queued: CHECKed when it comes back
        bucket = p.next_attempt_at_ms - p.next_attempt_at_ms % self.policy.retry_bucket_ms
        index = self._rq.get(bucket)
        if index is None:
            index = self._rq[bucket] = RetryBucket()
            heapq.heappush(self._rq_starts, bucket)
        before = index.earliest_deadline_ms
        self.store.queue_retry(bucket, index.append(p.delivery.expires_at_ms), p)
        self.store.put_retry_bucket(bucket, index)
        if index.earliest_deadline_ms != before:
            heapq.heappush(self._rq_deadlines, (index.earliest_deadline_ms, bucket))
        self.queued_retries += 1
        self.counts["retries_queued"] += 1

    def _page_in_retries(self, now_ms: int, dec: Decision) -> None:
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
            n = self._make_room(min(budget, page, self._rq[bucket].size), later_than, now_ms)
            if n <= 0:
                break  # memory holds work due as soon: finished work drives the endpoint
            self._unqueue(bucket, n)
            budget -= n
            late_paged = late_paged or later_than is None
        start, late = self._rq_top_start(), self._rq_top_deadline()
        if start is None or late is None:
            if not self.spilled:
                self._superseded.clear()
            return
        room = len(self.items) < 2 * window
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
        self.needs_version = max(self.needs_version, p.delivery.endpoint_config_version)
        if did in self.items:
            return  # a replay loaded it meanwhile: that copy owns its schedule
        if intent is not None and ours and did not in self._superseded:
            p = replace(p, stage=Stage.READY, intent=intent)  # queued by us, intent unused
        else:
            p = d.adopt(p)  # a restore's, or superseded: read its durable record first
            self._may_have_twin.add(did)
        self.store.put(p)
        self._join_key(p, started=p.attempt_count > 0)
        self._put(p)

    def _make_room(self, n: int, later_than_ms: int | None, now_ms: int) -> int:
        """Room for up to ``n`` in memory, made by moving retries due after ``later_than_ms`` to the
        retry queue as needed; returns the room there is."""
        room = 2 * self.policy.memory_window - len(self.items)
        if room < n:
            self._queue_later_retries(n - room, later_than_ms, now_ms)
        return min(n, 2 * self.policy.memory_window - len(self.items))

    def _unqueue(self, bucket: int, n: int) -> None:
        index = self._rq[bucket]
        own_from = self._rq_own_from.get(bucket, 0)
        before = index.earliest_deadline_ms
        for seq, p, intent in self.store.unqueue_retries(self.endpoint_id, bucket, index.take(n)):
            self.counts["retries_paged_in"] += 1
            self._take_back(p, intent, ours=seq >= own_from)
        self.queued_retries -= n
        self.store.put_retry_bucket(bucket, index)
        if not index.size:
            del self._rq[bucket]
            self._rq_own_from.pop(bucket, None)
        elif index.earliest_deadline_ms != before:
            heapq.heappush(self._rq_deadlines, (index.earliest_deadline_ms, bucket))

    def _rq_top_start(self) -> int | None:
        while self._rq_starts and self._rq_starts[0] not in self._rq:
            heapq.heappop(self._rq_starts)
        return self._rq_starts[0] if self._rq_starts else None

    def _rq_top_deadline(self) -> tuple[int, int] | None:
        """(earliest deadline, its bucket) over the retry queue."""
        while self._rq_deadlines:
            at, bucket = self._rq_deadlines[0]
            index = self._rq.get(bucket)
            if index is not None and index.earliest_deadline_ms == at:
                return at, bucket
            heapq.heappop(self._rq_deadlines)
        return None

    # -- ordering keys (core.ordering) ---------------------------------------------------------

    @property
    def _ordered(self) -> bool:
        return self.config is not None and bool(self.config.ordering_key)

    def _may_send_auto(self, did: str) -> bool:
        return not self._ordered or self._order.is_head(did)

    def _join_key(self, p: Pending, started: bool = False) -> None:
        e = p.delivery.event
        self._order.add(p.delivery_id, p.delivery.ordering_key, e.object_version, p.delivery.created_at_ms, started)

    def _leave_key(self, did: str) -> None:
        head = self._order.remove(did)
        if head is not None:
            self._requeue(head)

    def _requeue(self, *dids: str) -> None:
        """Index deliveries that may now be sent automatically (a new head; ordering turned off)."""
        for did in dids:
            p = self.items.get(did)
            if p is not None and _waits_auto(p) and self._may_send_auto(did):
                self._seq += 1
                self._push_due(p)

    def _keyed_now(self, delivery: NewDelivery) -> NewDelivery:
        """A delivery history gave back (a replay's load, a redrive) carries no ordering key:
        the endpoint's setting now decides it."""
        e = delivery.event
        key = ordering.key_for(self.config.ordering_key, e.object_id, e.payload) if self.config else ""
        return replace(delivery, ordering_key=key)

    def _apply_skips(self, now_ms: int) -> None:
        """End the heads an operator skipped, each once it is idle (a request in flight is
        recorded first; a restored one is CHECKed first: it may be final already)."""
        for did in list(self._skips):
            p = self.items.get(did)
            if p is None or p.skip is None:
                self._skips.discard(did)
            elif p.busy:
                continue
            elif p.stage is Stage.ADOPTED:
                self._put(replace(p, stage=Stage.CHECK))
            elif p.stage is Stage.READY:
                self._skips.discard(did)
                self._put(d.skip_head(p, now_ms))

    def _key_row(self, p: Pending) -> ordering.KeyRowChange | None:
        """What a head's record does to its key's row in blocked_ordering_keys."""
        key, r = self._order.key_of(p.delivery_id), p.record
        if not key or r is None or not self._order.is_head(p.delivery_id):
            return None
        if r.delivery_status in d.FINAL_STATUSES:
            # No row was written for a head that succeeded at its first try.
            first_try_ok = r.outcome == "succeeded" and not r.manual and p.attempt_count <= 1
            return None if first_try_ok else ordering.KeyRowChange(key, blocked=False)
        if r.outcome == "retry" and not r.manual and self._ordered:
            return ordering.KeyRowChange(key, blocked=True, waiting=self._order.waiting(key),
                                         first_failure=p.attempt_count == 1)
        return None

    # -- the index -------------------------------------------------------------------------------

    def _put(self, p: Pending) -> None:
        did = p.delivery_id
        prev = self.items.get(did)
        self.items[did] = p
        if p.attempt_count == 0:
            if did not in self._fresh:
                self._fresh.add(did)
                self._age_index(self._fresh_by_age, p, len(self._fresh), fresh=True)
        elif prev is None or did in self._fresh:
            self._fresh.discard(did)
            self._age_index(self._tried_by_age, p, len(self.items) - len(self._fresh), fresh=False)
        self._work.discard(did)
        was_manual = did in self._manual
        self._manual.discard(did)
        if p.skip is not None:
            self._skips.add(did)
        if not p.manual and p.sending_manual is None:
            # Kept while its request is in flight: a request that could not be built comes back
            # (send_not_started) still at the front, its wait not restarted -- else an endpoint
            # held after each such try would retry the request for ever, never ending it.
            self._front_since.pop(did, None)
        if p.stage not in (Stage.CHECK, Stage.RESERVE, Stage.PERSIST):
            self._readying.discard(did)
        if p.busy:
            return
        if p.stage in d.STORAGE_STAGES:
            self._work.add(did)
        elif p.stage in d.WAITING_STAGES:
            if p.manual:
                self._manual.add(did)
                at = p.manual[0].requested_at_ms
                if not (was_manual and prev is not None and prev.manual and prev.manual[0].requested_at_ms == at):
                    heapq.heappush(self._manual_heap, (at, did))
            elif p.auto_retry_active and not _indexed_same(prev, p):
                self._seq += 1
                if self._may_send_auto(did):  # else it waits for its key's head (_requeue)
                    self._push_due(p)
                heapq.heappush(self._deadlines, (p.delivery.expires_at_ms, _rank(p), self._seq, did))
                if len(self._latest) > 2 * len(self.items) + 64:  # mostly stale entries: rebuild it
                    self._latest = [(-q.next_attempt_at_ms, 0, q.delivery_id)
                                    for q in self.items.values() if self._may_queue(q)]
                    heapq.heapify(self._latest)
                elif self._may_queue(p):
                    heapq.heappush(self._latest, (-p.next_attempt_at_ms, self._seq, did))

    def _age_index(self, heap: list[tuple[int, str]], p: Pending, size: int, fresh: bool) -> None:
        heapq.heappush(heap, (p.delivery.created_at_ms, p.delivery_id))
        if len(heap) > 2 * size + 64:  # mostly stale entries: keep the valid ones
            heap[:] = [e for e in heap if self._ages(e, fresh)]
            heapq.heapify(heap)

    def _ages(self, entry: tuple[int, str], fresh: bool) -> bool:
        """Whether an age index entry still stands for a held delivery of its kind."""
        at, did = entry
        p = self.items.get(did)
        return p is not None and (did in self._fresh) == fresh and p.delivery.created_at_ms == at

    def _oldest_by_age(self, heap: list[tuple[int, str]], fresh: bool) -> int | None:
        while heap:
            if self._ages(heap[0], fresh):
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def _oldest_manual(self, n: int) -> list[Pending]:
        """The ``n`` deliveries whose waiting manual request is oldest, oldest first (stale heap
        entries are dropped on the way; the ones returned stay in the heap)."""
        found: list[tuple[int, str]] = []
        while self._manual_heap and len(found) < n:
            entry = heapq.heappop(self._manual_heap)
            at, did = entry
            p = self.items.get(did)
            if (did in self._manual and p is not None and p.manual[0].requested_at_ms == at
                    and entry not in found):
                found.append(entry)
        for entry in found:
            heapq.heappush(self._manual_heap, entry)
        return [self.items[did] for _, did in found]

    def _push_due(self, p: Pending) -> None:
        heapq.heappush(self._due, (p.next_attempt_at_ms, _rank(p), self._seq, p.delivery_id))

    def _forget(self, did: str) -> None:
        self._leave_key(did)
        self._skips.discard(did)
        self._readying.discard(did)
        self.items.pop(did, None)
        self._fresh.discard(did)
        self._front_since.pop(did, None)
        self._work.discard(did)
        self._manual.discard(did)
        self._may_have_twin.discard(did)
        self.store.remove(did)

    def _top(self, heap: list[tuple[int, int, int, str]]) -> Pending | None:
        """The valid head of a heap (READY, idle, automatic), dropping stale entries."""
        deadlines = heap is self._deadlines
        while heap:
            at, _, _, did = heap[0]
            p = self.items.get(did)
            if (p is not None and _waits_auto(p)
                    and at == (p.delivery.expires_at_ms if deadlines else p.next_attempt_at_ms)
                    # a head displaced by a lower version waits again (_requeue brings it back)
                    and (deadlines or self._may_send_auto(did))):
                return p
            heapq.heappop(heap)
        return None


def _with_manual(p: Pending, requests: tuple[d.ManualRequest, ...]) -> Pending:
    """More manual requests owed; a restored delivery a person now waits for is checked at once."""
    stage = Stage.CHECK if p.stage is Stage.ADOPTED else p.stage
    return replace(p, manual=(*p.manual, *requests), stage=stage)


def _waits_auto(p: Pending) -> bool:
    """Idle, waiting for its next automatic attempt (what the due and deadline heaps index)."""
    return p.stage in d.WAITING_STAGES and not p.busy and p.auto_retry_active and not p.manual


def _rank(p: Pending) -> int:
    """Among deliveries due at the same time, READY ones before restored (ADOPTED) ones."""
    return 1 if p.stage is Stage.ADOPTED else 0


def _indexed_same(prev: Pending | None, p: Pending) -> bool:
    """Whether ``prev`` already has valid heap entries with the same keys as ``p``."""
    return (prev is not None and prev.stage is p.stage and prev.stage in d.WAITING_STAGES and not prev.busy
            and prev.auto_retry_active and not prev.manual and prev.next_attempt_at_ms == p.next_attempt_at_ms)


def _probe_at(b: brk.BreakerState) -> int | None:
    if b.state is brk.CircuitState.OPEN:
        return b.open_until_ms
    if b.state is brk.CircuitState.HALF_OPEN and b.probe_started_ms is not None:
        assert b.open_until_ms is not None and b.opened_at_ms is not None
        return b.probe_started_ms + (b.open_until_ms - b.opened_at_ms)
    return None
