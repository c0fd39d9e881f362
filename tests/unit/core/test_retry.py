"""The response policy, backoff and Retry-After rules of core/retry.py, as tables.

The clock is fixed (NOW) and the jitter comes from a stub whose ``random()`` returns a chosen
value, so every delay below is exact.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.outcomes import DisableEndpoint, ErrorClass, GaveUp, HttpResult, Outcome, Retry, Succeeded
from core.retry import RetrySchedule, backoff_delay_ms, decide, parse_retry_after, retry_after_jitter_ms
from core.settings import DispatchSettings

E = ErrorClass
NOW = 1_700_000_000_000  # Tue, 14 Nov 2023 22:13:20 GMT
DAY_MS = 24 * 3600 * 1000

SCHEDULE = RetrySchedule(
    base_s=5.0, cap_s=3600.0, max_attempts=20, deadline_s=24 * 3600.0, max_retry_after_s=3600.0
)


class FixedRandom(random.Random):
    """random() always returns ``value``; 0.0 and 1.0 pin the two ends of the jitter window."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


HALF = FixedRandom(0.5)  # first backoff = 0.5 * 5 s = 2500 ms


def summary(outcome: Outcome) -> tuple[str, ErrorClass | None]:
    """The part of an outcome the policy table talks about: what happens, and why."""
    if isinstance(outcome, Succeeded):
        return ("succeeded", None)
    if isinstance(outcome, Retry):
        return ("retry", outcome.error_class)
    if isinstance(outcome, GaveUp):
        return (outcome.final_status, outcome.error_class)
    return ("disable endpoint", outcome.error_class)


SUCCEEDED = ("succeeded", None)


def retry(error_class: ErrorClass) -> tuple[str, ErrorClass]:
    return ("retry", error_class)


def failed(error_class: ErrorClass) -> tuple[str, ErrorClass]:
    return ("failed", error_class)


# The seed's response policy, row by row (first attempt, plenty of time left).
POLICY_TABLE = [
    # status  transport error      -> outcome
    (200, None, SUCCEEDED),
    (201, None, SUCCEEDED),
    (204, None, SUCCEEDED),
    (299, None, SUCCEEDED),
    (200, E.BODY_TOO_LARGE, SUCCEEDED),
    (301, None, failed(E.REDIRECT)),
    (302, None, failed(E.REDIRECT)),
    (304, None, failed(E.REDIRECT)),
    (307, None, failed(E.REDIRECT)),
    (308, None, failed(E.REDIRECT)),
    (400, None, failed(E.HTTP_4XX)),
    (401, None, failed(E.HTTP_4XX)),
    (403, None, failed(E.HTTP_4XX)),
    (404, None, failed(E.HTTP_4XX)),
    (422, None, failed(E.HTTP_4XX)),
    (408, None, retry(E.HTTP_408)),
    (429, None, retry(E.HTTP_429)),
    (410, None, ("disable endpoint", E.GONE)),
    (500, None, retry(E.HTTP_5XX)),
    (502, None, retry(E.HTTP_5XX)),
    (503, None, retry(E.HTTP_5XX)),
    (504, None, retry(E.HTTP_5XX)),
    (500, E.BODY_TOO_LARGE, retry(E.HTTP_5XX)),
    (404, E.BODY_TOO_LARGE, failed(E.HTTP_4XX)),
    (None, E.TIMEOUT, retry(E.TIMEOUT)),
    (None, E.CONNECT, retry(E.CONNECT)),
    (None, E.RESET, retry(E.RESET)),
    (None, E.DNS, retry(E.DNS)),
    (None, E.TLS, retry(E.TLS)),
    (None, E.PROTOCOL, retry(E.PROTOCOL)),
    (None, E.INTERNAL, retry(E.INTERNAL)),
    (None, E.EGRESS_REFUSED, failed(E.EGRESS_REFUSED)),
]


@pytest.mark.parametrize(("status", "error", "expected"), POLICY_TABLE)
def test_response_policy(
    status: int | None, error: ErrorClass | None, expected: tuple[str, ErrorClass | None]
) -> None:
    outcome = decide(HttpResult(status, error), 1, NOW, NOW, SCHEDULE, HALF)
    assert summary(outcome) == expected
    if isinstance(outcome, Retry):
        assert outcome.at_ms == NOW + 2500


def test_outcome_details() -> None:
    assert decide(HttpResult(204), 1, NOW, NOW, SCHEDULE, HALF) == Succeeded(status=204)
    assert decide(HttpResult(503), 1, NOW, NOW, SCHEDULE, HALF) == Retry(
        at_ms=NOW + 2500, reason="HTTP 503", error_class=E.HTTP_5XX
    )
    gone = decide(HttpResult(410), 1, NOW, NOW, SCHEDULE, HALF)
    assert isinstance(gone, DisableEndpoint) and "410" in gone.reason
    moved = decide(HttpResult(301), 1, NOW, NOW, SCHEDULE, HALF)
    assert isinstance(moved, GaveUp) and "redirect" in moved.reason


# -- backoff: min(cap, base * 2**(n-1)) * U(0, 1), never below the 1 s floor ----------------------

BACKOFF_TABLE = [
    # attempt  rng   -> delay ms
    (1, 0.0, 1_000),  # the floor: never an instant retry
    (1, 0.5, 2_500),
    (1, 1.0, 5_000),  # ceiling of attempt 1 = base
    (2, 1.0, 10_000),
    (3, 0.5, 10_000),
    (10, 1.0, 2_560_000),  # 5 s * 2**9, still under the cap
    (11, 1.0, 3_600_000),  # 5 s * 2**10 = 5120 s > cap
    (11, 0.25, 900_000),  # jitter applies to the capped ceiling
    (1_000, 1.0, 3_600_000),
    (10**9, 0.5, 1_800_000),  # huge attempt numbers do not overflow
]


@pytest.mark.parametrize(("attempt", "draw", "expected_ms"), BACKOFF_TABLE)
def test_backoff(attempt: int, draw: float, expected_ms: int) -> None:
    assert backoff_delay_ms(attempt, SCHEDULE, FixedRandom(draw)) == expected_ms


def test_backoff_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError):
        backoff_delay_ms(0, SCHEDULE, HALF)


@given(attempt=st.integers(min_value=1, max_value=10**6), seed=st.integers())
def test_backoff_stays_within_floor_and_cap(attempt: int, seed: int) -> None:
    delay = backoff_delay_ms(attempt, SCHEDULE, random.Random(seed))
    assert SCHEDULE.min_delay_ms <= delay <= SCHEDULE.cap_s * 1000


# -- Retry-After -----------------------------------------------------------------------------------

RETRY_AFTER_TABLE = [
    # header value                          -> delay ms from NOW
    (None, None),
    ("120", 120_000),
    (" 7 ", 7_000),
    ("0", 0),
    ("-5", 0),  # negative means "now"
    ("1.5", None),  # delta-seconds are whole numbers
    ("soon", None),
    ("", None),
    ("Tue, 14 Nov 2023 22:13:50 GMT", 30_000),  # IMF-fixdate
    ("Tuesday, 14-Nov-23 22:13:50 GMT", 30_000),  # obsolete RFC 850 form
    ("Tue Nov 14 22:13:50 2023", 30_000),  # obsolete asctime form, GMT implied
    ("Tue, 14 Nov 2023 22:00:00 GMT", 0),  # in the past
    ("Tue, 31 Nov 2023 22:13:50 GMT", None),  # no such day
]


@pytest.mark.parametrize(("value", "expected_ms"), RETRY_AFTER_TABLE)
def test_parse_retry_after(value: str | None, expected_ms: int | None) -> None:
    assert parse_retry_after(value, NOW) == expected_ms


@given(st.text())
def test_parse_retry_after_never_raises(value: str) -> None:
    parsed = parse_retry_after(value, NOW)
    assert parsed is None or parsed >= 0


RETRY_AFTER_POLICY = [
    # status  Retry-After                         -> next attempt (backoff alone = +2500 ms;
    #                                                Retry-After + half of its jitter window)
    (429, "30", NOW + 31_500),
    (503, "30", NOW + 31_500),
    (503, "1", NOW + 2_500),  # the later of backoff and Retry-After (1 s + 0.5 s)
    (429, "99999", NOW + 3_750_000),  # clamped to max_retry_after_s, jitter window capped at 5 min
    (429, "Tue, 14 Nov 2023 22:14:20 GMT", NOW + 63_000),
    (429, "garbage", NOW + 2_500),
    (500, "30", NOW + 2_500),  # only 429 and 503 carry Retry-After for us
    (408, "30", NOW + 2_500),
]


@pytest.mark.parametrize(("status", "header", "at_ms"), RETRY_AFTER_POLICY)
def test_retry_after_is_honoured_within_bounds(status: int, header: str, at_ms: int) -> None:
    outcome = decide(HttpResult(status, retry_after=header), 1, NOW, NOW, SCHEDULE, HALF)
    assert isinstance(outcome, Retry)
    assert outcome.at_ms == at_ms


# -- when retrying stops -----------------------------------------------------------------------

STOP_TABLE = [
    # attempt  created_at             result                 rng  -> outcome
    (19, NOW, HttpResult(503), 0.5, retry(E.HTTP_5XX)),
    (20, NOW, HttpResult(503), 0.5, failed(E.HTTP_5XX)),  # max attempts
    (25, NOW, HttpResult(None, E.TIMEOUT), 0.5, failed(E.TIMEOUT)),
    # deadline = created + 24 h = NOW + 3000 ms
    (1, NOW - DAY_MS + 3_000, HttpResult(503), 0.5, retry(E.HTTP_5XX)),  # at NOW+2500: in time
    (1, NOW - DAY_MS + 2_500, HttpResult(503), 0.5, retry(E.HTTP_5XX)),  # exactly at: allowed
    (1, NOW - DAY_MS + 3_000, HttpResult(503), 0.9, ("expired", E.HTTP_5XX)),  # at NOW+4500
    (1, NOW - DAY_MS + 3_000, HttpResult(429, retry_after="10"), 0.5, ("expired", E.HTTP_429)),
    (1, NOW - 2 * DAY_MS, HttpResult(None, E.DNS), 0.0, ("expired", E.DNS)),
    # permanent failures are "failed" even past the deadline; attempts are checked first
    (1, NOW - 2 * DAY_MS, HttpResult(404), 0.5, failed(E.HTTP_4XX)),
    (20, NOW - 2 * DAY_MS, HttpResult(503), 0.5, failed(E.HTTP_5XX)),
    # success is success whenever it comes
    (20, NOW - 2 * DAY_MS, HttpResult(200), 0.5, SUCCEEDED),
]


@pytest.mark.parametrize(("attempt", "created_at", "result", "draw", "expected"), STOP_TABLE)
def test_retry_stops(
    attempt: int,
    created_at: int,
    result: HttpResult,
    draw: float,
    expected: tuple[str, ErrorClass | None],
) -> None:
    outcome = decide(result, attempt, created_at, NOW, SCHEDULE, FixedRandom(draw))
    assert summary(outcome) == expected


def test_reasons_say_why_it_stopped() -> None:
    exhausted = decide(HttpResult(503), 20, NOW, NOW, SCHEDULE, HALF)
    assert isinstance(exhausted, GaveUp) and "max attempts (20)" in exhausted.reason
    expired = decide(HttpResult(503), 1, NOW - DAY_MS, NOW, SCHEDULE, HALF)
    assert isinstance(expired, GaveUp) and "deadline" in expired.reason


RETRYABLE = [HttpResult(s) for s in (408, 429, 500, 503)] + [
    HttpResult(None, e) for e in (E.TIMEOUT, E.CONNECT, E.RESET, E.DNS, E.TLS)
]


@given(
    result=st.sampled_from(RETRYABLE),
    retry_after=st.one_of(st.none(), st.integers(min_value=-10, max_value=10**7).map(str)),
    attempt=st.integers(min_value=1, max_value=30),
    age_ms=st.integers(min_value=0, max_value=2 * DAY_MS),
    seed=st.integers(),
)
def test_a_retry_never_passes_the_deadline_or_the_bounds(
    result: HttpResult, retry_after: str | None, attempt: int, age_ms: int, seed: int
) -> None:
    result = HttpResult(result.status, result.error, retry_after=retry_after)
    created_at = NOW - age_ms
    outcome = decide(result, attempt, created_at, NOW, SCHEDULE, random.Random(seed))
    if isinstance(outcome, Retry):
        assert outcome.at_ms <= created_at + DAY_MS
        longest_ms = max(SCHEDULE.cap_s, SCHEDULE.max_retry_after_s) * 1000 + 300_000  # + jitter window
        assert NOW + SCHEDULE.min_delay_ms <= outcome.at_ms <= NOW + longest_ms
        assert attempt < SCHEDULE.max_attempts
    else:
        assert isinstance(outcome, GaveUp)
        assert outcome.final_status == "failed" or outcome.reason.endswith("deadline")


def test_schedule_from_settings() -> None:
    settings = DispatchSettings()
    assert RetrySchedule.from_settings(settings) == RetrySchedule(
        base_s=settings.retry_base_s,
        cap_s=settings.retry_cap_s,
        max_attempts=settings.max_attempts,
        deadline_s=settings.retry_deadline_s,
        max_retry_after_s=settings.max_retry_after_s,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_s": 0.0},
        {"base_s": 10.0, "cap_s": 5.0},
        {"max_attempts": 0},
        {"deadline_s": 0.0},
        {"min_delay_ms": 10_000_000},
    ],
)
def test_schedule_refuses_nonsense(kwargs: dict[str, float]) -> None:
    fields: dict[str, float] = {
        "base_s": 5.0, "cap_s": 3600.0, "max_attempts": 20, "deadline_s": 86400.0,
        "max_retry_after_s": 3600.0,
    }
    with pytest.raises(ValueError):
        RetrySchedule(**{**fields, **kwargs})  # type: ignore[arg-type]


RETRY_AFTER_JITTER = [
    # Retry-After ms, rng value -> jitter ms (window: 10 %, at least 1 s, at most 5 min)
    (60_000, 0.0, 0),
    (60_000, 0.5, 3_000),
    (60_000, 0.999, 5_994),
    (2_000, 0.5, 500),  # the 1 s floor
    (3_600_000, 0.5, 150_000),  # the 5 min cap
]


@pytest.mark.parametrize(("retry_after_ms", "r", "jitter_ms"), RETRY_AFTER_JITTER)
def test_retry_after_jitter_is_bounded(retry_after_ms: int, r: float, jitter_ms: int) -> None:
    assert retry_after_jitter_ms(retry_after_ms, FixedRandom(r)) == jitter_ms


def test_a_429_storm_does_not_come_back_in_the_same_millisecond() -> None:
    """Defect 10: 1,000 deliveries answered 429 Retry-After: 60 at the same moment."""
    rng = random.Random(7)
    times = [decide(HttpResult(429, retry_after="60"), 1, NOW, NOW, SCHEDULE, rng) for _ in range(1000)]
    at = [o.at_ms for o in times if isinstance(o, Retry)]
    assert len(at) == 1000
    assert min(at) >= NOW + 60_000  # the server's "not before" holds
    assert max(at) < NOW + 66_000  # bounded
    assert len(set(at)) > 900  # spread, not one wave
