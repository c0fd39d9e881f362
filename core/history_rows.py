"""A delivery's history rows as every reader sees them, whichever schema wrote them.

New writes go to one partition per delivery (``delivery_history``: the delivery as static columns,
its attempts as rows; cassandra/schema/012_delivery_history.cql). Deliveries written before that
table existed live in ``deliveries`` + ``attempts`` until their 30-day TTL ends, and one still
retrying across the upgrade has its creation there and its later writes here. Readers therefore
read the new partition, and the old rows only when the new partition has no creation cells
(:func:`needs_old`), then :func:`merge` them: a cell written here wins (it is the newer write),
attempts are joined by number.

Rows come out in the shape of the old tables (dicts with the old column names), so readers that
grew up on them keep working. Pure: no driver import; rows are mappings from column name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Readers of each table (the statements' text lives with the I/O that runs them).
SELECT_NEW = "SELECT * FROM delivery_history WHERE delivery_id=?"
SELECT_OLD_DELIVERY = "SELECT * FROM deliveries WHERE delivery_id=?"
SELECT_OLD_ATTEMPTS = "SELECT * FROM attempts WHERE delivery_id=?"

DELIVERY_COLUMNS = (
    "delivery_id", "event_id", "tenant_id", "endpoint_id", "endpoint_config_version", "event_type",
    "created_at", "expires_at", "status", "attempt_count", "next_attempt_at", "last_http_status",
    "last_error_class", "auto_retry_active", "updated_at", "last_attempt_number")
ATTEMPT_COLUMNS = (
    "delivery_id", "attempt_number", "attempt_id", "endpoint_id", "endpoint_config_version", "url",
    "started_at", "finished_at", "http_status", "latency_ms", "outcome", "error_class",
    "response_sha256", "response_prefix", "signing_key_versions", "manual", "requested_by", "request_id")
# Attempt columns named differently in delivery_history (its static endpoint_config_version is the
# delivery's creation version; an attempt may have used a later one).
_RENAMED = {"endpoint_config_version": "config_version"}

Row = dict[str, Any]


def as_dict(row: Any) -> Row:
    """A driver row (dict, named tuple) as a dict."""
    if isinstance(row, dict):
        return row
    return dict(row._asdict())


def split(rows: Iterable[Any]) -> tuple[Row | None, list[Row]]:
    """The rows of one delivery_history partition -> (delivery or None, attempts by number).
    A partition with only status cells (an old delivery's later writes) gives a delivery whose
    creation columns are None."""
    delivery: Row | None = None
    attempts: list[Row] = []
    for raw in rows:
        r = as_dict(raw)
        if delivery is None and any(r.get(c) is not None for c in DELIVERY_COLUMNS if c != "delivery_id"):
            delivery = {c: r.get(c) for c in DELIVERY_COLUMNS}
        if r.get("attempt_number") is not None:
            attempts.append({c: r.get(_RENAMED.get(c, c)) for c in ATTEMPT_COLUMNS})
    attempts.reverse()  # the partition is read highest number first
    return delivery, attempts


def needs_old(delivery: Row | None) -> bool:
    """True when the old tables may hold this delivery: no creation cells in the new partition."""
    return delivery is None or delivery.get("created_at") is None


def merge(new: Row | None, new_attempts: list[Row], old: Any,
          old_attempts: Iterable[Any]) -> tuple[Row | None, list[Row]]:
    """One delivery from both schemas: a non-null cell of the new partition wins; attempts are
    joined by number (the new row wins), in number order."""
    old_row = None if old is None else as_dict(old)
    if old_row is None:
        delivery = new
    else:
        delivery = {c: old_row.get(c) for c in DELIVERY_COLUMNS}
        for c, v in (new or {}).items():
            if v is not None:
                delivery[c] = v
    by_number: dict[int, Row] = {}
    for raw in old_attempts:
        a = as_dict(raw)
        by_number[a["attempt_number"]] = {c: a.get(c) for c in ATTEMPT_COLUMNS}
    for a in new_attempts:
        by_number[a["attempt_number"]] = a
    return delivery, [by_number[n] for n in sorted(by_number)]


def top_attempt_number(attempts: Iterable[Mapping[str, Any]]) -> int:
    """The highest attempt number taken (reserved rows count: their numbers are spent)."""
    return max((a["attempt_number"] for a in attempts), default=0)
