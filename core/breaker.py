"""Per-endpoint circuit breaker as pure transitions over a frozen state.

::

    CLOSED --(N consecutive failures; fewer if the latest is DNS/TLS)--> OPEN
    OPEN   --(allow() at or after open_until)---------------------------> HALF_OPEN, one probe
    HALF_OPEN --probe succeeds--> CLOSED
    HALF_OPEN --probe fails-----> OPEN again, for twice as long (up to max_open_s)

While open, deliveries are not dropped: they stay pending with ``next_probe_at_ms`` as their
visible next attempt time. The state is small and frozen so the dispatcher can keep it in keyed
state (it is checkpointed) and tests can build any situation directly.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from core.settings import DispatchSettings


class CircuitState(enum.StrEnum):
    CLOSED = "closed"  # requests flow
    OPEN = "open"  # requests held until open_until_ms
    HALF_OPEN = "half_open"  # one probe request decides


@dataclass(frozen=True)
class BreakerConfig:
    failure_threshold: int  # consecutive failures that open a closed breaker
    fast_failure_threshold: int  # the same, when the latest failure is DNS or TLS
    open_s: float  # first open period
    max_open_s: float  # re-opening doubles the period up to this

    def __post_init__(self) -> None:
        if self.failure_threshold < 1 or self.fast_failure_threshold < 1:
            raise ValueError("thresholds must be >= 1")
        if not 0 < self.open_s <= self.max_open_s:
            raise ValueError("need 0 < open_s <= max_open_s")

    @classmethod
    def from_settings(cls, settings: DispatchSettings) -> BreakerConfig:
        return cls(
            failure_threshold=settings.breaker_failure_threshold,
            fast_failure_threshold=settings.breaker_fast_failure_threshold,
            open_s=settings.breaker_open_s,
            max_open_s=settings.breaker_max_open_s,
        )


@dataclass(frozen=True)
class BreakerState:
    state: CircuitState = CircuitState.CLOSED
    consecutive_failures: int = 0
    opened_at_ms: int | None = None
    open_until_ms: int | None = None
    # Openings since the breaker last closed; drives the doubling of the open period.
    times_opened: int = 0
    # When the half-open probe was let through; None = no probe in flight.
    probe_started_ms: int | None = None
    # Failing episodes (openings from closed) since the endpoint was first seen. Kept when the
    # breaker closes, and rolled back with the checkpoint: an opening re-run after a restore is
    # the same episode, which is what operational events derive their ids from.
    episodes: int = 0


CLOSED = BreakerState()


def _open_period_ms(times_opened: int, cfg: BreakerConfig) -> int:
    doublings = times_opened - 1
    # Compare exponents so a long-broken endpoint cannot overflow the float product.
    if doublings >= math.log2(cfg.max_open_s / cfg.open_s):
        return int(cfg.max_open_s * 1000)
    return int(cfg.open_s * 2**doublings * 1000)


def _open(state: BreakerState, now_ms: int, cfg: BreakerConfig) -> BreakerState:
    times_opened = state.times_opened + 1
    return BreakerState(
        state=CircuitState.OPEN,
        consecutive_failures=state.consecutive_failures + 1,
        opened_at_ms=now_ms,
        open_until_ms=now_ms + _open_period_ms(times_opened, cfg),
        times_opened=times_opened,
        episodes=state.episodes + (state.state is CircuitState.CLOSED),
    )


def allow(state: BreakerState, now_ms: int) -> tuple[bool, BreakerState]:
    """May one request go to the endpoint now? Returns the decision and the new state.

    Half-open lets exactly one probe through. A probe that has not reported back within one open
    period is presumed lost (a restart drops in-flight requests, which are not checkpointed), so
    the breaker can never wedge half-open; the period is longer than any HTTP timeout we use.
    """
    if state.state is CircuitState.CLOSED:
        return True, state
    assert state.opened_at_ms is not None and state.open_until_ms is not None
    if state.state is CircuitState.OPEN:
        if now_ms < state.open_until_ms:
            return False, state
        return True, replace(state, state=CircuitState.HALF_OPEN, probe_started_ms=now_ms)
    period_ms = state.open_until_ms - state.opened_at_ms
    if state.probe_started_ms is not None and now_ms < state.probe_started_ms + period_ms:
        return False, state
    return True, replace(state, probe_started_ms=now_ms)


def on_success(state: BreakerState) -> BreakerState:
    """Any success proves the endpoint works: close and forget the failure history (the episode
    count stays)."""
    return CLOSED if state.episodes == 0 else BreakerState(episodes=state.episodes)


def on_failure(state: BreakerState, now_ms: int, fast: bool, cfg: BreakerConfig) -> BreakerState:
    """Record a failure that counts against the endpoint (see ``outcomes.is_endpoint_failure``).

    ``fast``: DNS/TLS failure (``outcomes.is_fast_failure``), which opens after fewer failures.
    """
    if state.state is CircuitState.HALF_OPEN:
        return _open(state, now_ms, cfg)
    if state.state is CircuitState.OPEN:
        # A request started before the breaker opened: count it, but it must not extend the
        # open period, or stragglers would keep a recovered endpoint shut.
        return replace(state, consecutive_failures=state.consecutive_failures + 1)
    threshold = cfg.fast_failure_threshold if fast else cfg.failure_threshold
    if state.consecutive_failures + 1 >= threshold:
        return _open(state, now_ms, cfg)
    return replace(state, consecutive_failures=state.consecutive_failures + 1)


def on_inconclusive(state: BreakerState) -> BreakerState:
    """A request ended without telling us anything about the endpoint (our own error, egress
    refused, cancelled): free the probe slot so another probe can go, change nothing else."""
    if state.state is CircuitState.HALF_OPEN:
        return replace(state, probe_started_ms=None)
    return state


def next_probe_at_ms(state: BreakerState) -> int | None:
    """When an open breaker will let the next request through; None when not open."""
    if state.state is CircuitState.OPEN:
        return state.open_until_ms
    return None
