"""The archive's Parquet schemas, one per kind of row (core/archive_layout.py KINDS; the facts'
columns: core/archive_facts.py COLUMNS).

Column names are those of the Cassandra tables (and of core/history_rows.py's reader shape), so
a row read back from the archive is handed to the same converters as a row read from Cassandra,
and an operator's SQL over the archive reads like the cqlsh queries in the README. Timestamps
are UTC milliseconds; ``hour`` (the archive partition) is on every row for SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

_TS = pa.timestamp("ms", tz="UTC")

SCHEMAS: dict[str, pa.Schema] = {
    "events": pa.schema([
        ("event_id", pa.string()), ("tenant_id", pa.string()), ("event_type", pa.string()),
        ("schema_version", pa.string()), ("object_id", pa.string()), ("object_version", pa.int64()),
        ("occurred_at", _TS), ("arrived_at", _TS),
        # The immutable bytes every attempt signed, exactly as the job stored them.
        ("payload", pa.binary()), ("payload_sha256", pa.string()),
        ("hour", _TS),
    ]),
    "deliveries": pa.schema([
        ("delivery_id", pa.string()), ("event_id", pa.string()), ("tenant_id", pa.string()),
        ("endpoint_id", pa.string()), ("endpoint_config_version", pa.int64()), ("event_type", pa.string()),
        ("created_at", _TS), ("expires_at", _TS), ("status", pa.string()), ("attempt_count", pa.int32()),
        ("next_attempt_at", _TS), ("last_http_status", pa.int32()), ("last_error_class", pa.string()),
        ("auto_retry_active", pa.bool_()), ("updated_at", _TS), ("hour", _TS),
        # The Cassandra write time of the status cells: the row with the highest is the delivery's state.
        ("write_ts", pa.int64()),
    ]),
    "attempts": pa.schema([
        ("delivery_id", pa.string()), ("attempt_number", pa.int32()), ("tenant_id", pa.string()),
        ("attempt_id", pa.string()), ("endpoint_id", pa.string()), ("endpoint_config_version", pa.int64()),
        ("url", pa.string()), ("started_at", _TS), ("finished_at", _TS), ("http_status", pa.int32()),
        ("latency_ms", pa.int32()), ("outcome", pa.string()), ("error_class", pa.string()),
        ("response_sha256", pa.string()), ("response_prefix", pa.string()),
        ("signing_key_versions", pa.list_(pa.int32())), ("manual", pa.bool_()),
        ("requested_by", pa.string()), ("request_id", pa.string()), ("hour", _TS), ("write_ts", pa.int64()),
    ]),
}


# A fact's values as one struct (one field per column): Arrow converts a list of rows in one pass,
# rather than Python transposing the rows into columns first (the writer's largest cost).
_ROW_TYPES = {kind: pa.struct(list(schema)) for kind, schema in SCHEMAS.items()}


def table(kind: str, rows: list[tuple[Any, ...]]) -> pa.Table:
    """Facts of one kind, each its values in column order as a tuple (core/archive_facts.decode_values:
    timestamps as UTC ms), as an Arrow table."""
    return pa.Table.from_struct_array(pa.array(rows, type=_ROW_TYPES[kind]))


def naive(row: Mapping[str, Any]) -> dict[str, Any]:
    """An archive row as the driver gives rows (naive UTC datetimes), for readers that convert
    Cassandra rows: the two tiers then go through one conversion."""
    return {k: (v.astimezone(UTC).replace(tzinfo=None) if isinstance(v, datetime) else v) for k, v in row.items()}
