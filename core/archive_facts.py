"""Archive facts: the delivery job's history writes as an append-only log for the archive.

Every row the job writes to the hot tier that the archive keeps (operators/history_store.py) is
also a *fact*: one row of one archive kind, built beside the Cassandra statement from the same
values. The dispatcher sends the facts of each call as ONE Kafka record to the archive facts
topic (a record crossing from Python to the JVM costs about as much as encoding a few facts);
the archive writer (control_plane/archive/writer.py) appends them to Parquet files per (arrival
hour, tenant bucket) and nobody reads Cassandra for it (docs/archive.md).

Kinds and keys (a fact written twice -- a retried batch, a job restored from a checkpoint, a
segment written again after the writer crashed -- is the same row again, and readers reduce the
log by key, :func:`latest`):

* ``events``: the event's immutable bytes, once per event (with its first delivery). Key: event_id.
* ``deliveries``: the delivery's row after a write of its creation or status; the one with the
  highest ``write_ts`` (the Cassandra write time the job gave the status cells, so the same
  ordering rules: a final status outranks a pending one) is the delivery's state. Key: delivery_id.
* ``attempts``: an attempt's outcome. Key: (delivery_id, attempt_number).

Every fact carries ``tenant_id`` and ``hour`` (its delivery's arrival hour, UTC ms): all facts of
a delivery land in one (hour, tenant bucket) partition, whenever they happen.

Record schema (the topic's value, one JSON array, UTF-8; columns by position, :data:`COLUMNS`)::

    ["webhooks.archive-facts/1", [[kind, [value, ...]], ...]]

timestamps as UTC milliseconds, ``payload`` as base64. Pure: no I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from core.archive_layout import HOUR_MS

SCHEMA_V1 = "webhooks.archive-facts/1"

# The columns of each kind, in record order; the Parquet schemas (control_plane/archive/rows.py)
# have these columns (a unit test holds them equal).
COLUMNS: dict[str, tuple[str, ...]] = {
    "events": ("event_id", "tenant_id", "event_type", "schema_version", "object_id", "object_version",
               "occurred_at", "arrived_at", "payload", "payload_sha256", "hour"),
    "deliveries": ("delivery_id", "event_id", "tenant_id", "endpoint_id", "endpoint_config_version", "event_type",
                   "created_at", "expires_at", "status", "attempt_count", "next_attempt_at", "last_http_status",
                   "last_error_class", "auto_retry_active", "updated_at", "hour", "write_ts"),
    "attempts": ("delivery_id", "attempt_number", "tenant_id", "attempt_id", "endpoint_id",
                 "endpoint_config_version", "url", "started_at", "finished_at", "http_status", "latency_ms",
                 "outcome", "error_class", "response_sha256", "response_prefix", "signing_key_versions", "manual",
                 "requested_by", "request_id", "hour", "write_ts"),
}
KEYS: dict[str, tuple[str, ...]] = {
    "events": ("event_id",),
    "deliveries": ("delivery_id",),
    "attempts": ("delivery_id", "attempt_number"),
}
_PAYLOAD = COLUMNS["events"].index("payload")
_WIDTH = {kind: len(columns) for kind, columns in COLUMNS.items()}
# Where each kind's partition columns are: the writer groups facts by them.
HOUR_AT = {kind: columns.index("hour") for kind, columns in COLUMNS.items()}
TENANT_AT = {kind: columns.index("tenant_id") for kind, columns in COLUMNS.items()}

# A fact as the job builds it: (kind, values in COLUMNS order).
Fact = tuple[str, tuple[Any, ...]]


def hour_of(ms: int) -> int:
    return ms // HOUR_MS * HOUR_MS


# -- the facts of the job's writes (operators/history_store.py builds them beside the statements) --

def event_fact(e: Any, arrived_at_ms: int) -> Fact:
    """The event's row (``e``: core.records.EventRecord), written with its first delivery."""
    return ("events", (e.event_id, e.tenant_id, e.event_type, e.schema_version, e.object_id, e.object_version,
                       e.occurred_at_ms, arrived_at_ms, bytes(e.payload), e.payload_sha256, hour_of(arrived_at_ms)))


def created_fact(d: Any, wts: int) -> Fact:
    """A delivery's creation (``d``: core.fanout.NewDelivery) as its creation statement writes it."""
    c = d.created_at_ms
    return ("deliveries", (d.delivery_id, d.event.event_id, d.tenant_id, d.endpoint_id, d.endpoint_config_version,
                           d.event.event_type, c, d.expires_at_ms, "pending", 0, c, None, None, True, None,
                           hour_of(c), wts))


def status_fact(d: Any, r: Any, attempt_count: int, wts: int) -> Fact:
    """The delivery's row after a status write (``r``: core.dispatch.AttemptRecord with a
    delivery_status), ``wts`` the write time of its status cells."""
    return ("deliveries", (d.delivery_id, d.event.event_id, d.tenant_id, d.endpoint_id, d.endpoint_config_version,
                           d.event.event_type, d.created_at_ms, d.expires_at_ms, r.delivery_status, attempt_count,
                           r.next_attempt_at_ms, r.http_status, r.error_class, r.auto_retry_active,
                           r.finished_at_ms, hour_of(d.created_at_ms), wts))


def skipped_facts(s: Any, wts: int) -> list[Fact]:
    """The rows of the pairs fan-out skipped (``s``: core.fanout.FanoutSnapshot)."""
    at = s.arrived_at_ms
    return [("deliveries", (k.delivery_id, s.event_id, s.tenant_id, k.endpoint_id, k.endpoint_config_version,
                            k.event_type, at, None, "skipped", 0, None, None, k.reason, False, at, hour_of(at), wts))
            for k in s.skipped]


def attempt_fact(d: Any, r: Any, wts: int) -> Fact:
    """An attempt's outcome (``r``: core.dispatch.AttemptRecord with an intent)."""
    return ("attempts", (d.delivery_id, r.intent.number, d.tenant_id, r.intent.attempt_id, d.endpoint_id,
                         r.endpoint_config_version or d.endpoint_config_version, r.url or None, r.started_at_ms,
                         r.finished_at_ms, r.http_status, r.latency_ms, r.outcome, r.error_class,
                         r.response_sha256, r.response_prefix, list(r.signing_key_versions), r.manual,
                         r.requested_by, r.request_id, hour_of(d.created_at_ms), wts))


# -- the record ------------------------------------------------------------------------------

def encode(facts: Iterable[Fact]) -> bytes:
    out = []
    for kind, values in facts:
        if kind == "events":
            values = (*values[:_PAYLOAD], base64.b64encode(values[_PAYLOAD]).decode(), *values[_PAYLOAD + 1:])
        out.append((kind, values))
    return orjson.dumps((SCHEMA_V1, out))


def decode_values(raw: bytes | str) -> list[Any]:
    """A record's facts, each a pair [kind, values in COLUMNS order] (the lists orjson made,
    checked and returned as they are), the payload as bytes; ValueError for anything else. The
    writer's form: no dict per fact."""
    try:
        schema, facts = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError, ValueError):
        raise ValueError("not an archive facts record") from None
    if schema != SCHEMA_V1:
        raise ValueError(f"unknown archive facts schema {schema!r}")
    try:
        for kind, values in facts:
            if type(kind) is not str or type(values) is not list or _WIDTH.get(kind) != len(values):
                raise ValueError(f"archive fact of kind {kind!r} with values {str(values)[:40]}")
            if kind == "events":
                values[_PAYLOAD] = base64.b64decode(values[_PAYLOAD])
    except TypeError:  # a shape orjson read but no fact has: the caller skips it like any other
        raise ValueError("not an archive facts record") from None
    return facts


def decode(raw: bytes | str) -> list[tuple[str, dict[str, Any]]]:
    """A record's facts as (kind, {column: value}); ValueError for anything else."""
    return [(kind, dict(zip(COLUMNS[kind], values, strict=True))) for kind, values in decode_values(raw)]


def key_of(kind: str, row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row[c] for c in KEYS[kind])


def latest(kind: str, rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One row per key: the one with the highest write_ts (Cassandra's rule; equal write times
    are the same fact written again), in first-seen key order. Events are immutable: the first."""
    best: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for r in rows:
        k = key_of(kind, r)
        held = best.get(k)
        if held is None or (r.get("write_ts") or 0) > (held.get("write_ts") or 0):
            best[k] = r
    return list(best.values())

