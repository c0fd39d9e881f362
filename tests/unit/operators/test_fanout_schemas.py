"""operators/fanout.py with the event-type catalog, driven directly (fake Flink state, metrics and
contexts; no cluster): refused events become dead letters and reach no endpoint, warn lets them
through counted, pinned endpoints are left out of events of other majors. The job on the real
stack: tests/integration/test_catalog_fanout.py."""

from __future__ import annotations

import json
import time
from typing import Any

from core.records import (
    CatalogSettingsRecord,
    CatalogTypeRecord,
    ConfigClock,
    EndpointConfig,
    EndpointStatus,
    EventRecord,
    SchemaPinsRecord,
    delivery_id_for,
)
from operators.dispatch_input import NEW, SNAPSHOT
from operators.fanout import FanOut
from operators.parse_events import DEAD_LETTERS

SCHEMA = {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def inc(self, n: int = 1) -> None:
        self.count += n

    def dec(self, n: int = 1) -> None:
        self.count -= n


class Group:
    def __init__(self) -> None:
        self.counters: dict[str, Counter] = {}

    def counter(self, name: str) -> Counter:
        return self.counters.setdefault(name, Counter())

    def add_group(self, _key: str, _value: str) -> Group:
        return Group()


CURRENT_KEY = [""]  # the key Flink would have set before calling the keyed function


class ValueState:
    """Keyed: one value per CURRENT_KEY, as Flink's keyed state."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def value(self) -> Any:
        return self.values.get(CURRENT_KEY[0])

    def update(self, v: Any) -> None:
        self.values[CURRENT_KEY[0]] = v

    def clear(self) -> None:
        self.values.pop(CURRENT_KEY[0], None)


class RuntimeContext:
    def __init__(self) -> None:
        self.group = Group()

    def get_state(self, _descriptor: Any) -> ValueState:
        return ValueState()

    def get_metrics_group(self) -> Group:
        return self.group


class BroadcastState(dict):  # type: ignore[type-arg]
    def put(self, key: str, value: Any) -> None:
        self[key] = value


class Ctx:
    def __init__(self, state: BroadcastState) -> None:
        self.state = state

    def get_broadcast_state(self, _descriptor: Any) -> BroadcastState:
        return self.state


def config(endpoint_id: str) -> EndpointConfig:
    return EndpointConfig(endpoint_id, "acme", 1, "https://127.0.0.1/h", EndpointStatus.ACTIVE, ("invoice.*",), (), 0)


def make() -> tuple[FanOut, RuntimeContext, Ctx]:
    fan = FanOut(3600, 60, 250, 100, 5000, "events")
    rc = RuntimeContext()
    fan.open(rc)  # type: ignore[arg-type]
    ctx = Ctx(BroadcastState())
    now = time.time_ns() // 1_000_000
    for record in (ConfigClock(now, 600_000), config("ep_any"), config("ep_v2"),
                   CatalogTypeRecord("acme", "invoice.paid", "reject", 1, {"1.0": SCHEMA, "2.0": SCHEMA}, 0),
                   CatalogTypeRecord("acme", "invoice.noted", "warn", 1, {"1.0": SCHEMA}, 0),
                   CatalogSettingsRecord("acme", "reject", 0), SchemaPinsRecord("acme", "ep_v2", (2,), 0)):
        list(fan.process_broadcast_element(record, ctx) or ())
    return fan, rc, ctx


def send(fan: FanOut, ctx: Ctx, event_id: str, event_type: str, version: str, payload: object) -> list[Any]:
    ev = EventRecord(event_id, "acme", event_type, version, "", 0, 0, json.dumps(payload).encode())
    CURRENT_KEY[0] = event_id
    return list(fan.process_element((event_id, (ev, time.time_ns() // 1_000_000 - 1000)), ctx))


def deliveries(out: list[Any]) -> list[str]:
    return sorted(row[1][1][1].endpoint_id for row in out if not isinstance(row, tuple) and row[1][1][0] == NEW)


def test_an_invalid_event_is_dead_lettered_with_its_pointer_and_reaches_no_endpoint() -> None:
    fan, rc, ctx = make()
    out = send(fan, ctx, "evt_bad", "invoice.paid", "1", {"amount": "x"})
    [(tag, letter)] = [o for o in out if isinstance(o, tuple)]
    assert tag is DEAD_LETTERS
    doc = json.loads(letter)
    assert (doc["reason"], doc["extra"]["pointer"], doc["extra"]["schema_version"]) == ("schema_invalid", "/amount",
                                                                                       "1.0")
    assert deliveries(out) == []
    [snapshot] = [row[1][1][1] for row in out if not isinstance(row, tuple) and row[1][1][0] == SNAPSHOT]
    assert snapshot.endpoints == ()  # decided: to nobody
    assert rc.group.counters["events_schema_refused"].count == 1
    # The operator keeps going: the next valid event is fanned out.
    assert deliveries(send(fan, ctx, "evt_ok", "invoice.paid", "1", {"amount": 1})) == ["ep_any"]


def test_unknown_types_follow_the_tenants_setting() -> None:
    fan, _rc, ctx = make()
    out = send(fan, ctx, "evt_unknown", "invoice.sent", "1", {"amount": 1})
    assert [json.loads(o[1])["reason"] for o in out if isinstance(o, tuple)] == ["schema_unknown"]
    list(fan.process_broadcast_element(CatalogSettingsRecord("acme", "warn", 1), ctx) or ())
    assert deliveries(send(fan, ctx, "evt_unknown2", "invoice.sent", "2", {"amount": 1})) == ["ep_any", "ep_v2"]


def test_warn_delivers_and_counts() -> None:
    fan, rc, ctx = make()
    out = send(fan, ctx, "evt_warn", "invoice.noted", "1", {"amount": "x"})
    assert deliveries(out) == ["ep_any"] and not [o for o in out if isinstance(o, tuple)]
    assert rc.group.counters["events_schema_invalid_delivered"].count == 1


def test_an_endpoint_pinned_to_major_2_gets_v2_and_not_v1() -> None:
    fan, rc, ctx = make()
    out = send(fan, ctx, "evt_v1", "invoice.paid", "1.0", {"amount": 1})
    assert deliveries(out) == ["ep_any"]
    assert rc.group.counters["skipped_schema_major"].count == 1
    # The skipped pair rides with the snapshot (its writer lists it in ep_v2's history); the
    # snapshot's endpoints, reconciliation's "expected", name only the delivery that exists.
    [snapshot] = [row[1][1][1] for row in out if not isinstance(row, tuple) and row[1][1][0] == SNAPSHOT]
    assert [e for e, _ in snapshot.endpoints] == ["ep_any"]
    assert [(s.delivery_id, s.endpoint_id, s.event_type, s.reason) for s in snapshot.skipped] == [
        (delivery_id_for("evt_v1", "ep_v2"), "ep_v2", "invoice.paid", "schema major 1 not accepted (pinned: 2)")]
    assert deliveries(send(fan, ctx, "evt_v2", "invoice.paid", "2.0", {"amount": 1})) == ["ep_any", "ep_v2"]


def test_the_catalog_is_rebuilt_from_the_broadcast_state_after_a_restart() -> None:
    fan, _rc, ctx = make()
    restarted = FanOut(3600, 60, 250, 100, 5000, "events")
    restarted.open(RuntimeContext())  # type: ignore[arg-type]
    list(restarted.process_broadcast_element(ConfigClock(time.time_ns() // 1_000_000, 600_000), ctx) or ())
    out = send(restarted, ctx, "evt_bad", "invoice.paid", "1", {"amount": "x"})
    assert [json.loads(o[1])["reason"] for o in out if isinstance(o, tuple)] == ["schema_invalid"]


def test_the_broadcast_state_keeps_the_highest_revision_whatever_order_records_come_in() -> None:
    # 1, 2, 3, 2: a retried create racing an add_version, or two replicas, can put a stale
    # revision after a newer one. Revision 3 added version 1.1; the stale 2 must not take it away.
    fan, _rc, ctx = make()
    v1 = {"1.0": SCHEMA}
    v11 = {"1.0": SCHEMA, "1.1": SCHEMA}
    for revision, versions in ((1, v1), (2, v1), (3, v11), (2, v1)):
        list(fan.process_broadcast_element(
            CatalogTypeRecord("acme", "invoice.late", "reject", revision, versions, 0), ctx) or ())
    for revision, majors in ((10, (1,)), (20, (2,)), (10, (1,))):
        list(fan.process_broadcast_element(SchemaPinsRecord("acme", "ep_any", majors, 0, revision), ctx) or ())
    assert ctx.state["__catalog__/acme/invoice.late"].revision == 3
    assert ctx.state["__schema_pins__/ep_any"].revision == 20
    out = send(fan, ctx, "evt_11", "invoice.late", "1.1", {"amount": 1})
    assert [o for o in out if isinstance(o, tuple)] == [] and deliveries(out) == []  # ep_any pinned to 2
    # A restart rebuilds the index from the broadcast state: the same answer.
    restarted = FanOut(3600, 60, 250, 100, 5000, "events")
    restarted.open(RuntimeContext())  # type: ignore[arg-type]
    list(restarted.process_broadcast_element(ConfigClock(time.time_ns() // 1_000_000, 600_000), ctx) or ())
    out = send(restarted, ctx, "evt_11b", "invoice.late", "1.1", {"amount": 1})
    assert [o for o in out if isinstance(o, tuple)] == []
