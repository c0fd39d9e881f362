"""The control plane's operational events: signals become events, the no-loop rule, ids that make
a re-read signal or a re-run sweep a duplicate, auto-disable with warnings and dry-run, enabling
resets the count. In memory, with an injected clock."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from control_plane import errors
from control_plane.cli import main as cli
from control_plane.cli import operations_cli
from control_plane.domain import DeliveryStatus
from control_plane.endpoints.operational_events import OperationalEvents
from control_plane.endpoints.operational_store import InMemoryOperationalStore
from control_plane.publishing.publisher import PublishError
from control_plane.rpc.operations_servicer import OperationsServicer
from core import operational_events as ops
from core.records import EndpointSignal, EndpointStatus, EventRecord
from protogen.webhooks.v1 import operations_pb2 as opb
from tests.unit.control_plane.catalog.test_catalog_publication import ADMIN as CATALOG_ADMIN
from tests.unit.control_plane.catalog.test_catalog_publication import world as catalog_world
from tests.unit.control_plane.endpoints.test_control_plane_service import (  # noqa: F401 (fixture w)
    ALICE,
    World,
    add_delivery,
    create,
    w,
)

HOUR_MS = 3600 * 1000


class Ops:
    def __init__(self, world: World) -> None:
        self.w = world
        self.store = InMemoryOperationalStore()
        self.events = OperationalEvents(self.store, world.store, world.publisher, world.clock,  # type: ignore[arg-type]
                                        history=world.store)  # type: ignore[arg-type]
        self.events.bind(world.endpoints.auto_disable, world.endpoints.disable_gone)
        world.endpoints.listen(self.events)

    def emitted(self) -> list[EventRecord]:
        return [e for e in self.w.publisher.events if ops.is_operational(e.event_type)]

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(e.payload) for e in self.emitted()]

    def signal(self, endpoint_id: str, kind: str, seq: int = 1, event_type: str = "invoice.paid",
               version: int = 1, **kw: Any) -> None:
        self.events.on_signal(EndpointSignal(endpoint_id=endpoint_id, tenant_id=ALICE.tenant_id,
                                             config_version=version, signal=kind, detail=kw.pop("detail", "x"),
                                             at_ms=self.w.clock.now, event_type=event_type, sequence=seq, **kw))

    def advance(self, ms: int) -> None:
        self.w.clock.now += ms
        self.events.sweep()


@pytest.fixture
def o(w: World) -> Ops:  # noqa: F811
    return Ops(w)


def test_a_failing_episode_and_its_recovery_are_events_with_ids_of_the_episode(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.signal(ep, ops.SIGNAL_FAILING, seq=3)
    o.signal(ep, ops.SIGNAL_FAILING, seq=3)  # read again after a crash: the same event, not another
    o.signal(ep, ops.SIGNAL_RECOVERED, seq=3)
    types = [(e.event_type, e.event_id) for e in o.emitted()]
    assert types == [(ops.ENDPOINT_FAILING, ops.event_id(ep, "failing", "3")),
                     (ops.ENDPOINT_RECOVERED, ops.event_id(ep, "recovered", "3"))]
    failing = o.bodies()[0]
    assert (failing["tenant_id"], failing["endpoint_id"], failing["data"]["reason"]) == (
        ALICE.tenant_id, ep, ops.BREAKER_OPENED)
    assert o.store.get_clock(ALICE.tenant_id, ep) is None  # a success ends the clock


def test_a_restarted_job_re_emitting_a_signal_gives_the_same_event_id(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.signal(ep, ops.SIGNAL_EXHAUSTED, delivery_id="dlv_9", event_id="evt_9", http_status=503, attempts=4,
             detail="expired")
    o.signal(ep, ops.SIGNAL_EXHAUSTED, delivery_id="dlv_9", event_id="evt_9", http_status=503, attempts=4,
             detail="expired")
    ids = {e.event_id for e in o.emitted()}
    assert len(o.emitted()) == 2 and len(ids) == 1  # fan-out's dedupe by event id keeps one
    assert o.bodies()[0]["data"] == {"delivery_id": "dlv_9", "event_id": "evt_9", "event_type": "invoice.paid",
                                     "outcome": "expired", "last_status": 503, "attempts": 4}


def test_a_410_disables_with_reason_gone(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.signal(ep, ops.SIGNAL_GONE, version=1, detail="receiver answered 410 Gone for delivery dlv_1")
    assert o.w.store.get_endpoint(ALICE.tenant_id, ep).status is EndpointStatus.DISABLED  # type: ignore[union-attr]
    (body,) = o.bodies()
    assert body["type"] == ops.ENDPOINT_DISABLED and body["data"]["reason"] == ops.GONE
    o.signal(ep, ops.SIGNAL_GONE, version=1)  # read again: already disabled, nothing more
    assert len(o.emitted()) == 1


@pytest.mark.parametrize("kind", [ops.SIGNAL_FAILING, ops.SIGNAL_EXHAUSTED, ops.SIGNAL_GONE])
def test_no_event_about_a_delivery_of_an_operational_event(o: Ops, kind: str) -> None:
    ep = create(o.w, event_types=("webhooks.*",)).endpoint_id
    o.signal(ep, kind, event_type=ops.ENDPOINT_FAILING, delivery_id="dlv_1")
    assert o.emitted() == []


def test_an_operations_endpoint_failing_for_its_window_is_disabled_without_a_word(o: Ops) -> None:
    ep = create(o.w, event_types=("webhooks.*",)).endpoint_id
    o.store.set_policy(ALICE.tenant_id, ops.AutoDisablePolicy(window_s=100), "key_a", 0)
    o.signal(ep, ops.SIGNAL_FAILING, event_type=ops.DELIVERY_EXHAUSTED)
    for _ in range(12):
        o.advance(10_000)
    assert o.w.store.get_endpoint(ALICE.tenant_id, ep).status is EndpointStatus.DISABLED  # type: ignore[union-attr]
    assert o.emitted() == []


def test_auto_disable_warns_at_its_shares_then_disables_with_reason(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.store.set_policy(ALICE.tenant_id, ops.AutoDisablePolicy(window_s=100, warn_at=(0.5, 0.9)), "key_a", 0)
    o.signal(ep, ops.SIGNAL_FAILING)
    for _ in range(12):
        o.advance(10_000)
    o.advance(10_000)  # a sweep after the end: nothing more
    got = [(b["type"], b["data"].get("reason"), b["data"].get("share")) for b in o.bodies()]
    assert got == [(ops.ENDPOINT_FAILING, ops.BREAKER_OPENED, None),
                   (ops.ENDPOINT_FAILING, ops.AUTO_DISABLE_WARNING, 0.5),
                   (ops.ENDPOINT_FAILING, ops.AUTO_DISABLE_WARNING, 0.9),
                   (ops.ENDPOINT_DISABLED, ops.AUTO_DISABLED, None)]
    endpoint = o.w.store.get_endpoint(ALICE.tenant_id, ep)
    assert endpoint is not None and endpoint.status is EndpointStatus.DISABLED
    assert endpoint.change.startswith("disable: auto_disabled") and endpoint.changed_by == "auto-disable"


def test_a_sweep_run_again_after_a_crash_publishes_the_same_ids(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.store.set_policy(ALICE.tenant_id, ops.AutoDisablePolicy(window_s=100, warn_at=(0.5,)), "key_a", 0)
    o.signal(ep, ops.SIGNAL_FAILING)
    clock = o.store.get_clock(ALICE.tenant_id, ep)
    o.advance(60_000)
    o.store.put_clock(clock)  # type: ignore[arg-type]  # the clock's write was lost: the sweep runs again
    o.events.sweep()
    warnings = [e.event_id for e in o.emitted() if json.loads(e.payload)["data"]["reason"] == ops.AUTO_DISABLE_WARNING]
    assert len(warnings) == 2 and len(set(warnings)) == 1


def test_dry_run_only_warns(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.store.set_policy(ALICE.tenant_id, ops.AutoDisablePolicy(window_s=100, warn_at=(0.5,), dry_run=True), "k", 0)
    o.signal(ep, ops.SIGNAL_FAILING)
    for _ in range(15):
        o.advance(10_000)
    assert o.w.store.get_endpoint(ALICE.tenant_id, ep).status is EndpointStatus.ACTIVE  # type: ignore[union-attr]
    got = [(b["type"], b["data"]["reason"], b["data"].get("dry_run")) for b in o.bodies()]
    assert got == [(ops.ENDPOINT_FAILING, ops.BREAKER_OPENED, None),
                   (ops.ENDPOINT_FAILING, ops.AUTO_DISABLE_WARNING, True),
                   (ops.ENDPOINT_FAILING, ops.AUTO_DISABLE_DRY_RUN, True)]


def test_enabling_again_resets_the_count(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.store.set_policy(ALICE.tenant_id, ops.AutoDisablePolicy(window_s=100, warn_at=(0.5,)), "key_a", 0)
    o.signal(ep, ops.SIGNAL_FAILING)
    for _ in range(11):
        o.advance(10_000)
    assert o.w.store.get_endpoint(ALICE.tenant_id, ep).status is EndpointStatus.DISABLED  # type: ignore[union-attr]
    o.w.endpoints.set_enabled(ALICE, ep, True)
    enabled_at = o.w.clock.now
    clock = o.store.get_clock(ALICE.tenant_id, ep)
    assert clock is not None and (clock.since_ms, clock.warned, clock.ended) == (enabled_at, 0, False)
    o.advance(40_000)
    assert o.w.store.get_endpoint(ALICE.tenant_id, ep).status is EndpointStatus.ACTIVE  # type: ignore[union-attr]
    for _ in range(7):
        o.advance(10_000)  # still failing a whole window after the enable: disabled again
    assert o.w.store.get_endpoint(ALICE.tenant_id, ep).status is EndpointStatus.DISABLED  # type: ignore[union-attr]
    disabled = [e.event_id for e in o.emitted() if e.event_type == ops.ENDPOINT_DISABLED]
    assert len(set(disabled)) == 2  # two auto-disables, two events
    assert ops.ENDPOINT_ENABLED in [e.event_type for e in o.emitted()]


def test_a_recovery_before_the_window_ends_stops_the_clock(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.store.set_policy(ALICE.tenant_id, ops.AutoDisablePolicy(window_s=100), "key_a", 0)
    o.signal(ep, ops.SIGNAL_FAILING)
    o.advance(60_000)
    o.signal(ep, ops.SIGNAL_RECOVERED)
    o.advance(HOUR_MS)
    assert o.w.store.get_endpoint(ALICE.tenant_id, ep).status is EndpointStatus.ACTIVE  # type: ignore[union-attr]


def test_a_person_s_disable_enable_and_rotation_are_events(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.w.endpoints.set_enabled(ALICE, ep, False)
    o.w.endpoints.set_enabled(ALICE, ep, False)  # no change: no event
    o.w.endpoints.set_enabled(ALICE, ep, True)
    o.w.endpoints.rotate_secret(ALICE, ep, revoke_immediately=False, overlap_s=0)
    got = [(b["type"], b["data"]) for b in o.bodies()]
    assert got == [(ops.ENDPOINT_DISABLED, {"reason": ops.OPERATOR, "detail": "disabled by key_a",
                                            "config_version": 2}),
                   (ops.ENDPOINT_ENABLED, {"by": "key_a", "config_version": 3}),
                   (ops.SECRET_ROTATED, {"key_version": 2, "config_version": 4})]


def test_a_failed_publish_of_a_signal_s_event_raises_so_the_signal_is_read_again(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.w.publisher.failing = True
    with pytest.raises(PublishError):
        o.signal(ep, ops.SIGNAL_FAILING)
    assert o.store.get_clock(ALICE.tenant_id, ep) is None  # nothing recorded: the retry does it all
    o.w.publisher.failing = False
    o.signal(ep, ops.SIGNAL_FAILING)
    assert o.store.get_clock(ALICE.tenant_id, ep) is not None and len(o.emitted()) == 1


@pytest.mark.parametrize("name", ["webhooks.endpoint.failing", "webhooks.mine"])
def test_tenants_cannot_create_types_under_the_reserved_prefix(name: str) -> None:
    with pytest.raises(errors.InvalidArgument, match="reserved for the platform's operational events"):
        catalog_world().service.create_type(CATALOG_ADMIN, name, "", "", "")


# -- the tenant's setting: service, gRPC servicer, CLI -------------------------------------------

class _Auth:
    def __init__(self, principal: Any) -> None:
        self.principal = principal

    def tenant(self, metadata: Any) -> Any:
        return self.principal


class _Context:
    def invocation_metadata(self) -> tuple[()]:
        return ()

    def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def test_the_setting_is_per_tenant_with_defaults_and_validated(o: Ops) -> None:
    assert o.events.auto_disable_setting(ALICE).updated_at_ms is None
    got = o.events.set_auto_disable(ALICE, off=False, window_s=3600, warn_at=(), dry_run=True)
    assert got.policy == ops.AutoDisablePolicy(window_s=3600, dry_run=True) and got.updated_by == ALICE.key_id
    with pytest.raises(errors.InvalidArgument, match="increasing"):
        o.events.set_auto_disable(ALICE, off=False, window_s=0, warn_at=(0.9, 0.5), dry_run=False)
    with pytest.raises(errors.PermissionDenied):
        o.events.set_auto_disable(replace(ALICE, read_only=True), off=True, window_s=0, warn_at=(), dry_run=False)


def test_the_servicer_converts_and_lists_the_operational_types(o: Ops) -> None:
    servicer = OperationsServicer(_Auth(ALICE), o.events)  # type: ignore[arg-type]
    got = servicer.SetAutoDisable(opb.SetAutoDisableRequest(window_seconds=120, warn_at=[0.5]), _Context())
    assert (got.off, got.window_seconds, list(got.warn_at), got.dry_run, got.is_default) == (False, 120, [0.5],
                                                                                            False, False)
    types = servicer.ListOperationalEventTypes(opb.ListOperationalEventTypesRequest(), _Context()).types
    assert [t.name for t in types] == sorted(ops.CATALOG)
    assert all(json.loads(t.example_json)["type"] == t.name and json.loads(t.schema_json) for t in types)


@pytest.mark.parametrize(("argv", "method", "fields"), [
    (["auto-disable"], "GetAutoDisable", {}),
    (["auto-disable", "--window", "2d", "--warn-at", "0.5,0.9"], "SetAutoDisable",
     {"window_seconds": 172800, "warn_at": [0.5, 0.9], "dry_run": False, "off": False}),
    (["auto-disable", "--dry-run"], "SetAutoDisable", {"dry_run": True, "window_seconds": 0}),
    (["auto-disable", "--off"], "SetAutoDisable", {"off": True}),
    (["types"], "ListOperationalEventTypes", {}),
])
def test_the_cli_maps_options_to_requests(argv: list[str], method: str, fields: dict[str, Any]) -> None:
    calls: list[tuple[str, Any]] = []

    class Stub:
        def __getattr__(self, name: str) -> Any:
            def call(request: Any) -> Any:
                calls.append((name, request))
                return request
            return call

    operations_cli.run(cli.parser().parse_args(["operations", *argv]), Stub())
    [(called, request)] = calls
    assert called == method
    assert {k: (list(v) if k == "warn_at" else v) for k, v in ((k, getattr(request, k)) for k in fields)} == fields


def test_the_cli_renders_the_setting() -> None:
    text = operations_cli.render(opb.AutoDisable(window_seconds=432000, warn_at=[0.5, 0.7], is_default=True))
    assert text == "auto-disable: window 432000 s, warnings at 50 %, 70 % (default)"
    assert "off" in operations_cli.render(opb.AutoDisable(off=True))


def test_a_job_started_afresh_counting_episodes_from_one_again_still_ends_and_starts_clocks(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.signal(ep, ops.SIGNAL_FAILING, seq=5)
    o.signal(ep, ops.SIGNAL_RECOVERED, seq=1)  # a redeployed job without state: its episode 1
    assert o.store.get_clock(ALICE.tenant_id, ep) is None
    o.signal(ep, ops.SIGNAL_FAILING, seq=5)
    o.signal(ep, ops.SIGNAL_FAILING, seq=1)
    clock = o.store.get_clock(ALICE.tenant_id, ep)
    assert clock is not None and clock.episode == 1


def test_the_control_plane_proves_its_operational_events_to_the_job(w: World) -> None:  # noqa: F811
    from core import target_proof
    from core.ingest import check_target, parse_event

    key = target_proof.target_key(b"k" * 32)
    events = OperationalEvents(InMemoryOperationalStore(), w.store, w.publisher, w.clock, key)  # type: ignore[arg-type]
    events.bind(w.endpoints.auto_disable, w.endpoints.disable_gone)
    ep = create(w).endpoint_id
    events.on_signal(EndpointSignal(ep, ALICE.tenant_id, 1, ops.SIGNAL_FAILING, "x", w.clock.now, sequence=1))
    (event,) = [e for e in w.publisher.events if ops.is_operational(e.event_type)]
    check_target(parse_event(event.to_json(), 1 << 20), [key])  # what the job's parse stage does


def test_the_tenant_catalog_shows_and_exports_the_operational_types_it_cannot_change() -> None:
    cw = catalog_world()
    entry = cw.service.get_type(CATALOG_ADMIN, ops.ENDPOINT_FAILING)
    assert (entry.group, entry.updated_by, str(entry.versions[0].version)) == ("operations", "platform", "1.0")
    with pytest.raises(errors.NotFound):
        cw.service.get_type(CATALOG_ADMIN, "webhooks.nope")
    exported = json.loads(cw.service.export(CATALOG_ADMIN, "openapi"))
    assert f"{ops.DELIVERY_EXHAUSTED}.v1.0" in exported["webhooks"]


def test_a_success_in_the_history_since_the_clock_started_prevents_the_disable(o: Ops) -> None:
    e = create(o.w)
    o.store.set_policy(ALICE.tenant_id, ops.AutoDisablePolicy(window_s=100, warn_at=(0.5,)), "key_a", 0)
    o.signal(e.endpoint_id, ops.SIGNAL_FAILING)  # and then its recovery's signal is lost
    o.advance(60_000)
    add_delivery(o.w, e, 1, DeliveryStatus.SUCCEEDED)  # created and succeeded after the opening
    o.advance(60_000)
    assert o.w.store.get_endpoint(ALICE.tenant_id, e.endpoint_id).status is EndpointStatus.ACTIVE  # type: ignore[union-attr]
    assert o.store.get_clock(ALICE.tenant_id, e.endpoint_id) is None
    assert ops.ENDPOINT_DISABLED not in [x.event_type for x in o.emitted()]


def test_a_success_before_the_clock_started_does_not(o: Ops) -> None:
    e = create(o.w)
    add_delivery(o.w, e, 1, DeliveryStatus.SUCCEEDED)
    o.w.clock.now += 1_000
    o.store.set_policy(ALICE.tenant_id, ops.AutoDisablePolicy(window_s=100, warn_at=(0.5,)), "key_a", 0)
    o.signal(e.endpoint_id, ops.SIGNAL_FAILING)
    for _ in range(11):
        o.advance(10_000)
    assert o.w.store.get_endpoint(ALICE.tenant_id, e.endpoint_id).status is EndpointStatus.DISABLED  # type: ignore[union-attr]


def test_an_endpoint_a_person_disabled_gets_no_warnings_until_enabled_again(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.store.set_policy(ALICE.tenant_id, ops.AutoDisablePolicy(window_s=100, warn_at=(0.5,)), "key_a", 0)
    o.signal(ep, ops.SIGNAL_FAILING)
    o.w.endpoints.set_enabled(ALICE, ep, False)
    for _ in range(12):
        o.advance(10_000)
    assert [b["data"].get("reason") for b in o.bodies() if b["type"] == ops.ENDPOINT_FAILING] == [ops.BREAKER_OPENED]
    o.w.endpoints.set_enabled(ALICE, ep, True)
    for _ in range(6):
        o.advance(10_000)
    assert [b["data"].get("reason") for b in o.bodies() if b["type"] == ops.ENDPOINT_FAILING] == [
        ops.BREAKER_OPENED, ops.AUTO_DISABLE_WARNING]


def test_a_person_s_enable_succeeds_while_the_clock_cannot_be_written(o: Ops) -> None:
    ep = create(o.w).endpoint_id
    o.w.endpoints.set_enabled(ALICE, ep, False)

    def down(*_: object) -> None:
        raise errors.Unavailable("Cassandra down")

    o.store.get_clock = down  # type: ignore[assignment,method-assign]
    assert o.w.endpoints.set_enabled(ALICE, ep, True).status is EndpointStatus.ACTIVE
    assert ops.ENDPOINT_ENABLED in [e.event_type for e in o.emitted()]
