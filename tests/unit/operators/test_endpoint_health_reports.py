"""The dispatcher's endpoint reports (endpoint_backlogs) with fakes for Flink, the sender and
Cassandra (tests/unit/operators/test_dispatcher_adapter.py's World): a breaker that opens is reported at
once, not at the next 30 s report, and the rows written do not grow with the deliveries."""

from __future__ import annotations

from typing import Any

import pytest

from core import dispatch
from core.breaker import CircuitState
from core.endpoint_health import EndpointReport
from core.outcomes import HttpResult
from core.records import EndpointConfig
from operators.dispatcher import BACKLOG_REPORT_MS
from operators.write_batcher import BatchCompletion
from tests.unit.operators.test_dispatcher_adapter import T0, World


def _recording(w: World) -> list[EndpointReport]:
    rows: list[EndpointReport] = []

    def report_backlog(r: EndpointReport) -> BatchCompletion:
        rows.append(r)
        done = BatchCompletion()
        done.succeed()
        return done

    w.history.report_backlog = report_backlog  # type: ignore[method-assign]
    return rows


def _answering(w: World, status: list[int]) -> None:
    async def send(p: dispatch.Pending, payload: bytes, cfg: EndpointConfig, keys: Any) -> dispatch.SendReport:
        w.sender.sent.append(p.delivery_id)
        now = w.timers.now
        return dispatch.SendReport(result=HttpResult(status=status[0]), started_at_ms=now, finished_at_ms=now,
                                   url=cfg.url, endpoint_config_version=cfg.config_version)

    w.sender.send = send  # type: ignore[method-assign]


@pytest.mark.parametrize("deliveries", [10, 200])
def test_an_opened_breaker_is_reported_at_once_and_rows_do_not_grow_with_deliveries(
        monkeypatch: pytest.MonkeyPatch, deliveries: int) -> None:
    w = World(monkeypatch, breaker_open_s=30.0)
    rows = _recording(w)
    status = [503]
    _answering(w, status)
    for n in range(deliveries):
        w.new(n)
    w.fire_timers_until(T0 + 1_000)
    opened = [r for r in rows if r.breaker is CircuitState.OPEN]
    assert opened, f"no open breaker reported within a second: {rows}"
    first = opened[0]
    assert first.reported_at_ms < T0 + BACKLOG_REPORT_MS  # at once, not at the next periodic report
    assert first.pending == deliveries and first.open_until_ms is not None and first.open_until_ms > T0
    assert first.oldest_retry_ms == T0  # the ones tried and failed
    assert first.oldest_new_ms == T0  # the ones the breaker holds back before a first attempt
    assert first.tenant_id == "t_1" and first.endpoint_id == w.ep

    status[0] = 200  # the receiver recovers: the probe closes the breaker, the backlog drains
    w.fire_timers_until(T0 + 10 * 60_000)
    assert len(w.sender.sent) >= deliveries
    states = [r.breaker for r in rows]
    assert states[-1] is CircuitState.CLOSED and rows[-1].pending == 0  # drained: reported holding none
    assert CircuitState.HALF_OPEN in states[states.index(CircuitState.OPEN):]
    # Ten minutes of one endpoint: one row per 30 s report at most while it held deliveries, plus
    # one per breaker change -- the same for 10 deliveries as for 200.
    changes = sum(1 for a, b in zip(states, states[1:], strict=False) if a is not b)
    assert len(rows) <= (10 * 60_000) // BACKLOG_REPORT_MS + 1 + changes + 1
    assert len(rows) < 25
