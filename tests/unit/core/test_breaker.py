"""Circuit breaker transitions, as scripted event sequences with a fixed clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from core.breaker import (
    CLOSED,
    BreakerConfig,
    BreakerState,
    CircuitState,
    allow,
    next_probe_at_ms,
    on_failure,
    on_inconclusive,
    on_success,
)
from core.settings import DispatchSettings

NOW = 1_700_000_000_000
CFG = BreakerConfig(failure_threshold=5, fast_failure_threshold=2, open_s=30.0, max_open_s=600.0)


@dataclass(frozen=True)
class Fail:
    at: int = NOW
    fast: bool = False


@dataclass(frozen=True)
class Ok:
    pass


@dataclass(frozen=True)
class Allow:
    at: int
    expect: bool


@dataclass(frozen=True)
class Inconclusive:
    pass


Event = Fail | Ok | Allow | Inconclusive


def run(events: list[Event], state: BreakerState = CLOSED) -> BreakerState:
    for event in events:
        if isinstance(event, Fail):
            state = on_failure(state, event.at, event.fast, CFG)
        elif isinstance(event, Ok):
            state = on_success(state)
        elif isinstance(event, Inconclusive):
            state = on_inconclusive(state)
        else:
            allowed, state = allow(state, event.at)
            assert allowed is event.expect, f"allow at +{event.at - NOW} ms"
    return state


SLOW_4 = [Fail()] * 4
T30 = NOW + 30_000  # end of the first open period

SCENARIOS = [
    # name, events -> (state, consecutive failures, next probe at)
    ("fresh breaker lets requests through", [Allow(NOW, True)], (CircuitState.CLOSED, 0, None)),
    ("4 slow failures stay closed", SLOW_4, (CircuitState.CLOSED, 4, None)),
    ("5th slow failure opens for 30 s", [*SLOW_4, Fail()], (CircuitState.OPEN, 5, T30)),
    ("1 DNS/TLS failure stays closed", [Fail(fast=True)], (CircuitState.CLOSED, 1, None)),
    ("2 DNS/TLS failures open", [Fail(fast=True)] * 2, (CircuitState.OPEN, 2, T30)),
    # the streak counts every failure; a fast one at the end applies the fast threshold
    ("3 slow then a fast one opens", [*[Fail()] * 3, Fail(fast=True)], (CircuitState.OPEN, 4, T30)),
    ("a success resets the streak", [*SLOW_4, Ok(), *SLOW_4], (CircuitState.CLOSED, 4, None)),
    (
        "open refuses until open_until",
        [*[Fail()] * 5, Allow(NOW + 1, False), Allow(T30 - 1, False)],
        (CircuitState.OPEN, 5, T30),
    ),
    (
        "a straggler failing while open does not extend it",
        [*[Fail()] * 5, Fail(at=NOW + 10_000)],
        (CircuitState.OPEN, 6, T30),
    ),
    (
        "at open_until exactly one probe goes",
        [*[Fail()] * 5, Allow(T30, True), Allow(T30, False), Allow(T30 + 1_000, False)],
        (CircuitState.HALF_OPEN, 5, None),
    ),
    (
        "probe succeeds: closed",
        [*[Fail()] * 5, Allow(T30, True), Ok(), Allow(T30, True), Allow(T30, True)],
        (CircuitState.CLOSED, 0, None),
    ),
    (
        "probe fails: open again for twice as long",
        [*[Fail()] * 5, Allow(T30, True), Fail(at=T30 + 100)],
        (CircuitState.OPEN, 6, T30 + 100 + 60_000),
    ),
    (
        "inconclusive probe frees the slot for another",
        [*[Fail()] * 5, Allow(T30, True), Inconclusive(), Allow(T30 + 1, True), Allow(T30 + 2, False)],
        (CircuitState.HALF_OPEN, 5, None),
    ),
    (
        "a probe never heard of for one open period is presumed lost",
        [*[Fail()] * 5, Allow(T30, True), Allow(T30 + 29_999, False), Allow(T30 + 30_000, True)],
        (CircuitState.HALF_OPEN, 5, None),
    ),
    ("inconclusive while closed changes nothing", [*SLOW_4, Inconclusive()], (CircuitState.CLOSED, 4, None)),
]


@pytest.mark.parametrize(
    ("events", "expected"), [(events, expected) for _, events, expected in SCENARIOS],
    ids=[name for name, _, _ in SCENARIOS],
)
def test_transitions(
    events: list[Event], expected: tuple[CircuitState, int, int | None]
) -> None:
    state = run(events)
    assert (state.state, state.consecutive_failures, next_probe_at_ms(state)) == expected


@pytest.mark.parametrize(
    ("failed_probes", "open_s"),
    [(0, 30), (1, 60), (2, 120), (3, 240), (4, 480), (5, 600), (6, 600), (200, 600)],
)
def test_open_period_doubles_up_to_the_max(failed_probes: int, open_s: int) -> None:
    state = run([Fail(fast=True)] * 2)
    for _ in range(failed_probes):
        assert state.open_until_ms is not None
        state = run([Allow(state.open_until_ms, True), Fail(at=state.open_until_ms)], state)
    assert state.open_until_ms is not None and state.opened_at_ms is not None
    assert state.open_until_ms - state.opened_at_ms == open_s * 1000
    assert state.times_opened == failed_probes + 1


def test_success_after_reopening_starts_over_at_the_first_period() -> None:
    state = run([Fail(fast=True)] * 2)
    assert state.open_until_ms is not None
    state = run([Allow(state.open_until_ms, True), Fail(at=state.open_until_ms)], state)
    assert state.open_until_ms is not None
    state = run([Allow(state.open_until_ms, True), Ok(), Fail(fast=True), Fail(fast=True)], state)
    assert (state.times_opened, next_probe_at_ms(state)) == (1, NOW + 30_000)


def test_config_from_settings() -> None:
    s = DispatchSettings()
    assert BreakerConfig.from_settings(s) == BreakerConfig(
        failure_threshold=s.breaker_failure_threshold,
        fast_failure_threshold=s.breaker_fast_failure_threshold,
        open_s=s.breaker_open_s,
        max_open_s=s.breaker_max_open_s,
    )


@pytest.mark.parametrize(
    ("failure", "fast", "open_s", "max_open_s"),
    [(0, 1, 1.0, 2.0), (1, 0, 1.0, 2.0), (1, 1, 0.0, 2.0), (1, 1, 3.0, 2.0)],
)
def test_config_refuses_nonsense(failure: int, fast: int, open_s: float, max_open_s: float) -> None:
    with pytest.raises(ValueError):
        BreakerConfig(failure, fast, open_s, max_open_s)
