"""Archiver shards over an hour's tenant buckets, and the hour's manifest from its buckets'
parts (core/archive_layout.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core import archive_layout as layout

H = int(datetime(2026, 11, 29, 19, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 8, 16, 17, 128])
def test_every_bucket_of_every_hour_belongs_to_exactly_one_shard_and_the_work_is_even(count):
    hours = [H + k * layout.HOUR_MS for k in range(24)]
    per_shard = [0] * count
    for hour in hours:
        shards = [layout.shard_buckets(i, count, hour) for i in range(count)]
        assert sorted(b for s in shards for b in s) == list(layout.ALL_BUCKETS)
        for i, s in enumerate(shards):
            per_shard[i] += len(s)
    # Over a day no shard gets more than its share, rounded up (128 shards: 3 buckets each).
    assert max(per_shard) - min(per_shard) <= 1


@pytest.mark.parametrize(("index", "count", "expected"), [
    (0, 1, tuple(range(16))),
    (0, 4, (0, 4, 8, 12)),   # a count dividing 16: the same buckets every hour
    (3, 4, (3, 7, 11, 15)),
    (0, 128, ()),            # more shards than buckets: turns by hour
])
def test_which_buckets_a_shard_takes(index, count, expected):
    assert layout.shard_buckets(index, count, H) == expected
    if count <= 16:
        assert layout.shard_buckets(index, count, H + layout.HOUR_MS) == expected


def test_with_more_shards_than_buckets_each_hour_goes_to_the_next_sixteen():
    hour_number = H // layout.HOUR_MS
    owner = {b: (hour_number * 16 + b) % 128 for b in layout.ALL_BUCKETS}
    assert all(layout.shard_buckets(i, 128, H) == (b,) for b, i in owner.items())


@pytest.mark.parametrize(("text", "expected"), [("0/1", (0, 1)), ("3/4", (3, 4)), ("127/128", (127, 128))])
def test_a_shard_is_written_i_of_n(text, expected):
    assert layout.parse_shard(text) == expected


@pytest.mark.parametrize("text", ["1/1", "4/4", "-1/2", "0/0", "0/5000", "a/b", "1", "0/2/3"])
def test_a_shard_that_names_no_buckets_is_refused(text):
    with pytest.raises(ValueError, match="shard"):
        layout.parse_shard(text)


def entry(bucket: int, kind: str, rows: int) -> layout.FileEntry:
    return layout.FileEntry(path=layout.data_path(H, bucket, kind), kind=kind, bucket=bucket, rows=rows, bytes=10,
                            sha256="a" * 64, min_id=f"d{bucket}", max_id=f"d{bucket}z")


def test_the_hour_manifest_from_parts_is_the_one_a_single_writer_makes_in_any_order():
    files = [entry(3, "events", 2), entry(3, "deliveries", 4), entry(10, "deliveries", 1), entry(10, "attempts", 2)]
    whole = layout.Manifest(H, tuple(files))
    parts = [layout.Manifest(H, tuple(f for f in files if f.bucket == b)) for b in layout.ALL_BUCKETS]
    assert layout.Manifest.assemble(H, reversed(parts)).to_json() == whole.to_json()
    assert layout.Manifest.assemble(H, parts).of_buckets([3]).counts() == {
        "events": 2, "deliveries": 4, "attempts": 0, "replays": 0}
    assert layout.Manifest.assemble(H, parts).of_buckets([0, 1]).files == ()
    with pytest.raises(ValueError, match="another hour"):
        layout.Manifest.assemble(H, [*parts, layout.Manifest(H + layout.HOUR_MS, ())])


def test_a_bucket_has_its_part_and_released_mark_beside_its_files():
    assert layout.part_path(H, 7) == "date=2026-11-29/hour=19/tenant_bucket=07/part.json"
    assert layout.released_path(H, 7) == "date=2026-11-29/hour=19/tenant_bucket=07/released.json"
    assert layout.releasing_path(H, 7) == "date=2026-11-29/hour=19/tenant_bucket=07/releasing.json"
    assert not layout.is_tmp(layout.part_path(H, 7))
