"""When a hot partition is read without the archive (control_plane/history/tiered.py); the reads
themselves are tested on the real Cassandra (tests/integration/test_archive.py)."""

from __future__ import annotations

import pytest

from control_plane.history.tiered import whole


@pytest.mark.parametrize(("created", "numbers", "count", "expected"), [
    (True, [], 0, True),  # created, not attempted yet (or skipped)
    (True, [1, 2, 3], 3, True),
    (True, [3, 1, 2], 3, True),  # order read does not matter
    (True, [1, 2, 3], 2, True),  # a manual attempt took number 3
    (True, [], 2, False),  # its attempts expired with the hot TTL
    (True, [3], 2, False),  # a replay after they expired
    (True, [2], 2, False),  # attempt 1 expired a moment before attempt 2
    (True, [1, 3], 2, False),
    (False, [1], 1, False),  # status cells only
])
def test_a_partition_is_whole_with_its_creation_cells_and_every_attempt_it_counts(
        created: bool, numbers: list[int], count: int, expected: bool) -> None:
    assert whole(created, numbers, count) is expected
