"""Fan-out, keyed by event_id: drop duplicate events, wait for the config clock, then create one
delivery per matching endpoint. A thin adapter over :mod:`core.fanout`."""

from __future__ import annotations

from pyflink.common import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream.functions import KeyedBroadcastProcessFunction, RuntimeContext
from pyflink.datastream.state import StateTtlConfig, ValueStateDescriptor

from core import fanout
from core.records import CLOCK_KEY, ConfigClock, EndpointConfig, EventRecord
from operators.dispatcher import NEW
from operators.endpoint_configs import ENDPOINT_CONFIGS

# How often a held event re-checks the config clock.
_HOLD_RECHECK_MS = 20


class FanOut(KeyedBroadcastProcessFunction):
    def __init__(self, dedupe_ttl_s: int, deadline_s: float) -> None:
        self._ttl_s = dedupe_ttl_s
        self._deadline_ms = int(deadline_s * 1000)

    def open(self, runtime_context: RuntimeContext) -> None:
        seen = ValueStateDescriptor("seen", Types.BOOLEAN())
        # Remember event_ids longer than any replay window of the CDC topic: the relay may
        # publish twice, and a re-read topic must not fan out again.
        # Cleanup is incremental on state access: PyFlink's default background cleanup builds a
        # java Duration through the client gateway, which does not exist inside a TaskManager.
        seen.enable_time_to_live(
            StateTtlConfig.new_builder(Time.seconds(self._ttl_s))
            .disable_cleanup_in_background()
            .cleanup_incrementally(10, False)
            .build())
        self._seen = runtime_context.get_state(seen)
        self._held = runtime_context.get_state(ValueStateDescriptor("held", Types.PICKLED_BYTE_ARRAY()))
        # In-memory mirror of the broadcast state, by tenant, so matching an event reads only its
        # tenant's endpoints. Rebuilt from the broadcast state on first use after a (re)start.
        self._by_tenant: dict[str, dict[str, EndpointConfig]] | None = None
        self._clock: int | None = None
        m = runtime_context.get_metrics_group()
        self._duplicates = m.counter("duplicate_events_dropped")
        self._deliveries = m.counter("deliveries_created")
        self._unmatched = m.counter("events_without_endpoints")

    def process_broadcast_element(self, value, ctx):  # type: ignore[override]
        state = ctx.get_broadcast_state(ENDPOINT_CONFIGS)
        if isinstance(value, ConfigClock):
            current = state.get(CLOCK_KEY)
            if current is None or value.published_at_ms > current:
                state.put(CLOCK_KEY, value.published_at_ms)
                self._clock = value.published_at_ms
        elif isinstance(value, EndpointConfig) and fanout.newer(state.get(value.endpoint_id), value):
            state.put(value.endpoint_id, value)
            if self._by_tenant is not None:
                self._by_tenant.setdefault(value.tenant_id, {})[value.endpoint_id] = value

    def _tenant_configs(self, state, tenant_id: str) -> list[EndpointConfig]:
        if self._by_tenant is None:
            index: dict[str, dict[str, EndpointConfig]] = {}
            for key, cfg in state.items():
                if key != CLOCK_KEY:
                    index.setdefault(cfg.tenant_id, {})[key] = cfg
            self._by_tenant = index
        return list(self._by_tenant.get(tenant_id, {}).values())

    def _config_clock(self, state) -> int | None:
        if self._clock is None:
            self._clock = state.get(CLOCK_KEY)
        return self._clock

    def process_element(self, value, ctx):  # type: ignore[override]
        _, (event, arrived_ms) = value
        if self._seen.value():
            self._duplicates.inc()
            return
        self._seen.update(True)
        yield from self._release_or_hold(event, arrived_ms, ctx)

    def on_timer(self, timestamp, ctx):  # type: ignore[override]
        held = self._held.value()
        if held is None:
            return
        self._held.clear()
        yield from self._release_or_hold(held[0], held[1], ctx)

    def _release_or_hold(self, event: EventRecord, arrived_ms: int, ctx):
        state = ctx.get_broadcast_state(ENDPOINT_CONFIGS)
        if not fanout.clock_passed(self._config_clock(state), arrived_ms):
            self._held.update((event, arrived_ms))
            now = ctx.timer_service().current_processing_time()
            ctx.timer_service().register_processing_time_timer(now + _HOLD_RECHECK_MS)
            return
        chosen = fanout.select_endpoints(event, self._tenant_configs(state, event.tenant_id))
        if not chosen:
            self._unmatched.inc()
        for d in fanout.deliveries_for(event, chosen, arrived_ms, self._deadline_ms):
            self._deliveries.inc()
            yield d.endpoint_id, (NEW, d)
