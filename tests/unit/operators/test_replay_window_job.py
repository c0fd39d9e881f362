"""The delivery job's side of replay windows (operators/dispatcher.py with fakes, as in
test_dispatcher_adapter.py): a replay request read once the window it was queued with has
closed is refused -- never loaded nor sent -- and the refusal is written to the delivery's
history; one read in time goes on as before, and skips are not windowed."""

from __future__ import annotations

import pytest

from core.records import ReplayRequest
from core.timeutil import ms_to_iso
from operators.dispatcher import REPLAY
from tests.unit.operators.test_dispatcher_adapter import T0, World

RULE = "catalog user.disabled: replay window 2s"


def request(closes_at: int | None, request_id: str = "rpl_1", action: str = "replay") -> ReplayRequest:
    return ReplayRequest(delivery_id="dlv_9", tenant_id="t_1", endpoint_id="ep_1", requested_by="key_a",
                         requested_at_ms=T0 - 5_000, request_id=request_id, action=action,
                         replay_closes_at_ms=closes_at, replay_rule=RULE if closes_at is not None else "")


def loads_started(w: World) -> int:
    return sum(1 for kind, _ in w.d._io._by_endpoint.get(w.ep, {}) if kind == "load")


def test_a_request_read_after_its_window_closed_is_refused_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(monkeypatch)
    r = request(closes_at=T0 - 1)  # queued inside the window, read after it
    w.element(REPLAY, r)
    assert loads_started(w) == 0 and not w.rt.pending
    [(recorded, reason, at)] = w.history.refused_replays
    assert (recorded, at) == (r, T0)
    assert reason == (f"replay not allowed: {RULE} (closed at {ms_to_iso(T0 - 1)}); "
                      f"the delivery job read the request at {ms_to_iso(T0)}")
    assert w.d._counts["replays_past_window"] == 1
    # Nothing of it is kept: no replay waits to be loaded, its request id is not taken.
    drv = w.d._drivers.get(w.ep)
    assert drv is None or not drv._loads
    assert not w.d._store.seen_request("rpl_1")  # type: ignore[attr-defined]


@pytest.mark.parametrize("closes_at", [T0 + 1, None])
def test_a_request_read_in_time_or_without_a_window_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                            closes_at: int | None) -> None:
    w = World(monkeypatch)
    w.element(REPLAY, request(closes_at))
    assert loads_started(w) == 1
    assert not w.history.refused_replays and w.d._counts["replays_past_window"] == 0
    w.rt.run_all()  # the load (the fake history has no such delivery) ends here


def test_the_window_counts_at_the_time_the_job_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(monkeypatch)
    w.timers.now = T0 + 2_000
    w.element(REPLAY, request(closes_at=T0 + 2_000))  # closes exactly as it is read: closed
    assert len(w.history.refused_replays) == 1 and loads_started(w) == 0
