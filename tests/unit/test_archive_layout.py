"""The archive's layout, manifest and verification verdict (core/archive_layout.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core import archive_layout as layout

H = int(datetime(2026, 11, 29, 19, tzinfo=UTC).timestamp() * 1000)
DAY = 86_400_000


def entry(path: str, kind: str = "deliveries", rows: int = 2, sha: str = "a" * 64, lo: str = "d1",
          hi: str = "d2", bucket: int = 3) -> layout.FileEntry:
    return layout.FileEntry(path=path, kind=kind, bucket=bucket, rows=rows, bytes=100, sha256=sha, min_id=lo,
                            max_id=hi)


def test_paths_are_hive_partitions_by_date_hour_and_tenant_bucket():
    assert layout.data_path(H, 7, "events") == "date=2026-11-29/hour=19/tenant_bucket=07/events.parquet"
    assert layout.manifest_path(H) == "date=2026-11-29/hour=19/manifest.json"
    with pytest.raises(ValueError):
        layout.data_path(H, 7, "payloads")


@pytest.mark.parametrize("path, tmp", [
    ("date=2026-11-29/hour=19/tenant_bucket=07/events.parquet", False),
    ("date=2026-11-29/hour=19/tenant_bucket=07/events.parquet.tmp-ab12", True),
    ("date=2026-11-29/hour=19/manifest.json.tmp-x", True),
])
def test_temporary_names_are_recognised(path, tmp):
    assert layout.is_tmp(path) is tmp
    if not tmp:
        assert layout.is_tmp(layout.tmp_path(path, "run1"))


def test_tenant_bucket_is_stable_and_in_range():
    # Pinned: a different hash would move every tenant's files.
    assert layout.tenant_bucket("t-acme") == layout.tenant_bucket("t-acme")
    assert [layout.tenant_bucket(f"t{i}") for i in range(3)] == [
        int(__import__("hashlib").sha256(f"t{i}".encode()).hexdigest()[:8], 16) % 16 for i in range(3)]
    assert {layout.tenant_bucket(f"tenant-{i}") for i in range(500)} == set(range(layout.TENANT_BUCKETS))


@pytest.mark.parametrize("now, after_h, expect_first, expect_last", [
    # 3 days after: the last hour archived ends at or before now - 3 d.
    (H + 3 * DAY + 3_600_000, 72, H - 27 * DAY + 3_600_000, H),
    (H + 3 * DAY + 3_599_999, 72, H - 27 * DAY + 3_600_000, H - 3_600_000),
])
def test_closed_hours_are_old_enough_and_still_in_the_window(now, after_h, expect_first, expect_last):
    hours = layout.closed_hours(now, after_h * 3_600_000, 30 * DAY)
    assert hours[0] == expect_first and hours[-1] == expect_last
    assert all(b - a == 3_600_000 for a, b in zip(hours, hours[1:], strict=False))


def test_manifest_round_trips_byte_for_byte_and_rejects_a_tampered_count():
    m = layout.Manifest(H, (entry("b"), entry("a", kind="events", lo="e1", hi="e9")))
    raw = m.to_json()
    assert layout.Manifest.from_json(raw).to_json() == raw
    assert layout.Manifest(H, tuple(reversed(m.files))).to_json() == raw  # order of files does not matter
    assert m.counts() == {"events": 2, "deliveries": 2, "attempts": 0, "replays": 0}
    with pytest.raises(ValueError, match="counts"):
        layout.Manifest.from_json(raw.replace(b'"deliveries": 2', b'"deliveries": 3'))


def hot(*rows: tuple[str, str]) -> layout.HourCounts:
    c = layout.HourCounts()
    for kind, rid in rows:
        c.add(kind, rid)
    return c


GOOD = layout.Manifest(H, (entry("f1"),))
FINE = [layout.ReadBack("f1", "a" * 64, 2)]


@pytest.mark.parametrize("read_back, cassandra, expected", [
    (FINE, hot(("deliveries", "d1"), ("deliveries", "d2")), []),
    ([layout.ReadBack("f1", None, None)], hot(("deliveries", "d1"), ("deliveries", "d2")), ["f1: missing"]),
    ([layout.ReadBack("f1", "b" * 64, 2)], hot(("deliveries", "d1"), ("deliveries", "d2")),
     ["f1: checksum bbbbbbbbbbbb != manifest aaaaaaaaaaaa"]),
    ([layout.ReadBack("f1", "a" * 64, 1)], hot(("deliveries", "d1"), ("deliveries", "d2")),
     ["f1: 1 rows != manifest 2"]),
    (FINE, hot(("deliveries", "d1"), ("deliveries", "d2"), ("deliveries", "d3")),
     ["deliveries: archive 2 rows, Cassandra 3"]),
    (FINE, hot(("deliveries", "d1"), ("deliveries", "d3")), ["deliveries: id range differs from Cassandra's"]),
    (FINE, hot(("deliveries", "d1"), ("deliveries", "d2"), ("attempts", "d1")),
     ["attempts: archive 0 rows, Cassandra 1"]),
])
def test_an_hour_is_verified_only_when_files_manifest_and_cassandra_agree(read_back, cassandra, expected):
    assert layout.disagreements(GOOD, read_back, cassandra) == expected


def test_counts_of_a_manifest_span_its_files():
    m = layout.Manifest(H, (entry("f1", lo="d3", hi="d9"), entry("f2", lo="d1", hi="d4", bucket=5)))
    c = layout.HourCounts.of(m)
    assert (c.counts["deliveries"], c.min_ids["deliveries"], c.max_ids["deliveries"]) == (4, "d1", "d9")
