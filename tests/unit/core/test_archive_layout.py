"""The archive's layout, segment commit records and the audit's verdict (core/archive_layout.py)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from core import archive_layout as layout

H = int(datetime(2026, 11, 29, 19, tzinfo=UTC).timestamp() * 1000)
DAY = 86_400_000


def test_paths_are_hive_partitions_by_date_hour_and_tenant_bucket_named_by_segment():
    seg = layout.segment_id({0: (100, 199), 3: (7, 9)})
    assert layout.data_path(H, 7, "events", seg) == f"date=2026-11-29/hour=19/tenant_bucket=07/events-{seg}.parquet"
    assert layout.commit_path(H, 7, seg) == f"date=2026-11-29/hour=19/tenant_bucket=07/_segments/{seg}.json"
    with pytest.raises(ValueError):
        layout.data_path(H, 7, "payloads", seg)


def test_a_segment_is_named_by_its_offsets_alone():
    assert layout.segment_id({3: (7, 9), 0: (100, 199)}) == layout.segment_id({0: (100, 199), 3: (7, 9)})
    assert layout.segment_id({0: (100, 199)}) != layout.segment_id({0: (100, 200)})
    assert len(layout.segment_id({0: (0, 0)})) == 20


@pytest.mark.parametrize("path, tmp", [
    ("date=2026-11-29/hour=19/tenant_bucket=07/events-abc.parquet", False),
    ("date=2026-11-29/hour=19/tenant_bucket=07/events-abc.parquet.tmp-ab12", True),
    ("date=2026-11-29/hour=19/tenant_bucket=07/_segments/abc.json.tmp-x", True),
])
def test_temporary_names_are_recognised(path, tmp):
    assert layout.is_tmp(path) is tmp
    if not tmp:
        assert layout.is_tmp(layout.tmp_path(path, "run1"))


def test_tenant_bucket_is_stable_and_in_range():
    # Pinned: a different hash would move every tenant's files.
    assert [layout.tenant_bucket(f"t{i}") for i in range(3)] == [
        int(hashlib.sha256(f"t{i}".encode()).hexdigest()[:8], 16) % 16 for i in range(3)]
    assert {layout.tenant_bucket(f"tenant-{i}") for i in range(500)} == set(range(layout.TENANT_BUCKETS))


@pytest.mark.parametrize("now, after_h, expect_first, expect_last", [
    # 26 h after: the last hour due ends at or before now - 26 h; the first started within 4 days.
    (H + 27 * 3_600_000, 26, H - 69 * 3_600_000, H),
    (H + 27 * 3_600_000 - 1, 26, H - 69 * 3_600_000, H - 3_600_000),
])
def test_hours_due_for_the_audit_are_old_enough_and_still_hot(now, after_h, expect_first, expect_last):
    hours = layout.closed_hours(now, after_h * 3_600_000, 4 * DAY)
    assert hours[0] == expect_first and hours[-1] == expect_last
    assert all(b - a == 3_600_000 for a, b in zip(hours, hours[1:], strict=False))


def entry(path: str, kind: str = "deliveries", size: int = 100) -> layout.FileEntry:
    return layout.FileEntry(path=path, kind=kind, rows=2, bytes=size, sha256="a" * 64)


def test_a_commit_record_round_trips_byte_for_byte():
    c = layout.Commit(H, 7, "seg1", ((0, 1, 9),), (entry("b"), entry("a", kind="events")))
    raw = c.to_json()
    assert layout.Commit.from_json(raw).to_json() == raw
    assert layout.Commit(H, 7, "seg1", ((0, 1, 9),), tuple(reversed(c.files))).to_json() == raw
    with pytest.raises(ValueError, match="format"):
        layout.Commit.from_json(raw.replace(b'"format": 2', b'"format": 1'))


COMMITS = [layout.Commit(H, 3, "s1", ((0, 0, 5),), (entry("f1"), entry("f2", kind="attempts")))]
STORED = [layout.Stored("f1", 100), layout.Stored("f2", 100)]


A, B = ("t1", "e1"), ("t1", "e2")


def audit(hot: dict[tuple[str, str], int], archived: dict[tuple[str, str], int],
          listed: set[str] | None = None, archived_listed: set[str] | None = None, short: list[str] | None = None,
          hot_events: set[str] | None = None, events: set[str] | None = None) -> layout.HourAudit:
    return layout.HourAudit(hot, archived, listed or set(), archived_listed or set(), hot_events or set(),
                            events or set(), short or [])


@pytest.mark.parametrize("hot, archived, expected", [
    ({A: 3, B: 2}, {A: 3, B: 2}, []),
    ({A: 3, B: 2}, {A: 3, B: 1}, [B]),
    ({A: 3}, {}, [A]),
    # More archived than listed (an index row never written): listed too, so nothing hides
    # behind a count.
    ({A: 3}, {A: 4, B: 1}, [A]),
    ({}, {B: 1}, []),
])
def test_only_endpoints_whose_counts_differ_are_listed_id_by_id(hot, archived, expected):
    assert layout.uneven(hot, archived) == expected


@pytest.mark.parametrize("stored, found, expected", [
    (STORED, audit({A: 2}, {A: 2}), []),
    ([layout.Stored("f1", 100)], audit({A: 1}, {A: 1}), ["f2: missing"]),
    ([layout.Stored("f1", 100), layout.Stored("f2", 7)], audit({A: 1}, {A: 1}), ["f2: 7 bytes != committed 100"]),
    (STORED, audit({A: 3, B: 5}, {A: 1, B: 5}, listed={"d1", "d2", "d3"}, archived_listed={"d1"}),
     ["deliveries: 2 of 8 not archived (e.g. d2)"]),
    (STORED, audit({A: 1}, {A: 1}, short=["d1"]),
     ["attempts: 1 deliveries with fewer attempts archived than counted (e.g. d1)"]),
    (STORED, audit({}, {}, hot_events={"e1", "e2"}, events={"e2"}), ["events: 1 of 2 not archived (e.g. e1)"]),
    # More in the archive than Cassandra lists (e.g. a delivery whose index row was never
    # written) is not a gap of the archive.
    (STORED, audit({A: 1}, {A: 2}, listed={"d1"}, archived_listed={"d1", "d9"}), []),
])
def test_an_hour_passes_its_audit_only_with_every_file_and_every_listed_key_archived(stored, found, expected):
    assert layout.problems(COMMITS, stored, found) == expected
