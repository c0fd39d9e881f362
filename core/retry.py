"""The retry policy: from one try's result to Succeeded / Retry / GaveUp / DisableEndpoint.

Pure: the clock (``now_ms``, unix ms) and the random source (``rng``) are arguments, so every
branch is tested with fixed values. The policy table (see the seed's response policy):

    2xx (even with a truncated body) .......... Succeeded
    3xx ....................................... GaveUp failed (redirects are never followed)
    408, 429, 5xx, timeout, connect, reset .... Retry  (429/503: bounded Retry-After honoured,
                                                        plus jitter so a storm does not return at once)
    DNS, TLS .................................. Retry  (and a fast failure for the breaker)
    410 ....................................... DisableEndpoint
    other 4xx, egress refused ................. GaveUp failed
    any Retry once attempts are exhausted ..... GaveUp failed
    any Retry that would start past deadline .. GaveUp expired
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

from core.outcomes import (
    DisableEndpoint,
    ErrorClass,
    GaveUp,
    HttpResult,
    Outcome,
    Retry,
    Succeeded,
    classify,
    describe,
    is_fast_failure,
    is_retryable,
    is_success,
)
from core.settings import DispatchSettings

# Re-exported: the dispatcher reads the whole policy from this module.
__all__ = [
    "RetrySchedule",
    "backoff_delay_ms",
    "decide",
    "is_fast_failure",
    "is_success",
    "parse_retry_after",
]

# Retry-After is honoured only where HTTP gives it that meaning for us: rate limiting and
# temporary unavailability. On other statuses it is ignored rather than trusted.
_RETRY_AFTER_STATUSES = frozenset({429, 503})

# RFC 9110 delta-seconds is digits only; a leading minus is tolerated and read as "now".
_DELTA_SECONDS = re.compile(r"\s*(-?\d+)\s*")


@dataclass(frozen=True)
class RetrySchedule:
    base_s: float
    cap_s: float
    max_attempts: int
    deadline_s: float  # absolute, from delivery creation; retries never start after it
    max_retry_after_s: float  # a larger Retry-After is clamped to this
    # Even full jitter's lucky draw waits this long: an instant retry is just another hit on an
    # endpoint that failed a moment ago, and many at once would arrive as a burst.
    min_delay_ms: int = 1000

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.cap_s:
            raise ValueError("need 0 < base_s <= cap_s")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.deadline_s <= 0 or self.max_retry_after_s < 0:
            raise ValueError("deadline_s must be > 0 and max_retry_after_s >= 0")
        if not 0 <= self.min_delay_ms <= self.cap_s * 1000:
            raise ValueError("min_delay_ms must be within [0, cap_s]")

    @classmethod
    def from_settings(cls, settings: DispatchSettings) -> RetrySchedule:
        return cls(
            base_s=settings.retry_base_s,
            cap_s=settings.retry_cap_s,
            max_attempts=settings.max_attempts,
            deadline_s=settings.retry_deadline_s,
            max_retry_after_s=settings.max_retry_after_s,
        )


def backoff_delay_ms(attempt_number: int, schedule: RetrySchedule, rng: random.Random) -> int:
    """Delay before the try that follows try ``attempt_number`` (1-based), in ms.

    Exponential backoff with full jitter::

        ceiling = min(cap, base * 2 ** (attempt_number - 1))
        delay   = max(min_delay, uniform(0, ceiling))

    Full jitter (rather than ``ceiling/2 + jitter``) spreads endpoints that failed together, e.g.
    after a receiver outage, over the whole window, so they do not come back in one wave.
    """
    if attempt_number < 1:
        raise ValueError("attempt_number is 1-based")
    doublings = attempt_number - 1
    # Compare exponents instead of computing 2**doublings: attempt counts can be large and the
    # float product would overflow long after the cap has been reached.
    if doublings >= math.log2(schedule.cap_s / schedule.base_s):
        ceiling_s = schedule.cap_s
    else:
        ceiling_s = schedule.base_s * 2**doublings
    jittered_ms = int(ceiling_s * 1000 * rng.random())
    return max(schedule.min_delay_ms, jittered_ms)


def parse_retry_after(value: str | None, now_ms: int) -> int | None:
    """Retry-After as a delay in ms from ``now_ms``; None when absent or unparseable.

    Accepts delta-seconds (``"120"``) and an HTTP-date (``"Wed, 21 Oct 2015 07:28:00 GMT"``,
    also the obsolete RFC 850 and asctime forms). A negative delta or a date in the past means
    "now" (0). Bounding is the caller's job: this only reads what the endpoint said.
    """
    if value is None:
        return None
    delta = _DELTA_SECONDS.fullmatch(value)
    if delta is not None:
        return max(0, int(delta.group(1)) * 1000)
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        # HTTP-dates are always GMT; the asctime form just does not say so.
        when = when.replace(tzinfo=UTC)
    return max(0, math.ceil(when.timestamp() * 1000) - now_ms)


def _honoured_retry_after_ms(result: HttpResult, now_ms: int, schedule: RetrySchedule) -> int | None:
    if result.status not in _RETRY_AFTER_STATUSES:
        return None
    asked_ms = parse_retry_after(result.retry_after, now_ms)
    if asked_ms is None:
        return None
    # An endpoint must not be able to park a delivery past our own schedule ("Retry-After:
    # 99999999"); the clamp keeps its wish within what we are willing to wait.
    return min(asked_ms, int(schedule.max_retry_after_s * 1000))


# Jitter added on top of an honoured Retry-After: a 429 storm answers every delivery with the same
# value, and without it they would all come back in the same millisecond. A tenth of the wait,
# at least one second (short waits still spread) and at most five minutes.
_RETRY_AFTER_JITTER_FRACTION = 0.1
_RETRY_AFTER_JITTER_MIN_MS = 1_000
_RETRY_AFTER_JITTER_MAX_MS = 300_000


def retry_after_jitter_ms(retry_after_ms: int, rng: random.Random) -> int:
    """Uniform in [0, window) with window = clamp(10 % of the wait, 1 s, 5 min); never negative,
    so the server's "not before" is always respected."""
    window = min(_RETRY_AFTER_JITTER_MAX_MS,
                 max(_RETRY_AFTER_JITTER_MIN_MS, int(retry_after_ms * _RETRY_AFTER_JITTER_FRACTION)))
    return int(window * rng.random())


def decide(
    result: HttpResult,
    attempt_number: int,
    created_at_ms: int,
    now_ms: int,
    schedule: RetrySchedule,
    rng: random.Random,
) -> Outcome:
    """The outcome of try ``attempt_number`` (1-based) of a delivery created at ``created_at_ms``,
    finished at ``now_ms``. Implements the policy table in the module docstring."""
    error_class = classify(result)
    reason = describe(result)
    if error_class is None:
        assert result.status is not None  # classify() only succeeds on a 2xx status
        return Succeeded(status=result.status)
    if error_class is ErrorClass.GONE:
        return DisableEndpoint(reason=f"{reason}: endpoint is gone, disabling it")
    if error_class is ErrorClass.REDIRECT:
        return GaveUp(f"{reason}: redirects are not followed", "failed", error_class)
    if not is_retryable(error_class):
        return GaveUp(f"{reason}: permanent", "failed", error_class)
    if attempt_number >= schedule.max_attempts:
        return GaveUp(
            f"{reason}: max attempts ({schedule.max_attempts}) reached", "failed", error_class
        )
    delay_ms = backoff_delay_ms(attempt_number, schedule, rng)
    retry_after_ms = _honoured_retry_after_ms(result, now_ms, schedule)
    if retry_after_ms is not None:
        delay_ms = max(delay_ms, retry_after_ms + retry_after_jitter_ms(retry_after_ms, rng))
    at_ms = now_ms + delay_ms
    deadline_ms = created_at_ms + int(schedule.deadline_s * 1000)
    if at_ms > deadline_ms:
        return GaveUp(
            f"{reason}: next attempt would start after the deadline", "expired", error_class
        )
    return Retry(at_ms=at_ms, reason=reason, error_class=error_class)
