"""Per-endpoint token bucket as a frozen value, so it lives in keyed (checkpointed) state.

A bucket holds up to ``burst`` tokens and refills at ``rate_per_s``; each request takes one.
``rate_per_s`` None means the endpoint set no limit: every take succeeds and nothing is stored
that could drift. Refill is computed lazily from ``updated_ms`` on each take, so no timer runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# Float refill can land a hair under a whole token after waiting exactly the promised wait_ms;
# this tolerance keeps that promise.
_ROUNDING = 1e-9


@dataclass(frozen=True)
class TokenBucket:
    rate_per_s: float | None
    burst: float
    tokens: float
    updated_ms: int

    def __post_init__(self) -> None:
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ValueError("rate_per_s must be > 0 (or None for unlimited)")
        if self.burst < 1:
            raise ValueError("burst must be >= 1, or no request could ever pass")


def new_bucket(rate_per_s: float | None, now_ms: int, burst: float | None = None) -> TokenBucket:
    """A full bucket. Default burst: one second's worth of requests, and at least one."""
    if burst is None:
        burst = max(1.0, rate_per_s or 1.0)
    return TokenBucket(rate_per_s=rate_per_s, burst=burst, tokens=burst, updated_ms=now_ms)


def reconfigure(
    bucket: TokenBucket, rate_per_s: float | None, burst: float | None = None
) -> TokenBucket:
    """Apply a changed endpoint limit, keeping the tokens already spent.

    Rebuilding a full bucket instead would hand out a fresh burst on every config update.
    """
    fresh = new_bucket(rate_per_s, bucket.updated_ms, burst)
    return replace(fresh, tokens=min(bucket.tokens, fresh.burst))


def _refilled(bucket: TokenBucket, now_ms: int) -> TokenBucket:
    assert bucket.rate_per_s is not None
    # A clock that steps backwards refills nothing and does not move updated_ms back, so the
    # same interval is never credited twice.
    elapsed_ms = max(0, now_ms - bucket.updated_ms)
    tokens = min(bucket.burst, bucket.tokens + elapsed_ms * bucket.rate_per_s / 1000)
    return replace(bucket, tokens=tokens, updated_ms=max(now_ms, bucket.updated_ms))


def try_take(bucket: TokenBucket, now_ms: int) -> tuple[bool, TokenBucket, int]:
    """Take one token. Returns (taken, new bucket, wait_ms).

    ``wait_ms`` is 0 when taken, else how long until one token will be there, rounded up so a
    retry after exactly ``wait_ms`` succeeds (the dispatcher sets a timer for it).
    """
    rate = bucket.rate_per_s
    if rate is None:
        return True, bucket, 0
    bucket = _refilled(bucket, now_ms)
    if bucket.tokens >= 1 - _ROUNDING:
        return True, replace(bucket, tokens=max(0.0, bucket.tokens - 1)), 0
    wait_ms = math.ceil((1 - bucket.tokens) * 1000 / rate)
    return False, bucket, max(1, wait_ms)


def available(bucket: TokenBucket, now_ms: int) -> tuple[int, int]:
    """Whole tokens available now without taking any, and (when none) ms until one is: lets the
    dispatcher ask for no more tenant slots than the bucket would let it use."""
    rate = bucket.rate_per_s
    if rate is None:
        return 1 << 30, 0
    bucket = _refilled(bucket, now_ms)
    whole = int(bucket.tokens + _ROUNDING)
    if whole >= 1:
        return whole, 0
    return 0, max(1, math.ceil((1 - bucket.tokens) * 1000 / rate))
