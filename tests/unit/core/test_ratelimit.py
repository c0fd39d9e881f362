"""Token bucket: exact refill and wait times with a fixed clock, plus properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.ratelimit import TokenBucket, new_bucket, reconfigure, try_take

NOW = 1_700_000_000_000


def take_n(bucket: TokenBucket, n: int, at_ms: int) -> tuple[int, TokenBucket, int]:
    """Take up to n tokens at one instant; returns how many were taken and the last wait_ms."""
    taken, wait_ms = 0, 0
    for _ in range(n):
        ok, bucket, wait_ms = try_take(bucket, at_ms)
        taken += ok
    return taken, bucket, wait_ms


def test_unlimited_always_allows_and_stores_nothing_new() -> None:
    bucket = new_bucket(None, NOW)
    taken, after, wait_ms = take_n(bucket, 10_000, NOW)
    assert (taken, after, wait_ms) == (10_000, bucket, 0)


BUCKET_TABLE = [
    # rate/s  burst  asked at NOW  -> taken  wait for the next one (ms)
    (10.0, None, 11, 10, 100),  # default burst = one second's worth
    (10.0, 3.0, 5, 3, 100),
    (0.5, None, 2, 1, 2_000),  # default burst never below one request
    (3.0, None, 4, 3, 334),  # rounded up, so waiting exactly that long is enough
    (1000.0, 1.0, 2, 1, 1),
]


@pytest.mark.parametrize(("rate", "burst", "asked", "taken", "wait_ms"), BUCKET_TABLE)
def test_burst_then_wait(rate: float, burst: float | None, asked: int, taken: int, wait_ms: int) -> None:
    bucket = new_bucket(rate, NOW, burst)
    got, bucket, last_wait = take_n(bucket, asked, NOW)
    assert (got, last_wait) == (taken, wait_ms)
    ok, _, _ = try_take(bucket, NOW + wait_ms)
    assert ok


def test_refill_is_capped_at_burst() -> None:
    bucket = new_bucket(10.0, NOW)
    _, bucket, _ = take_n(bucket, 10, NOW)
    taken, _, _ = take_n(bucket, 100, NOW + 3_600_000)  # an hour idle still allows only a burst
    assert taken == 10


def test_a_clock_stepping_back_refills_nothing() -> None:
    bucket = new_bucket(10.0, NOW, burst=1.0)
    _, bucket, _ = take_n(bucket, 1, NOW)
    ok, bucket, wait_ms = try_take(bucket, NOW - 5_000)
    assert (ok, wait_ms, bucket.updated_ms) == (False, 100, NOW)
    ok, _, _ = try_take(bucket, NOW + 100)
    assert ok


def test_reconfigure_keeps_what_was_spent() -> None:
    bucket = new_bucket(10.0, NOW)
    _, bucket, _ = take_n(bucket, 10, NOW)
    slower = reconfigure(bucket, 1.0)
    assert (slower.rate_per_s, slower.burst, slower.tokens) == (1.0, 1.0, 0.0)
    ok, _, wait_ms = try_take(slower, NOW)
    assert (ok, wait_ms) == (False, 1_000)
    assert try_take(reconfigure(bucket, None), NOW)[0]


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.5)])
def test_refuses_nonsense(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        new_bucket(rate, NOW, burst)


@given(
    rate=st.floats(min_value=0.01, max_value=10_000),
    burst=st.floats(min_value=1, max_value=1_000),
    steps=st.lists(st.integers(min_value=0, max_value=5_000), min_size=1, max_size=200),
)
def test_never_more_than_burst_plus_refill(rate: float, burst: float, steps: list[int]) -> None:
    bucket = new_bucket(rate, NOW, burst)
    now, taken = NOW, 0
    for step in steps:
        now += step
        ok, bucket, wait_ms = try_take(bucket, now)
        taken += ok
        if not ok:
            # The promised wait is enough: one token is there after exactly wait_ms.
            assert wait_ms >= 1
            assert try_take(bucket, now + wait_ms)[0]
    assert taken <= burst + rate * (now - NOW) / 1000 + 1e-6
