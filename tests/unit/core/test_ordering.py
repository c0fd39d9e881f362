"""Ordering keys: the key of an event, the per-key sequencing, and the endpoint
driver holding later deliveries of a key behind its head -- with a failing head, out-of-order
arrival, a restore, an operator's skip, and ordering turned off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from core import dispatch as dsp
from core import ordering
from core.endpoint_driver import Record
from core.fanout import NewDelivery, deliveries_for
from core.ordering import KeyQueues, KeyRowChange
from core.outcomes import HttpResult
from core.records import SKIP, EventRecord, ReplayRequest
from tests.unit.core.test_endpoint_driver import DAY_MS, T0, Sim, config

# -- the key of an event ---------------------------------------------------------------------------


@pytest.mark.parametrize(("setting", "payload", "expected"), [
    ("", b'{"customer": {"id": "c_1"}}', ""),
    ("object_id", b"{}", "inv_1"),
    ("/customer/id", b'{"customer": {"id": "c_1"}}', "c_1"),
    ("/customer/id", b'{"customer": {"id": 42}}', "42"),
    ("/customer/id", b'{"customer": {}}', "inv_1"),  # missing: ordered with its object
    ("/customer", b'{"customer": {"id": "c_1"}}', "inv_1"),  # an object is not a key
    ("/flag", b'{"flag": true}', "inv_1"),  # nor a boolean
    ("/customer/id", b"not json", "inv_1"),
    ("/a~1b", b'{"a/b": "x"}', "x"),
])
def test_the_key_of_an_event(setting: str, payload: bytes, expected: str) -> None:
    assert ordering.key_for(setting, "inv_1", payload) == expected


@pytest.mark.parametrize("setting", ["object_id", "", "/customer/id", "/a~0b"])
def test_valid_settings(setting: str) -> None:
    assert ordering.check(setting) == setting


@pytest.mark.parametrize(("setting", "says"), [
    ("objectid", "use 'object_id'"),
    ("customer/id", "JSON Pointer"),
    ("/a~2", "escaped"),
    ("/" + "x" * 300, "longer than"),
])
def test_malformed_settings_are_refused_with_the_reason(setting: str, says: str) -> None:
    with pytest.raises(ordering.InvalidOrderingKey, match=says):
        ordering.check(setting)


def test_fan_out_decides_the_key_with_the_config_it_matched() -> None:
    e = EventRecord("evt_1", "t_1", "invoice.paid", "1", "inv_1", 3, T0, b'{"customer": {"id": "c_9"}}')
    out = deliveries_for(e, [config("ep_a"), config("ep_b", ordering_key="object_id"),
                             config("ep_c", ordering_key="/customer/id")], T0, DAY_MS)
    assert [d.ordering_key for d in out] == ["", "inv_1", "c_9"]


# -- per-key sequencing --------------------------------------------------------------------------------


def test_the_head_is_the_lowest_version_until_one_is_sent() -> None:
    q = KeyQueues()
    q.add("d3", "k", 3, T0)
    assert q.head("k") == "d3"
    q.add("d1", "k", 1, T0 + 1)  # a lower version arrived: d3 is no longer head
    assert q.head("k") == "d1" and not q.is_head("d3") and q.waiting("k") == 1
    q.mark_started("d1")
    q.add("d0", "k", 0, T0 + 2)  # d1 was sent: it stays head until final
    assert q.head("k") == "d1" and q.waiting("k") == 2
    assert q.remove("d1") == "d0"
    assert q.remove("d3") is None  # not the head
    assert q.remove("d0") is None and q.head("k") is None and len(q) == 0


def test_unordered_deliveries_are_always_heads() -> None:
    q = KeyQueues()
    q.add("d1", "", 1, T0)
    assert q.is_head("d1") and q.is_head("never_added") and len(q) == 0


def test_a_restore_keeps_the_lowest_started_member_as_head() -> None:
    q = KeyQueues()
    q.add("d5", "k", 5, T0, started=True)
    q.add("d2", "k", 2, T0, started=True)  # both sent before ordering was turned on
    q.add("d1", "k", 1, T0)
    assert q.head("k") == "d2"


# -- the driver ----------------------------------------------------------------------------------------


def od(n: int, obj: str, version: int, ep: str = "ep_1", created: int = T0) -> NewDelivery:
    """A delivery of object ``obj`` at ``version``, keyed by object id as fan-out would."""
    e = EventRecord(event_id=f"evt_{n}", tenant_id="t_1", event_type="invoice.updated", schema_version="1",
                    object_id=obj, object_version=version, occurred_at_ms=created, payload=b"{}")
    return NewDelivery(delivery_id=f"dlv_{n}", event=e, endpoint_id=ep, tenant_id="t_1", endpoint_config_version=1,
                       created_at_ms=created, expires_at_ms=created + DAY_MS, ordering_key=obj)


class Receiver:
    """Answers per delivery: 500 for the ids in ``failing``, 200 otherwise; keeps the send order."""

    def __init__(self, sim: Sim, ep: str = "ep_1") -> None:
        self.sim, self.ep = sim, ep
        self.failing: set[str] = set()
        self.order: list[str] = []

    def answer(self) -> int:
        drv = self.sim.driver(self.ep)
        sends, self.sim.sends[self.ep] = self.sim.sends.get(self.ep, []), []
        for s in sends:
            did = s.p.delivery_id
            self.order.append(did)
            res = HttpResult(500) if did in self.failing else HttpResult(200)
            drv.io_done("send", did, dsp.SendReport(res, self.sim.now, self.sim.now, s.config.url,
                                                    s.config.config_version), None, self.sim.now)
        self.sim.run(self.ep)
        return len(sends)

    def in_flight(self) -> list[str]:
        return [s.p.delivery_id for s in self.sim.sends.get(self.ep, [])]

    def run_for(self, ms: int) -> None:
        """Time passes; every request is answered as it is made."""
        until = self.sim.now + ms
        while True:
            if self.in_flight():
                self.answer()
                continue
            due = self.sim.wakes.get(self.ep)
            if due is None or due[0] > until:
                break
            self.sim.now = max(self.sim.now, due[0])
            self.sim.wakes[self.ep] = None
            self.sim.run(self.ep)
        self.sim.now = until


def ordered_sim(setting: str = "object_id") -> tuple[Sim, Receiver]:
    sim = Sim()
    sim.config(config(ordering_key=setting))
    return sim, Receiver(sim)


def test_a_failing_head_holds_only_its_key() -> None:
    sim, rx = ordered_sim()
    rx.failing = {"dlv_1"}
    for n, (obj, v) in enumerate([("inv_a", 1), ("inv_a", 2), ("inv_b", 1), ("inv_b", 2)], start=1):
        sim.new(od(n, obj, v))
    assert sorted(rx.in_flight()) == ["dlv_1", "dlv_3"]  # one per key
    rx.run_for(3_600_000)
    assert sim.history["dlv_3"].status == sim.history["dlv_4"].status == "succeeded"  # inv_b flowed
    assert sim.requests["dlv_1"] >= 5 and sim.requests["dlv_2"] == 0  # inv_a held behind its head
    assert sim.history["dlv_2"].status == "pending"
    rx.failing.clear()
    rx.run_for(3_600_000)
    assert sim.history["dlv_1"].status == sim.history["dlv_2"].status == "succeeded"
    a = [d for d in rx.order if d in ("dlv_1", "dlv_2")]
    assert a.index("dlv_2") > max(i for i, d in enumerate(a) if d == "dlv_1")  # never before its head


def test_an_unordered_endpoint_sends_the_same_object_concurrently() -> None:
    sim, rx = ordered_sim(setting="")
    sim.new(replace(od(1, "inv_a", 1), ordering_key=""))
    sim.new(replace(od(2, "inv_a", 2), ordering_key=""))
    assert sorted(rx.in_flight()) == ["dlv_1", "dlv_2"]


def test_deliveries_that_arrive_out_of_order_go_in_version_order() -> None:
    sim, rx = ordered_sim()
    rx.failing = {"dlv_0"}
    sim.new(od(0, "inv_a", 1))  # the head, failing
    rx.answer()
    for n, v in [(3, 4), (1, 2), (2, 3)]:  # versions 4, 2, 3 arrive in that order
        sim.new(od(n, "inv_a", v))
    assert rx.in_flight() == []
    rx.failing.clear()
    rx.run_for(3_600_000)
    assert [d for d in rx.order if d != "dlv_0"] == ["dlv_1", "dlv_2", "dlv_3"]


def test_a_lower_version_arriving_while_the_head_is_in_flight_goes_next_not_concurrently() -> None:
    sim, rx = ordered_sim()
    sim.new(od(2, "inv_a", 2))
    assert rx.in_flight() == ["dlv_2"]
    sim.new(od(1, "inv_a", 1))  # late: version 2 is already on the wire
    assert rx.in_flight() == ["dlv_2"]
    rx.answer()
    assert rx.in_flight() == ["dlv_1"]  # sent after, carrying its (stale) version for the receiver
    rx.answer()
    assert sim.history["dlv_1"].status == "succeeded"


def test_a_restore_keeps_the_key_held_behind_its_failing_head() -> None:
    sim, rx = ordered_sim()
    rx.failing = {"dlv_1"}
    for n, v in [(1, 1), (2, 2), (3, 3)]:
        sim.new(od(n, "inv_a", v))
    rx.answer()  # the head failed once and waits for its retry
    sim.restore()
    sim.config(config(ordering_key="object_id"))
    rx.run_for(600_000)
    assert sim.requests["dlv_2"] == sim.requests["dlv_3"] == 0
    assert sim.requests["dlv_1"] >= 2
    rx.failing.clear()
    rx.run_for(3_600_000)
    assert [d for d in rx.order if d != "dlv_1"] == ["dlv_2", "dlv_3"]
    assert all(sim.history[f"dlv_{n}"].status == "succeeded" for n in (1, 2, 3))


def skip(sim: Sim, did: str, tenant: str = "t_1", request_id: str = "skp_1") -> str:
    return sim.replay(ReplayRequest(did, tenant, "ep_1", "key_ops", sim.now, request_id, action=SKIP))


def test_an_operator_skips_a_failing_head_and_the_key_moves_on() -> None:
    sim, rx = ordered_sim()
    rx.failing = {"dlv_1"}
    sim.new(od(1, "inv_a", 1))
    sim.new(od(2, "inv_a", 2))
    rx.answer()
    assert skip(sim, "dlv_2", request_id="skp_0") == "not a head"  # only a head is skipped
    assert skip(sim, "dlv_1", tenant="t_other", request_id="skp_x") == "refused"
    assert skip(sim, "dlv_1") == "skipping"
    assert sim.history["dlv_1"].status == "failed"
    assert "not_sent" in sim.history["dlv_1"].rows.values()  # its reserved row closed, nothing sent
    assert rx.in_flight() == ["dlv_2"]
    assert skip(sim, "dlv_1", request_id="skp_1") == "duplicate"


def test_a_skip_that_arrives_while_the_head_is_in_flight_applies_when_it_returns() -> None:
    sim, rx = ordered_sim()
    rx.failing = {"dlv_1"}
    sim.new(od(1, "inv_a", 1))
    sim.new(od(2, "inv_a", 2))
    assert rx.in_flight() == ["dlv_1"]
    assert skip(sim, "dlv_1") == "skipping"
    rx.answer()  # it failed; the skip ends it instead of a retry
    assert sim.history["dlv_1"].status == "failed" and rx.in_flight() == ["dlv_2"]


def test_a_skip_survives_a_restore() -> None:
    sim, rx = ordered_sim()
    rx.failing = {"dlv_1"}
    sim.new(od(1, "inv_a", 1))
    sim.new(od(2, "inv_a", 2))
    assert skip(sim, "dlv_1") == "skipping"  # the head is in flight
    sim.restore()
    sim.config(config(ordering_key="object_id"))
    rx.run_for(600_000)
    assert sim.history["dlv_1"].status == "failed" and sim.history["dlv_2"].status == "succeeded"
    assert sim.requests["dlv_1"] == 1


def test_turning_ordering_off_releases_the_held_deliveries_at_once() -> None:
    sim, rx = ordered_sim()
    rx.failing = {"dlv_1"}
    sim.new(od(1, "inv_a", 1))
    sim.new(od(2, "inv_a", 2))
    rx.answer()
    sim.config(config(version=2, ordering_key=""))
    assert rx.in_flight() == ["dlv_2"]


def test_head_records_say_when_a_key_is_blocked_and_when_it_is_free_again() -> None:
    sim, rx = ordered_sim()
    changes: list[tuple[str, KeyRowChange | None]] = []
    real = sim._storage

    def watching(drv: Any, a: Any) -> None:
        if isinstance(a, Record):
            changes.append((a.p.delivery_id, a.key_row))
        real(drv, a)

    sim._storage = watching  # type: ignore[method-assign]
    rx.failing = {"dlv_1"}
    sim.new(od(1, "inv_a", 1))
    sim.new(od(2, "inv_a", 2))
    sim.new(od(3, "inv_b", 1))
    rx.answer()
    rx.failing.clear()
    rx.run_for(3_600_000)
    a = [c for did, c in changes if did == "dlv_1"]
    assert a[0] == KeyRowChange("inv_a", blocked=True, waiting=1, first_failure=True)
    assert a[-1] == KeyRowChange("inv_a", blocked=False)  # free again once its head is final
    assert [c for did, c in changes if did != "dlv_1"] == [None, None]  # never blocked

