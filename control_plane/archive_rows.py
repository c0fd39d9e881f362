"""The archive's Parquet schemas, one per kind of row (core/archive_layout.py KINDS).

Column names are those of the Cassandra tables (and of core/history_rows.py's reader shape), so
a row read back from the archive is handed to the same converters as a row read from Cassandra,
and an operator's SQL over the archive reads like the cqlsh queries in the README. Timestamps
are UTC milliseconds; ``hour`` (the archive partition) is added to every row for SQL.
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
        ("occurred_at", _TS), ("ingested_at", _TS), ("arrived_at", _TS),
        # The immutable bytes every attempt signed, exactly as stored in Cassandra.
        ("payload", pa.binary()), ("payload_sha256", pa.string()),
        # What fan-out decided for it (its snapshot): endpoint id -> config version.
        ("endpoints", pa.map_(pa.string(), pa.int64())),
        ("hour", _TS),
    ]),
    "deliveries": pa.schema([
        ("delivery_id", pa.string()), ("event_id", pa.string()), ("tenant_id", pa.string()),
        ("endpoint_id", pa.string()), ("endpoint_config_version", pa.int64()), ("event_type", pa.string()),
        ("created_at", _TS), ("expires_at", _TS), ("status", pa.string()), ("attempt_count", pa.int32()),
        ("next_attempt_at", _TS), ("last_http_status", pa.int32()), ("last_error_class", pa.string()),
        ("auto_retry_active", pa.bool_()), ("updated_at", _TS), ("hour", _TS),
    ]),
    "attempts": pa.schema([
        ("delivery_id", pa.string()), ("attempt_number", pa.int32()), ("tenant_id", pa.string()),
        ("attempt_id", pa.string()), ("endpoint_id", pa.string()), ("endpoint_config_version", pa.int64()),
        ("url", pa.string()), ("started_at", _TS), ("finished_at", _TS), ("http_status", pa.int32()),
        ("latency_ms", pa.int32()), ("outcome", pa.string()), ("error_class", pa.string()),
        ("response_sha256", pa.string()), ("response_prefix", pa.string()),
        ("signing_key_versions", pa.list_(pa.int32())), ("manual", pa.bool_()),
        ("requested_by", pa.string()), ("request_id", pa.string()), ("hour", _TS),
    ]),
    "replays": pa.schema([
        ("delivery_id", pa.string()), ("request_id", pa.string()), ("tenant_id", pa.string()),
        ("requested_by", pa.string()), ("requested_at", _TS), ("reason", pa.string()), ("action", pa.string()),
        ("hour", _TS),
    ]),
}


def utc(value: Any) -> datetime | None:
    """A driver timestamp (naive UTC) or an aware one, as an aware UTC datetime."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def shape(kind: str, row: Mapping[str, Any], hour: datetime) -> dict[str, Any]:
    """A Cassandra row (column -> value) as an archive row of ``kind``: its columns, in order."""
    out: dict[str, Any] = {}
    for f in SCHEMAS[kind]:
        v = hour if f.name == "hour" else row.get(f.name)
        if isinstance(v, datetime):
            v = utc(v)
        elif f.name == "payload" and v is not None:
            v = bytes(v)
        elif f.name == "signing_key_versions" and v is not None:
            v = list(v)
        elif f.name == "endpoints" and v is not None:
            v = sorted(dict(v).items())
        out[f.name] = v
    return out


def naive(row: Mapping[str, Any]) -> dict[str, Any]:
    """An archive row as the driver gives rows (naive UTC datetimes), for readers that convert
    Cassandra rows: the two tiers then go through one conversion."""
    return {k: (v.astimezone(UTC).replace(tzinfo=None) if isinstance(v, datetime) else v) for k, v in row.items()}
