"""Fan-out: which endpoints an event goes to, and when it is safe to decide.

Matching: an event goes to every *active* endpoint of its tenant whose event-type filter accepts
its type. A filter entry is an exact type (``invoice.paid``), a prefix wildcard (``invoice.*``
matches ``invoice.paid`` and ``invoice.line.added`` but not ``invoice``), or ``*`` for all types.

Timing ("config at event time"): endpoint configs and events travel on different topics, so the
job can see an event before the config of an endpoint created just before it. The control plane
publishes a leased :class:`core.records.ConfigClock` tick on the single-partition endpoints topic.
A tick with value T and lease L promises: every config change that is not on the topic before this
tick is acknowledged by the API no earlier than T + L (control-plane time; the control plane's
side is in :mod:`control_plane.publishing.configs`). So once fan-out has read the tick it has read every
config acknowledged before T + L, the tick's *horizon*: an event whose arrival (its Kafka time) A
is before the horizon, committed after some change's acknowledgement K, has K <= A < T + L, so
that change's config preceded the tick and was read. Every later tick keeps an earlier one's
promise, so the horizon is the largest T + L read. ``skew_ms`` is taken off it because A is Kafka's
time and T the control plane's: it bounds how far any control plane's clock runs ahead of the
events' timestamps.

With ticks every ``interval`` << L, a fresh tick's horizon is ahead of every event being read, so
events go at once: no state, no timer. An event past the horizon (ticks late: the control plane
slow, held by an unpublished change, or down) waits, held, never dropped. :class:`ClockFollower`
predicts when the tick whose horizon passes it will be read, so a held event costs one timer, not
a poll every few ms. If no tick has been read for ``stale_after_ms`` (the control plane is down or
being deployed), held events are released with the configs already read -- the documented
degraded mode, counted and logged -- so existing endpoints keep receiving events while no endpoint
can be created anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from core import ordering, schema_check
from core.operational_events import is_operational
from core.records import EndpointConfig, EndpointStatus, EventRecord, delivery_id_for


def filter_accepts(filters: Iterable[str], event_type: str) -> bool:
    for f in filters:
        if f == "*" and is_operational(event_type):
            # The platform's operational events: ``*`` does not include them, an endpoint asks
            # for them by name or prefix -- existing receivers never get types they never saw.
            continue
        if f == "*" or f == event_type:
            return True
        if f.endswith(".*") and event_type.startswith(f[:-1]) and len(event_type) > len(f) - 1:
            return True
    return False


def filter_covered(f: str, allowed: Iterable[str]) -> bool:
    """Whether an endpoint filter ``f`` can only ever match event types the tenant's allow-list
    permits (subscription authorisation): ``*`` needs ``*``; a prefix needs an equal or wider
    prefix; an exact type needs a filter of the allow-list that accepts it. Operational events
    (``webhooks.*``) are about the tenant's own endpoints: always allowed."""
    if is_operational(f):
        return True
    for a in allowed:
        if a == "*" or a == f:
            return True
        if f == "*" or not a.endswith(".*"):
            continue
        if f.endswith(".*"):
            if f[:-1].startswith(a[:-1]):
                return True
        elif filter_accepts((a,), f):
            return True
    return False


def select_endpoints(event: EventRecord, configs: Iterable[EndpointConfig]) -> list[EndpointConfig]:
    """The endpoints this event goes to, in a stable order (by endpoint_id)."""
    chosen = []
    for c in configs:
        if c.tenant_id != event.tenant_id:
            continue
        # An endpoint awaiting its ownership challenge gets the control plane's targeted events
        # only (the challenge): nothing it subscribed to reaches it before it is verified.
        targeted_ok = event.target_endpoint_id is not None and c.status is EndpointStatus.PENDING_VERIFICATION
        if c.status is not EndpointStatus.ACTIVE and not targeted_ok:
            continue
        if event.target_endpoint_id is not None:
            if c.endpoint_id == event.target_endpoint_id:
                chosen.append(c)
        elif filter_accepts(c.event_types, event.event_type):
            chosen.append(c)
    return sorted(chosen, key=lambda c: c.endpoint_id)


def newer(current: EndpointConfig | None, incoming: EndpointConfig) -> bool:
    """Configs can be re-published (republisher, replays of the topic): keep the highest version."""
    return current is None or incoming.config_version >= current.config_version


def tick_covers(horizon_ms: int | None, arrived_at_ms: int, skew_ms: int) -> bool:
    """Whether every config acknowledged before this arrival has been read (see the module doc)."""
    return horizon_ms is not None and arrived_at_ms < horizon_ms - skew_ms


RELEASE = "release"  # a tick covers the event: every config acknowledged before it has been read
DEGRADED = "degraded"  # no tick for stale_after_ms: released with the configs already read
HOLD = "hold"


@dataclass(frozen=True)
class ClockDecision:
    verdict: str  # RELEASE, DEGRADED or HOLD
    recheck_at_ms: int | None = None  # HOLD: when to look again (local time)


_RELEASED = ClockDecision(RELEASE)  # the hot path's answer: one shared object, no allocation


@dataclass
class ClockFollower:
    """Fan-out's view of the config clock: the horizon (largest tick value + lease read), when
    (local time) the newest tick was read, and the observed spacing of ticks, from which it
    predicts when a held event can go.

    Ticks are read at roughly ``read_at + k * period`` with horizons ``horizon + k * period``; the
    first tick whose horizon passes an event's arrival (plus the skew) is predicted from the last
    one read. A late tick only costs a short recheck (``period / 8``); the prediction never
    reaches past the moment the clock would be declared stale, so the degraded release is on time.
    """

    interval_hint_ms: int  # the control plane's configured tick interval, until ticks are seen
    skew_ms: int  # taken off the horizon: control-plane clocks ahead of the events' Kafka time
    stale_after_ms: int
    started_at_ms: int  # local time the operator (re)started: a restored clock is not fresh
    horizon_ms: int | None = None
    value_ms: int | None = None  # newest tick value read in this run: its cadence and liveness
    read_at_ms: int | None = None
    period_ms: float = field(init=False)

    def __post_init__(self) -> None:
        self.period_ms = float(self.interval_hint_ms)

    def observe(self, value_ms: int, lease_ms: int, now_ms: int) -> bool:
        """A tick was read; returns False for a tick that does not move the clock."""
        if self.value_ms is not None and value_ms <= self.value_ms:
            return False
        if self.value_ms is not None:  # two ticks read in this run
            # Spacing of the values (the control plane's cadence), smoothed; a tick held back
            # by an unpublished config shows up as one long step and is mostly ignored.
            step = min(value_ms - self.value_ms, 4 * self.interval_hint_ms)
            self.period_ms = max(1.0, 0.8 * self.period_ms + 0.2 * step)
        self.value_ms = value_ms
        self.read_at_ms = now_ms
        # A tick's promise outlives it (a config not before a later tick is not before this one
        # either): the horizon never goes back, even for a replica configured with a shorter lease.
        horizon = value_ms + lease_ms
        if self.horizon_ms is None or horizon > self.horizon_ms:
            self.horizon_ms = horizon
        return True

    def restored(self, horizon_ms: int | None) -> None:
        """The horizon a checkpoint kept, consistent with the configs it kept; when its tick was
        read is unknown (counts as at start)."""
        if horizon_ms is not None and (self.horizon_ms is None or horizon_ms > self.horizon_ms):
            self.horizon_ms = horizon_ms

    @property
    def _last_read_ms(self) -> int:
        """When the last tick was read (the start if none was read in this run)."""
        return self.read_at_ms if self.read_at_ms is not None else self.started_at_ms

    def age_ms(self, now_ms: int) -> int:
        """Time since the last tick was read (since start if none was read in this run)."""
        return max(0, now_ms - self._last_read_ms)

    def decide(self, arrived_ms: int, now_ms: int) -> ClockDecision:
        horizon = self.horizon_ms
        if tick_covers(horizon, arrived_ms, self.skew_ms):
            return _RELEASED
        stale_at = self._last_read_ms + self.stale_after_ms
        if now_ms >= stale_at:
            return ClockDecision(DEGRADED)
        step = max(1, int(self.period_ms / 8))
        if horizon is None or self.read_at_ms is None:
            predicted = now_ms + int(self.period_ms)
        else:
            needed = arrived_ms + self.skew_ms + 1  # the first horizon that covers the event
            lag = self.read_at_ms - horizon  # horizon -> read delay (negative by about the lease)
            ticks = -(-(needed - horizon) // max(1, int(self.period_ms)))  # ceil
            predicted = max(self.read_at_ms + ticks * int(self.period_ms), needed + lag)
            if predicted <= now_ms:  # the predicted tick is late: look again shortly
                predicted = now_ms + step
        return ClockDecision(HOLD, min(predicted + 1, stale_at))


@dataclass(frozen=True)
class NewDelivery:
    """One logical delivery, created once per (event, endpoint) by fan-out."""

    delivery_id: str
    event: EventRecord
    endpoint_id: str
    tenant_id: str
    endpoint_config_version: int
    created_at_ms: int
    expires_at_ms: int
    # The event's ordering key for this endpoint (core.ordering; "" = not ordered), decided here
    # with the config version the delivery was fanned out with.
    ordering_key: str = ""
    # The W3C traceparent its attempts continue (core.trace_context.begin): fan-out's span when
    # tracing recorded one, else the event's own as it came; None: no trace.
    trace: str | None = None


def deliveries_for(
    event: EventRecord, endpoints: list[EndpointConfig], created_at_ms: int, deadline_ms: int,
    trace: str | None = None,
) -> list[NewDelivery]:
    """created_at is the event's arrival time on the CDC topic (its Kafka timestamp), so a
    re-processed record yields identical delivery rows, deadline included. ``trace``: the
    traceparent the deliveries' attempts continue (see NewDelivery.trace)."""
    return [
        NewDelivery(
            delivery_id=delivery_id_for(event.event_id, c.endpoint_id),
            event=event,
            endpoint_id=c.endpoint_id,
            tenant_id=c.tenant_id,
            endpoint_config_version=c.config_version,
            created_at_ms=created_at_ms,
            expires_at_ms=created_at_ms + deadline_ms,
            ordering_key=ordering.key_for(c.ordering_key, event.object_id, event.payload),
            trace=trace,
        )
        for c in endpoints
    ]


# ---- the durable record of what fan-out decided ---------------------------------------------------

# A snapshot row lives in partition (UTC hour of arrival, bucket): an hour of the brief's peak
# (~5,800 events/s, ~21 M events) is spread over this many partitions so none grows past ~1.3 M
# rows, and reconciliation reads a window as hours x buckets range queries.
SNAPSHOT_BUCKETS = 16
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class SkippedDelivery:
    """An endpoint whose filter matched the event but which is pinned to other schema majors: it
    is not sent the event, and its history lists the pair as ``skipped`` with this reason (under
    the id a delivery would have had), so the event is never silently missing there."""

    delivery_id: str
    endpoint_id: str
    endpoint_config_version: int
    event_type: str
    reason: str


def leave_out_pinned(event: EventRecord, matched: Iterable[EndpointConfig],
                     pins: Callable[[str], tuple[int, ...]]) -> tuple[list[EndpointConfig], list[SkippedDelivery]]:
    """Split the matched endpoints into those sent the event and those skipped because their schema
    pins (``pins(endpoint_id)``, empty: any major) do not accept its major."""
    chosen: list[EndpointConfig] = []
    skipped: list[SkippedDelivery] = []
    for c in matched:
        reason = schema_check.skip_reason(pins(c.endpoint_id), event)
        if reason:
            skipped.append(SkippedDelivery(delivery_id_for(event.event_id, c.endpoint_id), c.endpoint_id,
                                           c.config_version, event.event_type, reason))
        else:
            chosen.append(c)
    return chosen, skipped


@dataclass(frozen=True)
class FanoutSnapshot:
    """What fan-out decided for one ingested event: the endpoints (with the config version it
    matched) it created deliveries for -- empty means "no subscriber", which is an answer, not a
    gap. Reconciliation compares deliveries against this, never against today's mutable configs.

    ``skipped`` travels with the snapshot to the writer of its row, which writes each skipped
    pair's history rows in the same batch (the snapshot row itself does not name them: no delivery
    is expected for them, so reconciliation sees neither a gap nor a missing delivery)."""

    event_id: str
    tenant_id: str
    arrived_at_ms: int
    endpoints: tuple[tuple[str, int], ...]  # (endpoint_id, endpoint_config_version), sorted
    degraded: bool = False  # released without the config clock (see ClockFollower)
    skipped: tuple[SkippedDelivery, ...] = ()

    @property
    def partition(self) -> tuple[int, int]:
        return snapshot_partition(self.event_id, self.arrived_at_ms)

    def delivery_ids(self) -> dict[str, str]:
        """delivery_id -> endpoint_id of every delivery this decision expects."""
        return {delivery_id_for(self.event_id, e): e for e, _ in self.endpoints}


def snapshot_partition(event_id: str, arrived_at_ms: int) -> tuple[int, int]:
    """(hour start in ms, bucket): stable across processes (not Python's salted hash())."""
    bucket = int(delivery_id_for(event_id, "")[4:12], 16) % SNAPSHOT_BUCKETS
    return arrived_at_ms // HOUR_MS * HOUR_MS, bucket


def snapshot_for(event: EventRecord, chosen: Iterable[EndpointConfig], arrived_at_ms: int,
                 degraded: bool = False, skipped: Iterable[SkippedDelivery] = ()) -> FanoutSnapshot:
    return FanoutSnapshot(event.event_id, event.tenant_id, arrived_at_ms,
                          tuple(sorted((c.endpoint_id, c.config_version) for c in chosen)), degraded,
                          tuple(sorted(skipped, key=lambda s: s.endpoint_id)))
