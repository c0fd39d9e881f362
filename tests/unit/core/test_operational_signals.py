"""What the endpoint driver tells the control plane for operational events: a breaker's failing
episode and its recovery, a delivery that ends without success; ids a restore reproduces."""

from __future__ import annotations

from core import breaker as brk
from core import operational_events as ops
from core.endpoint_driver import Decision, EndpointDriver
from core.outcomes import HttpResult
from core.records import EndpointSignal
from tests.unit.core.test_endpoint_driver import DAY_MS, T0, Sim, _copy_store, config, delivery


def capture(sim: Sim, ep: str = "ep_1") -> list[EndpointSignal]:
    """The signals of every step of ``ep``'s driver from now on (the adapter sends them to Kafka)."""
    drv: EndpointDriver = sim.driver(ep)
    seen: list[EndpointSignal] = []
    real = drv.step

    def step(now_ms: int, write_budget: int) -> Decision:
        dec = real(now_ms, write_budget)
        seen.extend(dec.signals)
        return dec

    drv.step = step  # type: ignore[method-assign,assignment]
    return seen


def failing_endpoint(n: int = 6) -> tuple[Sim, list[EndpointSignal]]:
    sim = Sim()
    sim.config(config())
    seen = capture(sim)
    sim.answer["ep_1"] = HttpResult(503)
    for i in range(n):
        sim.new(delivery(i))
    sim.answer_all("ep_1")
    assert sim.driver("ep_1").breaker.state is brk.CircuitState.OPEN
    return sim, seen


def test_an_opening_breaker_signals_one_failing_episode_and_a_success_its_recovery() -> None:
    sim, seen = failing_endpoint()
    failing = [s for s in seen if s.signal == ops.SIGNAL_FAILING]
    assert [(s.sequence, s.event_type, s.endpoint_id, s.tenant_id) for s in failing] == [
        (1, "invoice.paid", "ep_1", "t_1")]
    sim.advance(T0 + 10 * 60_000)  # probes fail: re-openings are the same episode
    assert [s.signal for s in seen].count(ops.SIGNAL_FAILING) == 1
    sim.answer["ep_1"] = HttpResult(200)
    sim.advance(T0 + 30 * 60_000)
    recovered = [s for s in seen if s.signal == ops.SIGNAL_RECOVERED]
    assert [(s.sequence, s.endpoint_id) for s in recovered] == [(1, "ep_1")]
    assert not [s for s in seen if s.signal == ops.SIGNAL_EXHAUSTED]


def test_a_second_failing_episode_has_the_next_sequence() -> None:
    sim, seen = failing_endpoint()
    sim.answer["ep_1"] = HttpResult(200)
    sim.advance(T0 + 5 * 60_000)
    sim.answer["ep_1"] = HttpResult(503)
    for i in range(100, 106):
        sim.new(delivery(i, created=sim.now))
    sim.answer_all("ep_1")
    assert [s.sequence for s in seen if s.signal == ops.SIGNAL_FAILING] == [1, 2]


def test_deliveries_past_their_deadline_are_signalled_exhausted_once_each() -> None:
    sim, seen = failing_endpoint(6)
    sim.advance(T0 + DAY_MS + 60_000)
    exhausted = [s for s in seen if s.signal == ops.SIGNAL_EXHAUSTED]
    assert sorted(s.delivery_id for s in exhausted) == sorted(f"dlv_ep_1_{i}" for i in range(6))
    assert {s.detail for s in exhausted} <= {"expired", "failed"}
    assert all(s.event_type == "invoice.paid" and s.attempts >= 1 for s in exhausted)
    assert all(s.event_id.startswith("evt_") for s in exhausted)


def test_a_permanent_answer_is_signalled_exhausted_with_its_status() -> None:
    sim = Sim()
    sim.config(config())
    seen = capture(sim)
    sim.answer["ep_1"] = HttpResult(400)
    sim.new(delivery(1))
    sim.answer_all("ep_1")
    assert [(s.signal, s.detail, s.http_status, s.attempts, s.delivery_id) for s in seen] == [
        (ops.SIGNAL_EXHAUSTED, "failed", 400, 1, "dlv_ep_1_1")]


def test_a_410_signals_gone_not_exhausted() -> None:
    sim = Sim()
    sim.config(config())
    seen = capture(sim)
    sim.answer["ep_1"] = HttpResult(410)
    sim.new(delivery(1))
    sim.answer_all("ep_1")
    assert [s.signal for s in seen] == [ops.SIGNAL_GONE]


def test_an_opening_re_run_after_a_restore_is_the_same_episode() -> None:
    sim = Sim()
    sim.config(config())
    checkpoint = {ep: _copy_store(s) for ep, s in sim.stores.items()}
    seen = capture(sim)
    sim.answer["ep_1"] = HttpResult(503)
    for i in range(6):
        sim.new(delivery(i))
    sim.answer_all("ep_1")
    first = [s.sequence for s in seen if s.signal == ops.SIGNAL_FAILING]
    # A crash after the opening, restored from the checkpoint before it: the job runs it again.
    sim.stores, sim.drivers, sim.sends = checkpoint, {}, {}
    again = capture(sim)
    for i in range(6):
        sim.new(delivery(i))
    sim.answer_all("ep_1")
    sim.advance(sim.now + 1_000)
    assert first == [1]
    assert [s.sequence for s in again if s.signal == ops.SIGNAL_FAILING] == [1]


def test_a_delivery_expiring_in_a_step_is_signalled_by_that_step() -> None:
    sim, _ = failing_endpoint(6)
    drv = sim.driver("ep_1")
    dec = drv.step(T0 + DAY_MS + 1, 1024)
    assert {s.signal for s in dec.signals} == {ops.SIGNAL_EXHAUSTED}
    assert len(dec.signals) == len({s.delivery_id for s in dec.signals}) > 0


def test_a_delivery_found_exhausted_when_restored_is_signalled_again_with_its_id() -> None:
    """The signal of a delivery that ended after the last checkpoint may not have reached Kafka
    before a crash; restored, the delivery is read final from the history and is signalled again
    (same delivery id: the same operational event, which fan-out dedupes)."""
    sim = Sim()
    sim.config(config())
    sim.answer["ep_1"] = HttpResult(503)
    sim.new(delivery(1))
    sim.answer_all("ep_1")
    checkpoint = {ep: _copy_store(s) for ep, s in sim.stores.items()}  # the delivery is pending in it
    sim.advance(T0 + DAY_MS + 60_000)  # retried until its attempts ran out: failed in the history
    assert sim.history["dlv_ep_1_1"].status == "failed"
    sim.stores, sim.drivers, sim.sends = checkpoint, {}, {}
    again = capture(sim)
    sim.run("ep_1")  # the restored timer's pass
    assert [(s.signal, s.delivery_id, s.attempts) for s in again] == [(ops.SIGNAL_EXHAUSTED, "dlv_ep_1_1", 20)]
