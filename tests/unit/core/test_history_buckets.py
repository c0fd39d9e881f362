"""The bucket of an endpoint's history row: stable, spread, and merged back."""

from __future__ import annotations

import datetime as dt
import zlib
from collections import Counter

from control_plane.store.history import _merged
from core.history_buckets import HISTORY_BUCKETS, bucket_of
from core.records import delivery_id_for


def test_the_bucket_is_pinned_data_layout() -> None:
    """Readers of rows written by any version compute the same bucket: pinned, never Python's hash."""
    assert bucket_of("dlv_0123456789abcdef") == zlib.crc32(b"dlv_0123456789abcdef") % 16 == 5
    assert HISTORY_BUCKETS == 16


def test_one_endpoints_deliveries_spread_evenly() -> None:
    counts = Counter(bucket_of(delivery_id_for(f"evt_{n}", "ep_busy")) for n in range(16_000))
    assert len(counts) == HISTORY_BUCKETS
    assert max(counts.values()) < 1.15 * 1000 and min(counts.values()) > 0.85 * 1000


def _row(ms: int, did: str, **cells: object) -> dict[str, object]:
    return {"created_at": dt.datetime.fromtimestamp(ms / 1000, dt.UTC).replace(tzinfo=None), "delivery_id": did,
            "status": None, "event_type": None, **cells}


def test_partitions_merge_newest_first_and_one_delivery_in_both_tables_comes_out_once() -> None:
    legacy = [_row(900, "dlv_old", status="pending", event_type="invoice.paid")]
    bucket_a = [_row(1000, "dlv_a"), _row(900, "dlv_old", status="succeeded"), _row(100, "dlv_c")]
    bucket_b = [_row(1000, "dlv_b"), _row(500, "dlv_d")]
    out = list(_merged([iter(legacy), iter(bucket_a), iter(bucket_b)]))
    assert [r["delivery_id"] for r in out] == ["dlv_a", "dlv_b", "dlv_old", "dlv_d", "dlv_c"]
    old = out[2]
    assert (old["status"], old["event_type"]) == ("succeeded", "invoice.paid")  # newer cells win, none lost
