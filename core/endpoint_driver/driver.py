"""The endpoint driver's loop: inputs in, one step's :class:`Decision` out.

The package docstring (:mod:`core.endpoint_driver`) says what the driver is and the rules it
keeps. This module holds the loop: the inputs (:meth:`EndpointDriver.add_new`, ``add_replay``,
``set_config``, ``io_done``), :meth:`EndpointDriver.step` and the index over the deliveries held
in memory. The backlog beyond memory is :mod:`core.endpoint_driver.backlog`, the send path
:mod:`core.endpoint_driver.sending`, the ordering keys :mod:`core.key_order`.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter

from core import breaker as brk
from core import dispatch as d
from core import key_order, ratelimit, telemetry
from core import operational_events as ops
from core.dispatch import Pending, Stage, replace
from core.endpoint_driver.backlog import Backlog
from core.endpoint_driver.decision import Check, Decision, IoKind, Load, Persist, Record, Reserve
from core.endpoint_driver.policy import DriverPolicy, StorageHealth
from core.endpoint_driver.sending import SendPath
from core.endpoint_store import EndpointStore, RetryBucket
from core.fairness import FairScheduler
from core.fanout import NewDelivery
from core.ordering import KeyQueues
from core.outcomes import ErrorClass, HttpResult
from core.records import SKIP, EndpointConfig, EndpointSignal, EndpointStatus, ReplayRequest


def light(delivery: NewDelivery) -> NewDelivery:
    """The delivery without its payload bytes (kept once, by the adapter, in its own entry)."""
    return replace(delivery, event=replace(delivery.event, payload=b""))


class EndpointDriver(SendPath):
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
        # What does not fit memory waits in keyed state: the overflow queue of fresh deliveries
        # and the retry queue (core.endpoint_driver.backlog).
        self.backlog = Backlog(endpoint_id, policy, store, self.counts, self)
        for p in store.entries(endpoint_id):
            # Work an earlier incarnation held: its durable record decides what happens next.
            self.counts["adopted_after_restore"] += 1
            self.backlog.restored(p.delivery_id)
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
            delivery = key_order.keyed_now(self.config, delivery)  # a redrive, rebuilt from history
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
            self.backlog.supersede(did)  # a re-creation: its queued copy, if any, CHECKs too
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
                self.backlog.superseded.discard(key)
            nxt = d.after_check(p, result, self.rng, now_ms)
            if nxt is None:
                self.counts["final_not_resent"] += 1
                if result.status in ("failed", "expired"):
                    # Its signal may have been lost with the incarnation that ended it (emitted
                    # after the last checkpoint): again, with the same delivery id.
                    self._exhausted(replace(p, attempt_count=max(p.attempt_count, result.attempt_count)),
                                    result.status, None, p.delivery.endpoint_config_version, now_ms)
                self._forget(key)
            else:
                self._put(nxt)
        elif kind in ("persist", "reserve"):
            nxt = d.after_reserved(p)
            # Only a delivery this incarnation has just persisted is queued: one that went through
            # CHECK (restored, re-created, loaded) may have a copy queued already, and two queued
            # copies could both come back sendable.
            if kind == "persist" and self.backlog.overflowing(nxt):
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
        self.backlog.page_in(now_ms, dec)
        self.backlog.page_in_retries(now_ms, dec)
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
        # What this step observed itself (deliveries that expired) leaves with it, not a step later.
        dec.signals.extend(self._signals)
        self._signals = []
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
        return self.backlog.spilled

    def view(self, now_ms: int, retry_window_ms: int) -> telemetry.EndpointView:
        """This endpoint as the gauges see it (core.telemetry). Parked: nothing may be sent now
        (disabled, gone, held, or the breaker open and not yet probing)."""
        parked = self._parked(now_ms)
        head = self.backlog.head_expires
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
        head = self.backlog.head_expires
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
            self._exhausted(p, "expired", None, p.delivery.endpoint_config_version, now_ms)
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
                dec.actions.append(Record(p, key_order.key_row(self._order, p, self._ordered)))
            self._put(p)
        for did in list(self._loads):
            if did in self._loading:
                continue
            if self._load_retry_at.get(did, 0) > now_ms:
                dec.wake_at(self._load_retry_at[did], "replay load retry")
                continue
            self._loading.add(did)
            dec.actions.append(Load(did))

    # -- results -------------------------------------------------------------------------------

    def _apply_report(self, p: Pending, report: d.SendReport, now_ms: int) -> None:
        before = self.breaker
        p, self.breaker = d.apply_result(p, report, before, self.policy.breaker, self.policy.schedule, self.rng)
        if self.breaker != before:
            self.store.put_breaker(self.breaker)
            moved = ops.breaker_signal(self.endpoint_id, p.delivery.tenant_id, report.endpoint_config_version,
                                       before, self.breaker, p.delivery.event.event_type, now_ms)
            if moved is not None:
                self._signals.append(moved)
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
        if r.delivery_status in ("failed", "expired") and not r.manual and not r.disable_endpoint:
            self._exhausted(p, r.delivery_status, report.result.status, report.endpoint_config_version, now_ms)
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

    def _exhausted(self, p: Pending, outcome: str, status: int | None, config_version: int, now_ms: int) -> None:
        """A delivery ended without success: the control plane makes it an operational event."""
        self._signals.append(ops.exhausted_signal(
            self.endpoint_id, p.delivery.tenant_id, config_version, p.delivery_id, p.delivery.event.event_id,
            p.delivery.event.event_type, outcome, status, p.attempt_count, now_ms))

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
        if p is not None:
            self.store.add_manual(did, requests)
            self._put(_with_manual(p, requests))
            return
        self.backlog.supersede(did)  # it may be in a queue too: that copy CHECKs
        self._tenant = self._tenant or delivery.tenant_id
        delivery = key_order.keyed_now(self.config, delivery)
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

    # -- ordering keys (core.key_order) ------------------------------------------------------------

    @property
    def _ordered(self) -> bool:
        return self.config is not None and bool(self.config.ordering_key)

    def _may_send_auto(self, did: str) -> bool:
        return key_order.may_send_auto(self._order, did, self._ordered)

    def _join_key(self, p: Pending, started: bool = False) -> None:
        key_order.join(self._order, p, started)

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

    # -- memory as the backlog sees it (core.endpoint_driver.backlog.Memory) -------------------------

    @property
    def fresh_count(self) -> int:
        return len(self._fresh)

    def in_key(self, delivery_id: str) -> bool:
        return bool(self._order.key_of(delivery_id))

    def note_version(self, config_version: int) -> None:
        self.needs_version = max(self.needs_version, config_version)

    def page_back(self, p: Pending) -> None:
        self.store.put(p)
        self._join_key(p, started=p.attempt_count > 0)
        self._put(p)

    def release(self, delivery_id: str) -> None:
        self.items.pop(delivery_id, None)
        self._front_since.pop(delivery_id, None)

    def _spill(self, p: Pending) -> None:
        """A fresh delivery leaves memory for the overflow queue."""
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
        self.backlog.spill(p)

    # The backlog's state under the names the model test's invariants read
    # (tests/unit/core/test_driver_model.py).

    @property
    def queued_retries(self) -> int:
        """Deliveries in the retry queue (keyed state only)."""
        return self.backlog.queued_retries

    @property
    def _superseded(self) -> set[str]:
        return self.backlog.superseded

    @property
    def _own_from(self) -> int:
        return self.backlog.own_from

    @property
    def _rq(self) -> dict[int, RetryBucket]:
        return self.backlog.rq

    @property
    def _rq_own_from(self) -> dict[int, int]:
        return self.backlog.rq_own_from

    def _may_queue(self, p: Pending) -> bool:
        return self.backlog.may_queue(p)

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
                self.backlog.offer(p, self._seq)

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
        self.backlog.forget(did)
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
