"""core/bucket_tally.py: batched cumulative bucket counts add up to per-value increments."""

from __future__ import annotations

from collections import Counter

import pytest

from core.bucket_tally import BucketTally
from core.telemetry import bucket_labels

TALLY_TABLE = [
    # values observed between two drains
    [],
    [0],
    [10],  # on a bound: in that bucket (le)
    [11, 24, 25, 26],
    [3, 3, 3, 700, 9_999, 10_001],
    [400_000],  # past the last bound: "inf" only
    [5, 60, 120, 300, 800, 2_000, 4_000, 8_000, 20_000, 50_000, 100_000, 300_000, 300_001],
]


@pytest.mark.parametrize("values", TALLY_TABLE)
def test_a_drain_gives_what_one_increment_per_label_per_value_would(values: list[int]) -> None:
    tally = BucketTally()
    for v in values:
        tally.observe(v)
    expected = Counter(label for v in values for label in bucket_labels(v))
    assert dict(tally.drain()) == dict(expected)


def test_a_drain_starts_the_next_tally_from_zero() -> None:
    tally = BucketTally()
    tally.observe(30)
    assert dict(tally.drain())["inf"] == 1
    assert tally.drain() == []  # nothing moved since
    tally.observe(30)
    assert dict(tally.drain())["inf"] == 1
