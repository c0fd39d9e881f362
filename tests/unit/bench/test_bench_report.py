"""The benchmark's CPU accounting (stack/cpu.py) and report (bench/report_md.py)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from types import SimpleNamespace

from bench import report_md
from bench.raw_http import Result as RawResult
from bench.results import Costs, PhaseResult
from bench.run import Sent, measure, summary_line
from stack import cpu


def test_the_sampler_counts_the_cpu_a_group_spent_and_ignores_a_missing_process(tmp_path: Path) -> None:
    me = tmp_path / "me.pid"
    me.write_text(str(os.getpid()))
    gone = tmp_path / "gone.pid"
    gone.write_text("999999999")
    with cpu.StackSampler(lambda: {"this-test": [me], "gone": [gone]}, interval_s=0.05) as s:
        end = time.process_time() + 0.3
        while time.process_time() < end:  # burn ~0.3 s of CPU in this process
            pass
    u = s.usage
    assert u.cpu_s["gone"] == 0
    assert 0.2 <= u.cpu_s["this-test"] <= u.wall_s + 0.05  # clock ticks: 10 ms resolution
    assert u.series and all(set(pct) == {"this-test", "gone"} for _, pct in u.series)
    assert u.ms_per(100)["this-test"] == u.cpu_s["this-test"] * 10
    assert u.machine_ticks > 0 and 0.0 <= u.steal_pct <= 100.0  # the machine's ticks over the phase


def phase(delivered: int, cpu_s: dict[str, float]) -> PhaseResult:
    lat = [0.010 + i / 1000 for i in range(delivered)]
    arrivals = [100.0 + i / 100 for i in range(delivered)]
    return PhaseResult(expected=delivered, delivered=delivered, duplicates=0, latencies_s=lat,
                       arrivals=arrivals, produce_s=1.0, latencies_by_tenant={"t": lat},
                       pairs=[(a - x, a, "t") for a, x in zip(arrivals, lat, strict=True)],
                       usage=cpu.Usage(cpu_s=cpu_s, wall_s=2.0, series=[(0.5, {g: 50.0 for g in cpu_s})]))


def costs_of(full: PhaseResult, client_cpu_s: float = 0.25, writes: dict[str, int] | None = None,
             idle: cpu.Usage | None = None) -> Costs:
    raw = RawResult(elapsed_s=1.0, ok=1000, client_cpu_s=client_cpu_s)  # 0.25 ms a request by default
    return Costs.of(full, raw, writes, idle)


def summary_fields(line: str) -> dict[str, str]:
    return dict(kv.split("=") for kv in line.removeprefix("bench: ").split())


def test_the_summary_line_keeps_the_old_figures_and_adds_the_new_ones() -> None:
    full = phase(200, {"taskmanagers": 0.3, "cassandra": 0.1})
    full.usage.steal_ticks, full.usage.machine_ticks = 25, 100
    idle = cpu.Usage(cpu_s={"kafka": 3.0, "cassandra": 9.0}, wall_s=30.0)
    costs = costs_of(full, writes={"attempts": 200, "deliveries": 400}, idle=idle)
    fields = summary_fields(summary_line(full, phase(100, {"taskmanagers": 0.1}), 1000.0, costs))
    assert list(fields) == ["deliveries_per_s", "raw_http_per_s", "ratio", "p50_first_attempt_ms",
                            "p99_first_attempt_ms", "half_p50_first_attempt_ms", "half_p99_first_attempt_ms",
                            "cpu_ms_per_delivery", "client_cpu_ms_per_request", "cpu_per_client_request",
                            "cassandra_writes_per_delivery", "idle_cores", "steal_pct"]
    assert fields["cpu_ms_per_delivery"] == "2.00"  # 0.4 s over 200 deliveries
    assert fields["raw_http_per_s"] == "1000"
    assert fields["client_cpu_ms_per_request"] == "0.250"  # 0.25 s over 1,000 responses
    assert fields["cpu_per_client_request"] == "8.0"  # 2.00 / 0.25
    assert fields["cassandra_writes_per_delivery"] == "3.00"  # 600 writes over 200 deliveries
    assert fields["idle_cores"] == "0.40"  # 12 CPU seconds over 30 s
    assert fields["steal_pct"] == "25"  # the full-speed phase's usage: 25 of 100 machine ticks stolen


def test_figures_not_measured_read_nan_and_keep_their_place() -> None:
    full = phase(200, {"taskmanagers": 0.4})
    fields = summary_fields(summary_line(full, None, 1000.0, costs_of(full, client_cpu_s=0.0)))
    assert list(fields)[-5:] == ["client_cpu_ms_per_request", "cpu_per_client_request",
                                 "cassandra_writes_per_delivery", "idle_cores", "steal_pct"]
    assert fields["steal_pct"] == "nan"  # the phase's usage read no machine counters
    assert fields["cpu_per_client_request"] == "nan"  # no client CPU to divide by
    assert fields["cassandra_writes_per_delivery"] == "nan"  # not read
    assert fields["idle_cores"] == "nan"  # --idle-seconds 0
    assert fields["half_p50_first_attempt_ms"] == "0"


def test_no_cassandra_writes_over_deliveries_is_zero_not_nan() -> None:
    costs = costs_of(phase(200, {"taskmanagers": 0.4}), writes={})
    assert (costs.cassandra_writes, costs.cassandra_writes_per_delivery) == (0, 0.0)
    assert math.isnan(costs_of(phase(200, {}), writes=None).cassandra_writes_per_delivery)


def test_the_report_has_a_row_per_phase_and_its_charts(tmp_path: Path) -> None:
    phases = {"max": phase(200, {"taskmanagers": 0.3, "cassandra": 0.1}), "half": phase(50, {"taskmanagers": 0.1})}
    idle = cpu.Usage(cpu_s={"kafka": 3.0, "cassandra": 9.0}, wall_s=30.0)
    costs = costs_of(phases["max"], writes={"attempts": 200, "deliveries": 400}, idle=idle)
    out = report_md.write(tmp_path, phases, ["bench: x=1"], RawResult(elapsed_s=1.0, ok=1000), {"events": 20},
                          costs)
    text = out.read_text()
    assert "| max | 200/200 | 0 |" in text and "| half | 50/50 | 0 |" in text
    assert "taskmanagers 1.50, cassandra 0.50" in text  # ms per delivery by process, largest first
    assert "= 8.0 raw aiohttp client requests at 0.250 ms" in text
    assert "600 for 200 deliveries = 3.00 a delivery (deliveries 400, attempts 200)" in text
    assert "0.40 cores busy (cassandra 0.300, kafka 0.100)" in text
    for chart in ("latency_cdf.png", "rate.png", "cpu.png"):
        assert f"]({chart})" in text
        assert (tmp_path / chart).stat().st_size > 1000


class _Rx:
    """The receiver's recordings as `measure` reads them (webhook id and arrival time only)."""

    def __init__(self, by_path: dict[str, list[tuple[str, float]]]) -> None:
        self._by_path = by_path

    def requests(self, path: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(webhook_id=w, received_at=t) for w, t in self._by_path.get(path, [])]


def test_repeats_count_only_the_phases_own_deliveries_not_an_earlier_phases_late_ones() -> None:
    # The half-load phase reuses the full-speed phase's endpoints: a full-speed delivery still
    # draining arrives on the same path and is neither this phase's delivery nor its repeat
    # (a run reported "+523 repeats" that were the previous phase's backlog).
    sent = Sent(produced_at={"msg_a": (10.0, "t", "/p"), "msg_b": (10.0, "t", "/p")}, paths=["/p"])
    rx = _Rx({"/p": [("msg_old1", 10.5), ("msg_a", 10.1), ("msg_old2", 10.6), ("msg_b", 10.2), ("msg_a", 12.0)]})
    r = measure(rx, sent, ["/p"], expected=2)  # type: ignore[arg-type]
    assert (r.delivered, r.duplicates) == (2, 1)  # msg_a's retry is the one repeat
    assert [round(x, 3) for x in r.latencies_s] == [0.1, 0.2]


class _SlowReceiver:
    """A fake receiver whose deliveries arrive one per ``every_s`` of a fake clock, up to ``stop_at``."""

    def __init__(self, clock: list[float], sent: Sent, every_s: float, stop_at: int) -> None:
        self.clock, self.every_s, self.stop_at = clock, every_s, stop_at
        self.ids = list(sent.produced_at)

    def _n(self) -> int:
        return min(self.stop_at, int(self.clock[0] / self.every_s))

    def counts(self) -> dict[str, int]:
        return {"/p": self._n()}

    def requests(self, path: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(webhook_id=w, received_at=self.clock[0]) for w in self.ids[:self._n()]]


def _sent(n: int) -> Sent:
    return Sent(produced_at={f"msg_{i}": (0.0, "t", "/p") for i in range(n)}, paths=["/p"])


def _wait(rx: _SlowReceiver, sent: Sent, clock: list[float], timeout_s: float, stall_s: float) -> PhaseResult:
    from bench.run import wait_and_measure

    def sleep(s: float) -> None:
        clock[0] += s

    return wait_and_measure(rx, sent, timeout_s, stall_s=stall_s, clock=lambda: clock[0], sleep=sleep,
                            say=lambda _: None)


def test_a_phase_still_making_progress_is_waited_for_beyond_the_stall_timeout() -> None:
    # 1,000 deliveries at 5/s take 200 s: a slow machine, not a stuck job. A fixed 90 s wait cut
    # the full-speed phase short and let the next phase start behind its remainder.
    clock = [0.0]
    sent = _sent(1000)
    r = _wait(_SlowReceiver(clock, sent, every_s=0.2, stop_at=1000), sent, clock, timeout_s=900, stall_s=30)
    assert r.delivered == 1000
    assert 200 <= clock[0] < 210


def test_a_phase_that_stops_arriving_ends_after_the_stall_timeout() -> None:
    clock = [0.0]
    sent = _sent(1000)
    r = _wait(_SlowReceiver(clock, sent, every_s=0.1, stop_at=400), sent, clock, timeout_s=900, stall_s=30)
    assert r.delivered == 400
    assert 70 <= clock[0] <= 72  # the 400th arrived at 40 s, then 30 s without one


def test_a_phase_ends_at_its_overall_timeout_even_while_progressing() -> None:
    clock = [0.0]
    sent = _sent(1000)
    r = _wait(_SlowReceiver(clock, sent, every_s=1.0, stop_at=1000), sent, clock, timeout_s=120, stall_s=30)
    assert 119 <= r.delivered <= 121
    assert 120 <= clock[0] <= 121
