"""When a hot partition is read without the archive, and how replay audit rows of both tiers join
(control_plane/tiered_history.py); the reads themselves are tested on the real Cassandra
(tests/integration/test_archive.py)."""

from __future__ import annotations

import pytest

from control_plane.tiered_history import merge_replays, whole


@pytest.mark.parametrize(("created", "numbers", "expected"), [
    (True, [], True),  # created, not attempted yet
    (True, [1, 2, 3], True),
    (True, [3, 1, 2], True),  # order read does not matter
    (False, [2], False),  # a replay's rows outliving the released ones: the defect's partition
    (False, [], False),  # status cells only
    (True, [2], False),  # attempt 1 expired a moment before the creation cells
    (True, [1, 3], False),
])
def test_a_partition_is_whole_with_its_creation_cells_and_attempts_from_one_without_a_gap(
        created: bool, numbers: list[int], expected: bool) -> None:
    assert whole(created, numbers) is expected


def test_replay_rows_join_by_request_id_and_the_hot_row_wins() -> None:
    archived = [{"request_id": "rpl_1", "reason": "archived"}, {"request_id": "rpl_2", "reason": "archived"}]
    hot = [{"request_id": "rpl_2", "reason": "hot"}, {"request_id": "rpl_3", "reason": "hot"}]
    joined = sorted(merge_replays(hot, archived), key=lambda r: r["request_id"])
    assert [(r["request_id"], r["reason"]) for r in joined] == [("rpl_1", "archived"), ("rpl_2", "hot"),
                                                                ("rpl_3", "hot")]
