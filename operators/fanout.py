"""Fan-out, keyed by event_id: drop duplicate events, check the config clock, then create one
delivery per matching endpoint. A thin adapter over :mod:`core.fanout`.

Dedupe is by (tenant, event_id): the state under an event id remembers the tenant that owns it.
The same tenant's event again is a duplicate (dropped, counted). Another tenant's event reusing
the id is no duplicate -- dropping it would lose that tenant's event silently -- and cannot be
fanned out either, because history keys rows by event id (the payload row, deliveries by event)
and the two tenants' rows would be merged: it is dead-lettered as ``event_id_conflict`` (counted)
for its producer to re-emit under an id of its own.

The hot path: while leased ticks flow (:mod:`core.fanout`), an event arrived before the clock's
horizon and goes at once -- it reads the dedupe state and the in-memory configs, and touches no
held state and no timer. Its metrics are tallied in memory and published with the gauges at most
every ``COUNTS_EVERY_MS`` / ``GAUGE_EVERY_MS`` (each counter call is a call into the JVM).

The fallback: an event past the horizon (ticks late or stopped) is held in keyed state and waits
on one processing-time timer at the moment :class:`core.fanout.ClockFollower` predicts the
covering tick will have been read, not on a short polling timer; a late tick costs a short
recheck. With no tick for ``stale_after_ms`` the event is released with the configs already read
(degraded mode: counted, logged once per outage).

The event-type catalog (records on the endpoints topic, kept in the broadcast state beside the
configs): before matching, an event of a tenant with a catalog is checked against it
(:mod:`core.schema_check`, validators compiled once per tenant/type/version). A refused one is
dead-lettered (``schema_invalid`` with the JSON Pointer and schema version, or
``schema_unknown``), reaches no receiver, and is recorded as fanned out to no endpoint (the
dead letter says why); ``warn`` lets it through, counted. A catalog record of a lower revision
than the one held for its key is ignored (:func:`core.schema_check.supersedes`). Endpoints
pinned to other schema majors are left out of the match and counted (``skipped_schema_major``,
a total: an endpoint label would make the metric's cardinality the number of pinned endpoints);
each skipped pair is listed in its endpoint's history as ``skipped`` with the reason -- that
listing is the per-endpoint count.

Tracing (``tracing`` on): fan-out is a step of the event's trace (core.trace_context.begin): a
child span of the producer's when the event came with a sampled traceparent, the root of a new
trace (head-sampled) when it came with none. Its deliveries carry the traceparent their attempts
continue. Off: the event's own traceparent, if any, rides with its deliveries unchanged, and
nothing else is done.
"""

from __future__ import annotations

import base64
import logging
import time
from typing import Any

from pyflink.common import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream.functions import KeyedBroadcastProcessFunction, RuntimeContext
from pyflink.datastream.state import StateTtlConfig, ValueStateDescriptor

from core import fanout, schema_check, spans
from core.bucket_tally import BucketTally
from core.event_schemas import ValidatorCache
from core.records import (
    CLOCK_KEY,
    CatalogSettingsRecord,
    CatalogTypeRecord,
    ConfigClock,
    DeadLetter,
    EndpointConfig,
    EventRecord,
    SchemaPinsRecord,
)
from core.tracing_settings import TracingSettings
from operators.dispatch_input import NEW, SNAPSHOT, for_dispatch
from operators.endpoint_configs import ENDPOINT_CONFIGS
from operators.parse_events import DEAD_LETTERS
from operators.snapshot_writer import snapshot_key
from operators.task_gauges import TaskGauges

log = logging.getLogger(__name__)

GAUGE_EVERY_MS = 100
COUNTS_EVERY_MS = 250


class FanOut(KeyedBroadcastProcessFunction):
    def __init__(self, dedupe_ttl_s: int, deadline_s: float, clock_interval_ms: int, clock_skew_ms: int,
                 clock_stale_after_ms: int, source_topic: str, tracing: TracingSettings | None = None) -> None:
        self._topic = source_topic
        self._tracing = tracing
        self._ttl_s = dedupe_ttl_s
        self._deadline_ms = int(deadline_s * 1000)
        self._clock_interval_ms = clock_interval_ms
        self._clock_skew_ms = clock_skew_ms
        self._stale_after_ms = clock_stale_after_ms

    def open(self, runtime_context: RuntimeContext) -> None:
        self._tracer: spans.Tracer | None = None
        if self._tracing is not None:
            from tracing import tracer

            self._tracer = tracer(self._tracing, self._tracing.job_service_name)
        # The tenant that owns this event id. (It replaced a boolean "seen" state: after an upgrade
        # an event re-read from the topic fans out again, and the dispatcher CHECKs the re-created
        # deliveries against Cassandra -- they were created before it started -- sending none twice.)
        owner = ValueStateDescriptor("owner", Types.STRING())
        # Remember event_ids longer than any replay window of the CDC topic: the relay may
        # publish twice, and a re-read topic must not fan out again.
        owner.enable_time_to_live(dedupe_ttl(self._ttl_s))
        self._owner = runtime_context.get_state(owner)
        self._held = runtime_context.get_state(ValueStateDescriptor("held", Types.PICKLED_BYTE_ARRAY()))
        # In-memory mirror of the broadcast state, by tenant, so matching an event reads only its
        # tenant's endpoints. Rebuilt from the broadcast state on first use after a (re)start.
        self._by_tenant: dict[str, dict[str, EndpointConfig]] | None = None
        # The same for the catalog's records (core.schema_check), and compiled validators.
        self._catalog: schema_check.CatalogIndex | None = None
        self._validators = ValidatorCache()
        self._clock = fanout.ClockFollower(self._clock_interval_ms, self._clock_skew_ms, self._stale_after_ms,
                                           _now_ms())
        self._clock_restored = False
        # event_id -> arrival of the events held by this incarnation (holds a restore left are
        # learnt when their timer fires): what the held-count and oldest-held-age gauges read.
        self._holding: dict[str, int] = {}
        self._degraded_since_ms: int | None = None
        m = runtime_context.get_metrics_group()
        self._duplicates = m.counter("duplicate_events_dropped")
        self._conflicts = m.counter("event_id_conflicts")
        self._deliveries = m.counter("deliveries_created")
        self._unmatched = m.counter("events_without_endpoints")
        self._released_without_clock = m.counter("events_released_without_clock")
        self._schema_refused = m.counter("events_schema_refused")
        self._schema_warned = {reason: m.counter(f"events_{reason}_delivered")
                               for reason in (schema_check.SCHEMA_INVALID, schema_check.SCHEMA_UNKNOWN)}
        self._skipped_major = m.counter("skipped_schema_major")
        # Set from this (the task) thread on ticks, elements and timers (operators/task_gauges.py):
        # ticks come several times a second while the control plane is up, so the ages stay fresh;
        # held events have timers, so their age keeps rising; with no ticks and no events the
        # clock's age is frozen (events arriving then are released after stale_after_ms and
        # counted in events_released_without_clock).
        self._gauges = TaskGauges(m)
        self._gauges_at = 0
        # Event arrival -> fan-out decision, one counter per latency bucket (core.telemetry), and
        # deliveries created: tallied here, published every COUNTS_EVERY_MS at most.
        self._metrics_group = m
        self._lag: dict[str, Any] = {}
        self._lag_tally = BucketTally()
        self._created = 0
        self._counts_at = 0

    def _publish_metrics(self, now_ms: int) -> None:
        """Gauges at most every GAUGE_EVERY_MS, counts at most every COUNTS_EVERY_MS."""
        if now_ms - self._gauges_at >= GAUGE_EVERY_MS:
            self._gauges_at = now_ms
            holding = self._holding
            self._gauges.set("events_held", len(holding))
            self._gauges.set("oldest_held_age_ms", max(0, now_ms - min(holding.values())) if holding else 0)
            self._gauges.set("config_clock_age_ms", self._clock.age_ms(now_ms))
        if now_ms - self._counts_at >= COUNTS_EVERY_MS:
            self._counts_at = now_ms
            for le, n in self._lag_tally.drain():
                counter = self._lag.get(le)
                if counter is None:
                    counter = self._lag[le] = self._metrics_group.add_group("fanout_lag_le_ms", le).counter("events")
                counter.inc(n)
            if self._created:
                self._deliveries.inc(self._created)
                self._created = 0

    def process_broadcast_element(self, value, ctx):  # type: ignore[override]
        state = ctx.get_broadcast_state(ENDPOINT_CONFIGS)
        if isinstance(value, ConfigClock):
            # Wall time, which is what processing time is: PyFlink 2.2's thread-mode broadcast
            # context has no currentProcessingTime (AttributeError on the Java object).
            now = _now_ms()
            if self._clock.observe(value.published_at_ms, value.lease_ms, now):
                # The horizon, not the value: restored, it is read as a tick with a lease of 0
                # (which is also how a value kept before leases reads).
                state.put(CLOCK_KEY, self._clock.horizon_ms)
                if self._degraded_since_ms is not None:
                    log.warning("config clock is back after %d ms: events wait for it again",
                                now - self._degraded_since_ms)
                    self._degraded_since_ms = None
            self._publish_metrics(now)
        elif isinstance(value, EndpointConfig) and fanout.newer(state.get(value.endpoint_id), value):
            state.put(value.endpoint_id, value)
            if self._by_tenant is not None:
                self._by_tenant.setdefault(value.tenant_id, {})[value.endpoint_id] = value
        elif isinstance(value, (CatalogTypeRecord, CatalogSettingsRecord, SchemaPinsRecord)) and \
                schema_check.supersedes(state.get(value.key), value):
            # A stale revision read after a newer one (replicas, a retry racing a change) is
            # dropped here as in the index, so a restore does not bring it back either.
            state.put(value.key, value)
            if self._catalog is not None:
                self._catalog.add(value)
        # An UnreadableConfig (counted by the parser) changes nothing here: the endpoint's last
        # readable config stays in use for matching, and the dispatcher holds its sends until a
        # readable config replaces it.

    def _tenant_configs(self, state, tenant_id: str) -> list[EndpointConfig]:
        if self._by_tenant is None:
            index: dict[str, dict[str, EndpointConfig]] = {}
            for key, cfg in state.items():
                if isinstance(cfg, EndpointConfig):  # not the clock, nor a catalog record
                    index.setdefault(cfg.tenant_id, {})[key] = cfg
            self._by_tenant = index
        return list(self._by_tenant.get(tenant_id, {}).values())

    def _catalog_index(self, state) -> schema_check.CatalogIndex:
        if self._catalog is None:
            index = schema_check.CatalogIndex()
            for _key, record in state.items():
                if isinstance(record, (CatalogTypeRecord, CatalogSettingsRecord, SchemaPinsRecord)):
                    index.add(record)
            self._catalog = index
        return self._catalog

    def _restore_clock(self, state) -> None:
        if not self._clock_restored:
            self._clock.restored(state.get(CLOCK_KEY))
            self._clock_restored = True

    def process_element(self, value, ctx):  # type: ignore[override]
        _, (event, arrived_ms) = value
        owner = self._owner.value()
        if owner == event.tenant_id:
            self._duplicates.inc()
            return
        if owner is not None:
            self._conflicts.inc()
            yield DEAD_LETTERS, _conflict_letter(event, self._topic)
            return
        self._owner.update(event.tenant_id)
        state = ctx.get_broadcast_state(ENDPOINT_CONFIGS)
        self._restore_clock(state)
        now = _now_ms()
        decision = self._clock.decide(arrived_ms, now)
        if decision.verdict == fanout.HOLD:
            self._held.update((event, arrived_ms))
            self._hold(event, arrived_ms, decision, ctx, now)
            return
        yield from self._fan_out(event, arrived_ms, decision, state, now)

    def on_timer(self, timestamp, ctx):  # type: ignore[override]
        held = self._held.value()
        if held is None:
            return
        event, arrived_ms = held
        state = ctx.get_broadcast_state(ENDPOINT_CONFIGS)
        self._restore_clock(state)
        now = _now_ms()
        decision = self._clock.decide(arrived_ms, now)
        if decision.verdict == fanout.HOLD:
            self._hold(event, arrived_ms, decision, ctx, now)
            return
        self._held.clear()
        self._holding.pop(event.event_id, None)
        yield from self._fan_out(event, arrived_ms, decision, state, now)

    def _hold(self, event: EventRecord, arrived_ms: int, decision: fanout.ClockDecision, ctx, now: int) -> None:
        self._holding[event.event_id] = arrived_ms
        ctx.timer_service().register_processing_time_timer(decision.recheck_at_ms)
        self._publish_metrics(now)

    def _fan_out(self, event: EventRecord, arrived_ms: int, decision: fanout.ClockDecision, state, now: int):
        degraded = decision.verdict == fanout.DEGRADED
        if degraded:
            self._released_without_clock.inc()
            if self._degraded_since_ms is None:
                self._degraded_since_ms = now
                log.warning("no config clock for %d ms (control plane down?): events are released "
                            "with the endpoint configs already read", self._clock.age_ms(now))
        catalog = self._catalog_index(state)
        verdict = schema_check.check_event(event, catalog.tenant(event.tenant_id), self._validators)
        if isinstance(verdict, schema_check.Refuse):
            # To no endpoint, said durably (reconciliation sees a decision, not a gap); the dead
            # letter carries the event and why.
            self._schema_refused.inc()
            self._lag_tally.observe(now - arrived_ms)
            self._publish_metrics(now)
            if self._tracer is not None:
                self._trace(self._tracer, event, arrived_ms, now, 0, 0, degraded, verdict.reason)
            yield for_dispatch(snapshot_key(event.event_id), SNAPSHOT, fanout.snapshot_for(event, [], arrived_ms,
                                                                                           degraded))
            yield DEAD_LETTERS, _schema_letter(event, verdict, self._topic)
            return
        if verdict.warning:
            self._schema_warned[verdict.warning].inc()
        matched = fanout.select_endpoints(event, self._tenant_configs(state, event.tenant_id))
        chosen, skipped = fanout.leave_out_pinned(event, matched, catalog.pins)
        if skipped:
            self._skipped_major.inc(len(skipped))
        self._lag_tally.observe(now - arrived_ms)
        self._created += len(chosen)
        self._publish_metrics(now)
        if not chosen:
            self._unmatched.inc()
        # The durable record of this decision (reconciliation's "expected"), written by the
        # dispatcher; emitted first, so a snapshot exists wherever its deliveries do. The skipped
        # pairs ride with it and are written with its row (operators/snapshot_writer.py).
        yield for_dispatch(snapshot_key(event.event_id), SNAPSHOT,
                           fanout.snapshot_for(event, chosen, arrived_ms, degraded, skipped))
        trace = event.traceparent
        if self._tracer is not None:
            trace = self._trace(self._tracer, event, arrived_ms, now, len(chosen), len(skipped), degraded)
        for d in fanout.deliveries_for(event, chosen, arrived_ms, self._deadline_ms, trace):
            yield for_dispatch(d.endpoint_id, NEW, d)

    def _trace(self, tracer: spans.Tracer, event: EventRecord, arrived_ms: int, now: int, endpoints: int,
               skipped: int, degraded: bool, refused: str | None = None) -> str | None:
        """Fan-out's step in the event's trace: its span, when sampled; the traceparent the
        deliveries' attempts continue."""
        step = tracer.begin(event.traceparent)
        if step.span is not None:
            tracer.sink.export(spans.fan_out_span(
                step.span, step.parent_span_id, event=event, topic=self._topic, arrived_ms=arrived_ms,
                decided_ms=now, endpoints=endpoints, skipped=skipped, degraded=degraded, refused=refused))
        return step.forward


class _JavaDefault:
    """Stands in for the periodic-compaction Duration PyFlink would otherwise build through the
    client gateway (absent in a TaskManager). Truthy, so PyFlink keeps it; never read: the
    conversion to Java passes only the entry count, and Java applies its own default (30 days)."""


def dedupe_ttl(ttl_s: int) -> StateTtlConfig:
    """Expiry of the dedupe state on either backend. Expired entries are never returned. Their
    space is reclaimed on RocksDB (the production backend) by its compaction filter, checking
    the time every 1,000 entries; on the heap backend incrementally, 10 entries per state
    access. PyFlink's default "background" cleanup builds a Java Duration through the client
    gateway, which does not exist inside a TaskManager, so the strategies are named explicitly;
    without the compaction filter, RocksDB kept every event id ever seen."""
    return (StateTtlConfig.new_builder(Time.seconds(ttl_s))
            .disable_cleanup_in_background()
            .cleanup_incrementally(10, False)
            .cleanup_in_rocksdb_compact_filter(1000, _JavaDefault())  # type: ignore[arg-type]
            .build())


def _conflict_letter(event: EventRecord, topic: str) -> str:
    # Names the event and its own tenant only: the letter must not tell one tenant about another.
    letter = DeadLetter(
        reason="event_id_conflict",
        detail=f"event_id {event.event_id} was already used by another tenant's event; tenant "
               f"{event.tenant_id} must re-emit this event under an id of its own",
        original_base64=base64.b64encode(event.to_json()).decode(), source_topic=topic,
        refused_at_ms=_now_ms(), extra={"original": "the event as parsed, re-encoded as webhooks.event/v1"})
    return letter.to_json().decode()


def _schema_letter(event: EventRecord, refused: schema_check.Refuse, topic: str) -> str:
    letter = DeadLetter(
        reason=refused.reason, detail=refused.detail,
        original_base64=base64.b64encode(event.to_json()).decode(), source_topic=topic, refused_at_ms=_now_ms(),
        extra={"original": "the event as parsed, re-encoded as webhooks.event/v1", "event_id": event.event_id,
               "tenant_id": event.tenant_id, "event_type": event.event_type, "pointer": refused.pointer,
               "schema_version": refused.schema_version})
    return letter.to_json().decode()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
