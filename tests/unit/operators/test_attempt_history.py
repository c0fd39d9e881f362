"""Attempt history rules that need no Cassandra: which status write wins, and what a reserved
attempt row means when it is shown (tests/integration/test_history_store.py runs them for real)."""

from __future__ import annotations

import pytest

from control_plane.domain import NO_OUTCOME, attempt_outcome
from operators.history_store import status_write_ts

DAY_MS = 86_400_000


@pytest.mark.parametrize(
    ("earlier", "later", "winner"),
    [
        ("pending", "pending", "later"),
        ("pending", "failed", "later"),
        ("failed", "pending", "earlier"),  # a stale retry never reopens a final delivery
        ("succeeded", "expired", "earlier"),
        ("failed", "succeeded", "later"),  # a manual replay's success
        ("succeeded", "failed", "earlier"),  # a manual replay's failure
        ("expired", "failed", "later"),  # both final, same band: the later write
    ],
)
def test_status_bands(earlier: str, later: str, winner: str) -> None:
    # `later` is written 29 days after `earlier` (the history window is 30).
    first, second = status_write_ts(earlier, 1_000_000), status_write_ts(later, 1_000_000 + 29 * DAY_MS)
    assert (first > second) == (winner == "earlier")


def test_a_creation_row_written_later_loses_to_any_final_status() -> None:
    created_later_us = (1_000_000 + 29 * DAY_MS) * 1000  # creation rows: USING TIMESTAMP created_at
    assert status_write_ts("failed", 1_000_000) > created_later_us


@pytest.mark.parametrize(
    ("outcome", "number", "shown"),
    [
        ("retry", 1, "retry"),
        ("reserved", 3, "reserved"),  # the next request (automatic, or a manual replay in flight)
        ("reserved", 2, NO_OUTCOME),  # superseded: the worker died with it in flight
        ("", 3, ""),
    ],
)
def test_reserved_rows_are_shown_by_what_they_mean(outcome: str, number: int, shown: str) -> None:
    assert attempt_outcome(outcome, number, 3) == shown
