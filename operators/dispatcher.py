"""The dispatcher: keyed by endpoint, a thin Flink adapter over :mod:`core.endpoint_driver`.

Inputs, all keyed by endpoint_id: new deliveries from fan-out, replay requests, and endpoint
configs (so a config change drives its endpoint at once, in order with its deliveries). Output:
:class:`core.records.EndpointSignal` JSON for the control plane (a 410 Gone).

Per key the operator keeps one :class:`EndpointDriver` in memory (rebuilt from keyed state after a
restore: :mod:`core.endpoint_store` says what is durable where), and per operator instance the
shared pieces: the fair scheduler of tenant slots, the background asyncio loop with the HTTP
:class:`Sender` and the Cassandra history writer, and the :class:`IoTracker` of their futures.

Each call for a key is one *pass*: feed the driver the input and the finished I/O, ask it to
step, start the I/O it decided, and set one timer at the wake time it gave (or sooner, to look
at I/O in flight). A timer that was only such a look, and finds none of the endpoint's I/O
finished (the I/O side marks endpoints as their futures complete), makes no pass: it sets the
next look and returns (operators/wakes.py). Flink state is only touched from the task thread, in
the key's context.

An exception in one endpoint's pass never leaves the operator: it is logged (redacted),
counted, and that endpoint is held for a doubling period while every other endpoint flows. A
restart would hit the same endpoint again, crash-looping every tenant.
"""

from __future__ import annotations

import gc
import logging
import random
import time
from collections import Counter, OrderedDict
from dataclasses import replace
from typing import Any

from pyflink.common.typeinfo import Types
from pyflink.datastream import OutputTag
from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext

from core import archive_facts, dispatch, replay_policy, telemetry
from core import breaker as brk
from core import endpoint_health as health
from core.catch_up import CatchUp
from core.egress import EgressPolicy
from core.endpoint_driver import (
    Action,
    Check,
    Decision,
    DriverPolicy,
    EndpointDriver,
    IoKind,
    Load,
    Persist,
    Record,
    Reserve,
    Send,
    StorageHealth,
)
from core.fairness import FairScheduler
from core.fanout import NewDelivery
from core.records import REPLAY as REPLAY_ACTION
from core.records import EndpointConfig, RedriveRequest, ReplayRequest, UnreadableConfig
from core.retry import RetrySchedule
from core.secrets import redact
from core.settings import Settings
from core.timeutil import ms_to_iso
from core.write_shares import WriteShares
from operators import history_errors, task_resources
from operators.async_runtime import AsyncRuntime
from operators.dispatch_input import CONFIG, NEW, REDRIVE, REPLAY, SNAPSHOT, for_dispatch
from operators.endpoint_state import FlinkEndpointStore
from operators.history_store import CassandraHistory, PayloadUnavailable
from operators.io_tracker import Finished, IoTracker
from operators.payload_cache import PayloadCache
from operators.sender import Sender, SigningKeys, SigningKeyUnavailable
from operators.snapshot_writer import SNAPSHOT_KEY_PREFIX, SnapshotWriter
from operators.task_gauges import TaskGauges
from operators.wakes import Wakes
from operators.write_batcher import Completion
from tracing import tracer

log = logging.getLogger(__name__)

# The history facts of each call (core/archive_facts.py), one record per call that wrote any:
# a record crossing from Python to the JVM costs about as much as a few facts' encoding.
ARCHIVE_FACTS = OutputTag("archive-facts", Types.STRING())


# How often the endpoints this operator holds deliveries for are reported (endpoint_backlogs,
# with their breaker and oldest ages: core/endpoint_health.py). A breaker's change is reported at once.
BACKLOG_REPORT_MS = 30_000

# Every count the driver keeps, exported as a Flink counter of the same name.
METRICS = (
    "attempts", "succeeded", "retried", "failed", "expired", "endpoints_disabled", "adopted_after_restore",
    "final_not_resent", "history_write_failures", "expired_unrecorded", "manual_unrecorded", "replays",
    "replays_unknown", "replays_refused", "replays_duplicate", "manual_not_sent", "endpoint_holds",
    "endpoint_internal_errors", "signing_key_errors", "spilled", "paged_in", "retries_queued", "retries_paged_in",
    "redrives", "redrives_known", "throttled_rate_limit", "throttled_slots", "skips", "skips_not_held",
    "skips_not_head", "writes_rejected", "rejected_unrecorded", "failed_before_sending",
    # Replay requests read after the replay window they were queued with had closed (refused here).
    "replays_past_window",
    # The operator's own: passes made (for elements and timers), and timers that found nothing
    # finished and no driver wake due, so made none.
    "passes", "empty_polls",
    # Times the dispatcher went into catch-up (new deliveries arriving late) and out of it.
    "catch_up_started", "catch_up_ended")

# Labelled counts the driver keeps as "name:label": (the Flink group key that becomes the
# Prometheus label, the counter's name). Labels are bounded sets (core.telemetry).
LABELLED = {
    "attempts_by_class": ("status_class", "attempts"),
    "first_attempt_latency_ms": ("first_attempt_le_ms", "first_attempts"),
}

# Gauges are recomputed in the task thread at most this often, and this often while an age they
# report keeps growing (operators/task_gauges.py: no Python gauge callables, the reporter thread
# must never call into the interpreter).
GAUGE_REFRESH_MS = 1000
# Counts reach Flink's counters at most this often (and within GAUGE_REFRESH_MS of the last pass).
COUNTS_PUBLISH_MS = 250
COUNT_GAUGES = ("pending_new", "pending_retry", "endpoints", "breakers_open", "breakers_half_open",
                "endpoints_parked", "tenants_at_quota")
# The I/O kind of each storage action, to hand one back to the driver as failed (_not_started).
_STORAGE_KIND: dict[type, IoKind] = {Check: "check", Persist: "persist", Reserve: "reserve", Record: "record"}


class Dispatcher(KeyedProcessFunction):
    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    # -- lifecycle -------------------------------------------------------------------------------
    def open(self, runtime_context: RuntimeContext) -> None:
        s = self._settings
        # What dispatchers of ended tasks left (a restart of this job lands here), before this
        # one opens its own and freezes the interpreter's objects.
        task_resources.REGISTRY.sweep()
        self._store = FlinkEndpointStore(runtime_context)
        group = runtime_context.get_metrics_group()
        self._metrics = {name: group.counter(name) for name in METRICS}
        self._group = group
        self._gauges = telemetry.DispatcherGauges()
        # Each endpoint's part of the gauges, taken again only for endpoints a pass changed since
        # the last refresh, or whose "parked" ends with time (a hold, an open breaker). The driver
        # keeps it up to date as deliveries move (EndpointDriver.summary): walking every held
        # delivery of each touched endpoint each second cost CPU per delivery held
        # (docs/performance.md#the-taskmanagers-interpreter).
        self._summaries: dict[str, telemetry.EndpointSummary] = {}
        self._changed: set[str] = set()
        self._parked_until: dict[str, int] = {}
        self._gauges_at = 0
        self._refresh_due = False  # a timer will run a pass that refreshes them
        self._task_gauges = TaskGauges(group)
        self._per_endpoint: dict[str, TaskGauges] = {}  # dispatch.per_endpoint_metrics
        self._counts: Counter[str] = Counter()
        self._published: Counter[str] = Counter()
        self._counts_at = 0
        self._rng = random.Random()
        self._policy = DriverPolicy(
            schedule=RetrySchedule.from_settings(s.dispatch), breaker=brk.BreakerConfig.from_settings(s.dispatch),
            default_max_in_flight=s.dispatch.default_max_in_flight,
            # Deliveries whose Kafka time is before this operator opened (plus the clock skew
            # between producers/brokers and TaskManagers) may have been handled by the incarnation
            # a restore replaced: they read their durable record before being sent.
            check_created_before_ms=int(time.time() * 1000) + s.dispatch.restore_check_skew_ms,
            manual_wait_ms=int(s.dispatch.manual_wait_s * 1000), dedupe_window_ms=s.flink.dedupe_ttl_s * 1000,
            memory_window=s.dispatch.memory_window, page_size=s.dispatch.page_size,
            storage_give_up_ms=int(s.dispatch.storage_give_up_s * 1000))
        # A granted slot lapses after one harvest interval: the grantee, next in line, looks again
        # that often (no endpoint can set another's timer).
        self._scheduler = FairScheduler(pool_size=s.dispatch.max_in_flight,
                                        tenant_quota=s.dispatch.tenant_max_in_flight,
                                        grant_pickup_ms=s.dispatch.harvest_interval_ms)
        self._drivers: dict[str, EndpointDriver] = {}
        self._storage_health = StorageHealth()  # shared: any endpoint's write shows Cassandra takes writes
        self._idle_since: dict[str, int] = {}  # drivers holding nothing, kept a moment, oldest first
        # An endpoint that used all its write budget contends for longer than its longest back-off.
        self._shares = WriteShares(s.cassandra.max_concurrent_writes, want_ttl_ms=2 * self._policy.slot_wait_max_ms)
        self._wakes = Wakes()
        self._io = IoTracker()
        self._catch_up = CatchUp(s.dispatch.catch_up_late_ms, s.dispatch.catch_up_hold_ms)
        self._behind = False
        # The look interval of the mode, and the most a busy endpoint's looks stretch to.
        self._look_ms = (s.dispatch.harvest_interval_ms, s.dispatch.harvest_busy_max_ms)
        # event id -> the completion of the persist that writes its event row (None until started)
        self._events_written: OrderedDict[str, Completion | None] = OrderedDict()
        self._payloads = PayloadCache(s.dispatch.payload_cache_bytes)
        policy = EgressPolicy.from_settings(s.egress)
        if s.egress.dev_allow_cidrs:
            log.warning("EGRESS DEVELOPMENT ALLOWANCE IS ON: %s may be reached despite the SSRF policy",
                        s.egress.dev_allow_cidrs)
        self._rt = AsyncRuntime("dispatcher-io")
        from operators.http_sender import HttpSender

        # None with tracing off (the SDK is then never imported): attempts pass a delivery's
        # traceparent on as it came (operators/sender.py).
        attempts_tracer = tracer(s.tracing, s.tracing.job_service_name)
        self._sender = Sender(s.dispatch, self._rt.call(HttpSender.create(s.dispatch, policy)), s.master_keyring(),
                              attempts_tracer)
        self._facts: list[archive_facts.Fact] | None = [] if s.archive.stream else None
        self._history = CassandraHistory(s.cassandra, s.archive.hot_ttl_s if s.archive.stream else None,
                                         self._facts)
        self._next_backlog_report = 0
        self._reported: set[str] = set()  # endpoints last reported holding deliveries
        self._breakers_reported: dict[str, brk.CircuitState] = {}  # endpoint -> breaker in its last row
        self._snapshots = SnapshotWriter(runtime_context, self._history,
                                         group.counter("fanout_snapshot_write_failures"), recheck_ms=200)
        # close() runs only if the input ends: a cancelled or failed-over task never calls it.
        self._owned = task_resources.REGISTRY.register("dispatcher I/O", self._release)
        # Thread mode: this interpreter lives as long as the TaskManager and holds many long-lived
        # objects (PyFlink, aiohttp, the Cassandra driver) that every full collection walked: its
        # pauses were the whole first-attempt p99 tail at light load
        # (docs/performance.md#the-taskmanagers-interpreter). Frozen, they are skipped; close()
        # thaws them so a cancelled job's garbage can still be collected.
        gc.collect()
        gc.freeze()

    def close(self) -> None:
        """Only when the input ends (a bounded run); see operators/task_resources.py."""
        task_resources.REGISTRY.unregister(self._owned)
        self._history.flush()  # a bounded run's last writes (an ended task's are redone instead)
        self._release()
        gc.unfreeze()

    def _release(self) -> None:
        """Close the HTTP pool, the Cassandra session and the I/O loop (from any thread)."""
        try:
            self._rt.call(self._sender.close(), timeout=5)
        except Exception:  # closing is best effort: the process may be going away
            log.exception("closing the HTTP sender failed")
        self._history.shutdown()
        self._rt.close()

    # -- inputs ----------------------------------------------------------------------------------
    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):  # type: ignore[override]
        yield from self._element(value, ctx)
        yield from self._facts_out()

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):  # type: ignore[override]
        yield from self._timer(timestamp, ctx)
        yield from self._facts_out()

    def _facts_out(self):  # type: ignore[no-untyped-def]
        """The archive facts of the writes this call started, as one record. Emitted in the call
        that started the writes, so before any checkpoint barrier that follows them: a restore
        never loses a fact whose write it does not redo."""
        facts = self._facts
        if facts:
            # Latin-1: one char per byte, which the sink's ISO-8859-1 schema turns back into the same bytes.
            yield ARCHIVE_FACTS, archive_facts.encode(facts).decode("latin-1")
            facts.clear()

    def _element(self, value: Any, ctx: KeyedProcessFunction.Context):  # type: ignore[no-untyped-def]
        endpoint_id, (kind, item) = value
        now = ctx.timer_service().current_processing_time()
        if kind == SNAPSHOT:  # its own key: no endpoint is touched
            self._snapshots.received(endpoint_id, item, ctx, now)
            return
        try:
            drv = self._driver(endpoint_id)
            if kind == NEW:
                self._catch_up.arrived(item.created_at_ms, now)
                self._follow_catch_up(now)
                if (self._add_new(drv, item, now)
                        and self._wakes.defer(endpoint_id, now, self._poll_interval(endpoint_id))):
                    return  # in keyed state already; the timer due within a harvest interval steps it
            elif kind == REDRIVE:
                # Reconciliation's repair: CHECKed against Cassandra first, so a delivery that is
                # final there is not sent again; one this driver already holds is left alone.
                rd: RedriveRequest = item
                self._counts["redrives"] += 1
                nd = NewDelivery(delivery_id=rd.delivery_id, event=rd.event, endpoint_id=rd.endpoint_id,
                                 tenant_id=rd.tenant_id, endpoint_config_version=rd.endpoint_config_version,
                                 created_at_ms=rd.created_at_ms, expires_at_ms=rd.expires_at_ms)
                if not self._add_new(drv, nd, now, recheck=True):
                    self._counts["redrives_known"] += 1
                log.info("redrive of %s (%s) by %s", rd.delivery_id, rd.reason, rd.requested_by)
            elif kind == REPLAY:
                r: ReplayRequest = item
                if r.action == REPLAY_ACTION and not replay_policy.is_open(r.replay_closes_at_ms, now):
                    self._refuse_replay(r, now)
                else:
                    outcome = drv.add_replay(r, now)
                    if outcome in ("refused", "duplicate", "not a head", "not held"):
                        log.warning("%s %s of %s by %s: %s", r.action, r.request_id or "-", r.delivery_id,
                                    r.requested_by, outcome)
            elif kind == CONFIG:
                if isinstance(item, UnreadableConfig):
                    drv.refuse_config(item.reason)
                else:
                    drv.set_config(item)
            yield from self._pass(endpoint_id, drv, ctx, now)
        except Exception as exc:  # noqa: BLE001 -- one endpoint's failure must not stop the task
            self._contain(endpoint_id, ctx, now, exc)

    def _refuse_replay(self, r: ReplayRequest, now: int) -> None:
        """A replay read once the window it was queued with had closed (queued in time, read
        late: a backlog, a restart): never loaded nor sent, and said so in the delivery's history
        beside the request's audit row. The driver is not involved: it never held the request."""
        assert r.replay_closes_at_ms is not None
        reason = (f"{replay_policy.refusal_text(r.replay_rule, r.replay_closes_at_ms)}; "
                  f"the delivery job read the request at {ms_to_iso(now)}")
        self._counts["replays_past_window"] += 1
        self._history.refuse_replay(r, reason, now)
        log.warning("replay %s of %s by %s refused: %s", r.request_id or "-", r.delivery_id, r.requested_by, reason)

    def _add_new(self, drv: EndpointDriver, d: NewDelivery, now: int, recheck: bool = False) -> bool:
        """A delivery the driver does not hold yet joins it; False when it already does."""
        if d.delivery_id in drv.items:
            return False
        # In keyed state only until its event row is durable (see _drop_payload).
        self._store.put_payload(d.delivery_id, d.event.payload)
        self._payloads.put(d.event.event_id, d.event.payload)
        return drv.add_new(d, now, recheck=recheck)

    def _timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):  # type: ignore[no-untyped-def]
        key = ctx.get_current_key()
        if key.startswith(SNAPSHOT_KEY_PREFIX):
            self._snapshots.on_timer(key, ctx, ctx.timer_service().current_processing_time())
            return
        self._wakes.fired(key, timestamp)
        now = ctx.timer_service().current_processing_time()
        try:
            if not self._wakes.needs_pass(key, now, self._io):
                # Only a look at I/O in flight, and none of it finished: look again, without a pass.
                self._counts["empty_polls"] += 1
                self._history.flush_if_due()  # a lingering history batch is never stranded
                poll = self._poll_at(key, now)
                self._register(ctx, self._wakes.next_timer(key, poll, now))
                self._housekeeping(ctx, now, changed=False)
                return
            yield from self._pass(key, self._driver(key), ctx, now)
        except Exception as exc:  # noqa: BLE001 -- see process_element
            self._contain(key, ctx, now, exc)

    def _poll_interval(self, endpoint_id: str) -> int:
        return self._io.poll_interval(endpoint_id, *self._look_ms)

    def _poll_at(self, endpoint_id: str, now: int) -> int | None:
        return self._io.poll_at(endpoint_id, now, *self._look_ms)

    def _follow_catch_up(self, now: int) -> None:
        """Into or out of catch-up (core/catch_up.py) when it changed: looks at I/O in flight and
        history batches wait longer while deliveries arrive late, and as at light load once they
        no longer do."""
        behind = self._catch_up.behind(now)
        if behind == self._behind:
            return
        self._behind = behind
        d = self._settings.dispatch
        base = d.catch_up_harvest_interval_ms if behind else d.harvest_interval_ms
        self._look_ms = (base, d.harvest_busy_max_ms)  # a busy endpoint's looks are never rarer than base
        self._history.catching_up(behind)
        self._counts["catch_up_started" if behind else "catch_up_ended"] += 1
        log.info("catch-up %s", "started: new deliveries arrive late" if behind else "ended")

    def _driver(self, endpoint_id: str) -> EndpointDriver:
        drv = self._drivers.get(endpoint_id)
        if drv is None:
            # First touch in this incarnation: built from keyed state (entries a restore left are
            # adopted and CHECKed against Cassandra before anything is sent).
            drv = EndpointDriver(endpoint_id, self._policy, self._rng, self._store, self._scheduler, self._counts,
                                 self._storage_health)
            self._drivers[endpoint_id] = drv
        return drv

    # -- one pass --------------------------------------------------------------------------------
    def _pass(self, endpoint_id: str, drv: EndpointDriver, ctx: Any, now: int):
        self._counts["passes"] += 1
        for f in self._io.finished(endpoint_id):
            if f.kind != "send":
                self._shares.finished(endpoint_id)
            self._finished(drv, f, now)
        budget = self._shares.budget(endpoint_id, drv.tenant_id, now)
        decision = drv.step(now, budget)
        retry_at = self._start(endpoint_id, drv, decision, now)
        used = sum(1 for a in decision.actions if not isinstance(a, (Send, Load)))  # what the budget bounds
        self._shares.used(endpoint_id, drv.tenant_id, budget, used, now)
        for signal in decision.signals:
            yield signal.to_json().decode()
        wake = decision.wake.at_ms if decision.wake else None
        if drv.held_until_ms > now and (wake is None or drv.held_until_ms < wake):
            wake = drv.held_until_ms  # held by send_not_started, after the step chose its wake
        if retry_at is not None and (wake is None or retry_at < wake):
            wake = retry_at  # a write refused as it was built, after the step chose its wake
        self._wakes.asked(endpoint_id, wake)
        poll = self._poll_at(endpoint_id, now)
        self._register(ctx, self._wakes.next_timer(endpoint_id, poll, now))
        self._changed.add(endpoint_id)
        moved = health.breaker_changed(self._breakers_reported.get(endpoint_id), drv.breaker.state)
        if drv.idle and not self._io.busy(endpoint_id):
            self._went_idle(endpoint_id, now)
            if endpoint_id in self._reported or moved:
                self._report(endpoint_id, drv, telemetry.EndpointSummary(), now)  # holds none now
            self._reported.discard(endpoint_id)
            self._breakers_reported.pop(endpoint_id, None)
        else:
            self._idle_since.pop(endpoint_id, None)
            if moved:
                self._report(endpoint_id, drv, self._summary(endpoint_id, drv, now, fresh=True), now)
        self._housekeeping(ctx, now, changed=True)

    def _went_idle(self, endpoint_id: str, now: int) -> None:
        """The driver holds nothing: drop it, now or after dispatch.idle_driver_keep_ms. Under load
        an endpoint often holds nothing between one delivery's outcome and the next delivery's
        arrival, and building its driver again reads its config, breaker, bucket, queues and
        entries from keyed state (a call into Java each) and costs its timer a pass."""
        if self._settings.dispatch.idle_driver_keep_ms == 0:
            self._drop(endpoint_id)
            return
        self._idle_since.pop(endpoint_id, None)
        self._idle_since[endpoint_id] = now  # newest last: the sweep stops at the first kept one

    def _drop_idle(self, now: int) -> None:
        keep = self._settings.dispatch.idle_driver_keep_ms
        while self._idle_since:
            endpoint_id, since = next(iter(self._idle_since.items()))
            if now - since < keep:
                return
            del self._idle_since[endpoint_id]
            drv = self._drivers.get(endpoint_id)
            if drv is not None and drv.idle and not self._io.busy(endpoint_id):
                self._drop(endpoint_id)

    def _drop(self, endpoint_id: str) -> None:
        del self._drivers[endpoint_id]  # keyed state keeps its config, breaker and bucket
        self._wakes.forget(endpoint_id)
        self._changed.add(endpoint_id)  # its summary goes with it

    def _housekeeping(self, ctx: Any, now: int, changed: bool) -> None:
        """The operator-wide work that rides on any timer or pass: backlog reports, gauges, counts.
        ``changed``: a pass was made, so what the gauges show may be stale."""
        if self._idle_since:
            self._drop_idle(now)
        if self._behind:
            self._follow_catch_up(now)  # it ends with time, arrivals or not
        if now >= self._next_backlog_report:
            self._report_backlogs(now)
        if now - self._gauges_at >= GAUGE_REFRESH_MS:
            self._refresh_gauges(now)
            # Ages are set, not read at scrape time: refresh them again while they grow.
            again = self._gauges.ageing
        else:
            # What this pass changed (a delivery finished, say) must reach the gauges even if no
            # other pass follows: a stale "oldest new" would keep ageing on an idle job and alert.
            again = changed
        if again and not self._refresh_due:
            ctx.timer_service().register_processing_time_timer(self._gauges_at + GAUGE_REFRESH_MS)
            self._refresh_due = True
        if now - self._counts_at >= COUNTS_PUBLISH_MS or not self._refresh_due:
            # Not on every pass (each changed count is a call into Java): the refresh timer
            # above is due within a second and publishes what this pass counted.
            self._publish_counts()
            self._counts_at = now

    # -- gauges ----------------------------------------------------------------------------------
    def _refresh_gauges(self, now: int) -> None:
        self._summarize_changed(now)
        g = self._gauges = telemetry.aggregate(self._summaries.values(), self._scheduler.tenants_at_quota())
        self._gauges_at = now
        self._refresh_due = False
        tg = self._task_gauges
        for name in COUNT_GAUGES:
            tg.set(name, getattr(g, name))
        tg.set("oldest_new_age_ms", g.age_ms(g.oldest_new_ms, now))
        tg.set("oldest_parked_new_age_ms", g.age_ms(g.oldest_parked_new_ms, now))
        tg.set("oldest_retry_age_ms", g.age_ms(g.oldest_retry_ms, now))
        if self._settings.dispatch.per_endpoint_metrics:
            self._endpoint_series()

    def _summarize_changed(self, now: int) -> None:
        """Rebuild the summaries of endpoints changed since the last refresh; drop dropped ones."""
        changed = self._changed
        changed.update(ep for ep, until in self._parked_until.items() if until <= now)
        window = int(self._settings.dispatch.retry_deadline_s * 1000)
        for ep in changed:
            self._parked_until.pop(ep, None)
            drv = self._drivers.get(ep)
            if drv is None or ep in self._idle_since:  # an idle driver kept a moment holds none
                self._summaries.pop(ep, None)
                continue
            self._summaries[ep] = drv.summary(now, window)
            # Parked may end with no pass (nothing to send): look again when it would.
            ends = [t for t in (drv.held_until_ms, drv.breaker.open_until_ms) if t is not None and t > now]
            if ends:
                self._parked_until[ep] = min(ends)
        self._changed = set()

    def _endpoint_series(self) -> None:
        """Per-endpoint gauges (opt-in), made the first time an endpoint is seen and set back to
        zeros when its driver is dropped."""
        # flink_taskmanager_job_task_operator_endpoint_id_<name>{endpoint_id="..."}
        summaries = self._summaries
        for ep in self._per_endpoint.keys() - summaries.keys():
            for name in ("pending", "consecutive_failures", "breaker_open"):
                self._per_endpoint[ep].set(name, 0)
        for ep, v in summaries.items():
            gauges = self._per_endpoint.get(ep)
            if gauges is None:
                gauges = self._per_endpoint[ep] = TaskGauges(self._group.add_group("endpoint_id", ep))
            gauges.set("pending", v.held)
            gauges.set("consecutive_failures", v.consecutive_failures)
            gauges.set("breaker_open", int(v.breaker is brk.CircuitState.OPEN))

    def _report_backlogs(self, now: int) -> None:
        """Which endpoints this job holds deliveries for, so reconciliation can tell a delivery
        waiting behind a failing endpoint from one nothing holds, with what the console shows of
        them (fire and forget: the next report is 30 s away, and a missing one only makes the
        sweeper re-queue, idempotently, and the console show an older row)."""
        self._next_backlog_report = now + BACKLOG_REPORT_MS
        self._summarize_changed(now)
        for endpoint_id, drv in self._drivers.items():
            if drv.held:
                self._report(endpoint_id, drv, self._summary(endpoint_id, drv, now, fresh=False), now)

    def _summary(self, endpoint_id: str, drv: EndpointDriver, now: int, fresh: bool) -> telemetry.EndpointSummary:
        """The endpoint's summary for a report; ``fresh``: rebuilt now, not the gauges' last one."""
        known = None if fresh else self._summaries.get(endpoint_id)
        return known or drv.summary(now, int(self._settings.dispatch.retry_deadline_s * 1000))

    def _report(self, endpoint_id: str, drv: EndpointDriver, summary: telemetry.EndpointSummary, now: int) -> None:
        row = health.report(endpoint_id, drv.tenant_id, summary, drv.breaker,
                            self._scheduler.at_quota(drv.tenant_id), now)
        self._history.report_backlog(row)
        self._breakers_reported[endpoint_id] = drv.breaker.state
        if row.pending:
            self._reported.add(endpoint_id)

    def _finished(self, drv: EndpointDriver, f: Finished, now: int) -> None:
        result = f.result
        if f.kind == "persist" and f.exc is not None and f.tag:
            self._events_written.pop(f.tag, None)  # the event row may not be written: claim again
        if f.kind == "persist" and f.exc is None and drv.items.get(f.key) is not None:
            self._drop_payload(f.key, drv.items[f.key].delivery.event.event_id)
        if f.kind == "load" and result is not None:
            loaded, _ = result
            # Its event row is where it was loaded from: memory only, never keyed state.
            self._payloads.put(loaded.event.event_id, loaded.event.payload)
        if f.kind == "send" and isinstance(f.exc, PayloadUnavailable):
            # Nothing was sent: the delivery goes back as it was and the endpoint waits a moment.
            drv.send_not_started(f.key, str(f.exc), now)
            log.warning("endpoint %s held until %d: %s", drv.endpoint_id, drv.held_until_ms, redact(str(f.exc)))
            return
        exc = f.exc
        if exc is not None and f.kind != "send":
            log.warning("%s of %s failed, will retry: %s", f.kind, f.key, redact(str(exc)))
            exc = history_errors.as_driver_error(exc)
        drv.io_done(f.kind, f.key, result, exc, now)

    def _start(self, endpoint_id: str, drv: EndpointDriver, decision: Decision, now: int) -> int | None:
        """Start the I/O the driver decided. Should starting one raise, what was decided but not
        started is handed back to the driver before _contain holds the endpoint: left busy, it
        would never be sent nor release its in-flight count and tenant/pool slots. Returns when
        to retry the writes refused for their own values (None: none was)."""
        sends: list[tuple[str, Any]] = []
        first_unstarted = 0
        retry_at: int | None = None
        try:
            for a in decision.actions:
                try:
                    self._start_one(endpoint_id, drv, a, sends, now)
                except Exception as exc:
                    if isinstance(a, (Send, Load)):
                        raise
                    refused = history_errors.as_driver_error(exc)
                    if not isinstance(refused, dispatch.WriteRejected):
                        raise
                    # This write's own values (one delivery's poison) raise as it is built: only
                    # that delivery's write fails. Holding the endpoint for it, as for an error of
                    # the pass, would hand back every request after it in this decision, and the
                    # same write comes first again next pass: the endpoint silenced for a day.
                    # (%r: the message may hold the very character that could not be encoded)
                    log.warning("%s of %s refused as built: %r", type(a).__name__, a.p.delivery_id,
                                redact(str(exc))[:200])
                    self._not_started(drv, [], [a], refused, now)
                    p = drv.items.get(a.p.delivery_id)
                    if p is not None and (retry_at is None or p.write_retry_at_ms < retry_at):
                        retry_at = p.write_retry_at_ms
                first_unstarted += 1
            if sends:
                # One wake-up of the I/O loop for the whole batch, not one per request.
                futures = self._rt.submit_all([coro for _, coro in sends])
                for (did, _), fut in zip(sends, futures, strict=True):
                    self._io.add(endpoint_id, "send", did, fut, now)
                sends = []
        except Exception as exc:
            self._not_started(drv, sends, decision.actions[first_unstarted:], exc, now)
            raise
        self._history.flush_if_due()
        return retry_at

    def _not_started(self, drv: EndpointDriver, sends: list[tuple[str, Any]], actions: list[Action],
                     exc: BaseException, now: int) -> None:
        """Hand back work decided but never started: requests not submitted go back unsent (the
        endpoint is held), storage I/O fails as a write or read that will be retried."""
        # _contain holds the endpoint once for the error; each request handed back must not again.
        reason = f"not started: {type(exc).__name__}"
        for did, coro in sends:
            coro.close()
            drv.send_not_started(did, reason, now, hold=False)
        for a in actions:
            if isinstance(a, Send):
                drv.send_not_started(a.p.delivery_id, reason, now, hold=False)
            elif isinstance(a, Load):
                drv.io_done("load", a.delivery_id, None, exc, now)
            else:
                if isinstance(a, Persist) and self._events_written.get(a.p.delivery.event.event_id, 0) is None:
                    del self._events_written[a.p.delivery.event.event_id]  # claimed, never written
                drv.io_done(_STORAGE_KIND[type(a)], a.p.delivery_id, None, exc, now)

    def _start_one(self, endpoint_id: str, drv: EndpointDriver, a: Action, sends: list[tuple[str, Any]],
                   now: int) -> None:
        """Start one action; a request only joins ``sends``, submitted together by _start."""
        if isinstance(a, Send):
            try:
                keys = self._sender.keys(a.config, now)
            except SigningKeyUnavailable as exc:
                self._counts["signing_key_errors"] += 1
                drv.send_not_started(a.p.delivery_id, str(exc), now)
                log.error("endpoint %s held until %d: %s", endpoint_id, drv.held_until_ms, exc)
                return
            sends.append((a.p.delivery_id, self._send(a.p, a.config, keys)))
            return
        if isinstance(a, Persist):
            p = a.p
            assert p.intent is not None
            payload = self._payload(p)
            # Without the bytes at hand the event row was written already (they leave keyed
            # state only once it is durable): never overwrite it with an empty payload.
            claimed = payload is not None and self._claim_event_row(p.delivery.event.event_id)
            full = replace(p.delivery, event=replace(p.delivery.event, payload=payload or b""))
            done = self._history.persist(full, p.intent, claimed)
            if claimed:
                self._events_written[p.delivery.event.event_id] = done
            self._io.add(endpoint_id, "persist", p.delivery_id, done, now,
                         tag=p.delivery.event.event_id if claimed else None)
        elif isinstance(a, Reserve):
            assert a.p.intent is not None
            self._io.add(endpoint_id, "reserve", a.p.delivery_id,
                         self._history.reserve(a.p.delivery, a.p.intent, now), now)
        elif isinstance(a, Record):
            assert a.p.record is not None
            self._io.add(endpoint_id, "record", a.p.delivery_id, self._history.record(
                a.p.delivery, a.p.record, a.p.attempt_count, a.p.intent, a.key_row), now)
        elif isinstance(a, Check):
            self._io.add(endpoint_id, "check", a.p.delivery_id,
                         self._rt.submit(self._history.check(a.p.delivery_id)), now)
        elif isinstance(a, Load):
            self._io.add(endpoint_id, "load", a.delivery_id,
                         self._rt.submit(self._history.load_for_replay(a.delivery_id)), now)
        self._shares.started(endpoint_id, drv.tenant_id)  # every action but a request is storage I/O

    def _contain(self, endpoint_id: str, ctx: Any, now: int, exc: BaseException) -> None:
        """An unexpected error in one endpoint's pass: hold that endpoint, keep the task."""
        self._counts["endpoint_internal_errors"] += 1
        reason = f"internal error: {type(exc).__name__}: {redact(str(exc))[:200]}"
        drv = self._drivers.get(endpoint_id)
        if drv is not None:
            drv.hold(now, reason)
            until = drv.held_until_ms
            self._changed.add(endpoint_id)
        else:
            until = now + self._policy.hold_max_ms
        log.error("endpoint %s held until %d after %s", endpoint_id, until, reason, exc_info=exc)
        self._wakes.held(endpoint_id, until)
        self._register(ctx, self._wakes.timer_for(endpoint_id, until, now))
        self._publish_counts()

    # -- payloads --------------------------------------------------------------------------------
    def _payload(self, p: dispatch.Pending) -> bytes | None:
        """The delivery's bytes from memory or keyed state; None when only Cassandra has them."""
        event_id = p.delivery.event.event_id
        payload = self._payloads.get(event_id)
        if payload is None:
            payload = self._store.payload(p.delivery_id)
            if payload is not None:
                self._payloads.put(event_id, payload)
        return payload

    def _send(self, p: dispatch.Pending, cfg: EndpointConfig, keys: SigningKeys):  # type: ignore[no-untyped-def]
        payload = self._payload(p)
        if payload is not None:
            self._drop_payload(p.delivery_id, p.delivery.event.event_id)
            return self._sender.send(p, payload, cfg, keys)
        return self._send_stored(p, cfg, keys)

    async def _send_stored(self, p: dispatch.Pending, cfg: EndpointConfig, keys: SigningKeys) -> dispatch.SendReport:
        """Read the immutable bytes back from the event row, then send them. A read that fails
        (a timeout, Cassandra unavailable) is PayloadUnavailable like a missing row: nothing was
        sent, so it must not be recorded as an attempt nor spend the retry budget."""
        try:
            payload = await self._history.load_payload(p.delivery.event.event_id)
        except PayloadUnavailable:
            raise
        except Exception as exc:
            raise PayloadUnavailable(f"reading the payload of event {p.delivery.event.event_id} failed: "
                                     f"{type(exc).__name__}") from exc
        return await self._sender.send(p, payload, cfg, keys)

    def _drop_payload(self, delivery_id: str, event_id: str) -> None:
        """Take the bytes out of keyed state once the event row holding them is durable: a
        backlog then costs keyed state ~230 bytes a delivery, not the payload too."""
        claim = self._events_written.get(event_id)
        if claim is not None and claim.done() and claim.exception() is None:
            self._store.remove_payload(delivery_id)

    def _claim_event_row(self, event_id: str) -> bool:
        """Write each event's payload row once per incarnation, not once per delivery. A failed
        persist un-claims it, and that delivery stays PERSIST until the row is written, so the
        row is never missing for good. The claim keeps the write's completion: a payload leaves
        keyed state only once it is known durable (_drop_payload)."""
        if event_id in self._events_written:
            self._events_written.move_to_end(event_id)
            return False
        self._events_written[event_id] = None
        if len(self._events_written) > 100_000:
            self._events_written.popitem(last=False)
        return True

    @staticmethod
    def _register(ctx: Any, at_ms: int | None) -> None:
        """Set the timer operators.wakes chose (None: one at or before it is set already)."""
        if at_ms is not None:
            ctx.timer_service().register_processing_time_timer(at_ms)

    def _publish_counts(self) -> None:
        for name, value in self._counts.items():
            delta = value - self._published[name]
            if delta:
                counter = self._metrics.get(name)
                if counter is None:  # "name:label": one counter per label, made on first use
                    base, _, label = name.partition(":")
                    key, counter_name = LABELLED[base]
                    counter = self._metrics[name] = self._group.add_group(key, label).counter(counter_name)
                counter.inc(delta)
                self._published[name] = value


def key_config(cfg: Any):  # type: ignore[no-untyped-def]
    """Endpoint configs join the dispatcher's keyed input (the clock ticks are fan-out's only)."""
    if isinstance(cfg, (EndpointConfig, UnreadableConfig)):
        yield for_dispatch(cfg.endpoint_id, CONFIG, cfg)
