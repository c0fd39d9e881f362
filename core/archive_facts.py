"""Archive facts: what the delivery job writes to the hot tier, as an append-only log for the archive.

Every write the job makes to the history (operators/history_store.py) is also a *fact*: one row of
one archive kind (core/archive_layout.py KINDS; columns: control_plane/archive_rows.py) with the
Cassandra write timestamp the job gave it (``write_ts``, microseconds). The job sends them, many
to a Kafka record, to the archive facts topic; the archive writer (control_plane/archive_writer.py)
appends them to Parquet files per (arrival hour, tenant bucket); nobody reads Cassandra for it.

Facts are *immutable and repeatable*: a fact written twice (a retried batch, a job restored from
a checkpoint, a file written again after a crash) is the same row again, and a later fact about
the same key supersedes an earlier one exactly as Cassandra's cells do -- the row with the highest
``write_ts`` wins (:func:`latest`). Readers, the SQL tool and the audit all reduce the log so.
Keys: events by event_id, deliveries by delivery_id, attempts by (delivery_id, attempt_number),
replays by (delivery_id, request_id).

Every row carries ``hour`` (the delivery's arrival hour, UTC ms) and ``tenant_id``: all facts of a
delivery land in one (hour, tenant bucket) partition, whenever they happen.

Record schema (the topic's value; one JSON object, UTF-8)::

    {"schema": "webhooks.archive-facts/1", "facts": [[kind, {column: value, ...}], ...]}

timestamps as UTC milliseconds, ``payload`` as base64. Pure: no I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from core.archive_layout import HOUR_MS, KINDS

SCHEMA_V1 = "webhooks.archive-facts/1"
KEYS: dict[str, tuple[str, ...]] = {
    "events": ("event_id",),
    "deliveries": ("delivery_id",),
    "attempts": ("delivery_id", "attempt_number"),
    "replays": ("delivery_id", "request_id"),
}

Fact = tuple[str, dict[str, Any]]


def hour_of(ms: int) -> int:
    return ms // HOUR_MS * HOUR_MS


def encode(facts: Iterable[Fact]) -> bytes:
    out = []
    for kind, row in facts:
        if kind == "events" and row.get("payload") is not None:
            row = {**row, "payload": base64.b64encode(row["payload"]).decode()}
        out.append((kind, row))
    return orjson.dumps({"schema": SCHEMA_V1, "facts": out})


def decode(raw: bytes | str) -> list[Fact]:
    d = orjson.loads(raw)
    if not isinstance(d, dict) or d.get("schema") != SCHEMA_V1:
        raise ValueError(f"unknown archive facts schema {d.get('schema') if isinstance(d, dict) else d!r}")
    facts: list[Fact] = []
    for kind, row in d["facts"]:
        if kind not in KINDS:
            raise ValueError(f"unknown archive kind {kind!r}")
        if kind == "events" and row.get("payload") is not None:
            row["payload"] = base64.b64decode(row["payload"])
        facts.append((kind, row))
    return facts


def key_of(kind: str, row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row[c] for c in KEYS[kind])


def latest(kind: str, rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One row per key: the one with the highest write_ts (Cassandra's rule; equal write times
    are the same fact written again). In first-seen key order."""
    best: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for r in rows:
        k = key_of(kind, r)
        held = best.get(k)
        if held is None or (r.get("write_ts") or 0) > (held.get("write_ts") or 0):
            best[k] = r
    return list(best.values())


# -- the facts of the job's writes (operators/history_store.py builds them beside the statements) --

def event(e: Any, arrived_at_ms: int, endpoints: Mapping[str, int], wts: int) -> Fact:
    """``e``: core.records.EventRecord; ``endpoints``: fan-out's choice (endpoint -> config version)."""
    return ("events", {
        "event_id": e.event_id, "tenant_id": e.tenant_id, "event_type": e.event_type,
        "schema_version": e.schema_version, "object_id": e.object_id, "object_version": e.object_version,
        "occurred_at": e.occurred_at_ms, "ingested_at": arrived_at_ms, "arrived_at": arrived_at_ms,
        "payload": bytes(e.payload), "payload_sha256": e.payload_sha256, "endpoints": dict(endpoints),
        "hour": hour_of(arrived_at_ms), "write_ts": wts})


def delivery(d: Any, status: str, attempt_count: int, next_attempt_at_ms: int | None, http_status: int | None,
             error_class: str | None, auto_retry_active: bool, updated_at_ms: int | None, wts: int) -> Fact:
    """The delivery's row after a write of its status (``d``: core.fanout.NewDelivery)."""
    return ("deliveries", {
        "delivery_id": d.delivery_id, "event_id": d.event.event_id, "tenant_id": d.tenant_id,
        "endpoint_id": d.endpoint_id, "endpoint_config_version": d.endpoint_config_version,
        "event_type": d.event.event_type, "created_at": d.created_at_ms, "expires_at": d.expires_at_ms,
        "status": status, "attempt_count": attempt_count, "next_attempt_at": next_attempt_at_ms,
        "last_http_status": http_status, "last_error_class": error_class, "auto_retry_active": auto_retry_active,
        "updated_at": updated_at_ms, "hour": hour_of(d.created_at_ms), "write_ts": wts})


def reserved(d: Any, number: int, attempt_id: str, at_ms: int) -> Fact:
    return ("attempts", {
        "delivery_id": d.delivery_id, "attempt_number": number, "tenant_id": d.tenant_id, "attempt_id": attempt_id,
        "endpoint_id": d.endpoint_id, "endpoint_config_version": d.endpoint_config_version, "started_at": at_ms,
        "outcome": "reserved", "hour": hour_of(d.created_at_ms), "write_ts": at_ms * 1000})


def attempt(d: Any, r: Any, wts: int) -> Fact:
    """An attempt's outcome (``r``: core.dispatch.AttemptRecord with an intent)."""
    return ("attempts", {
        "delivery_id": d.delivery_id, "attempt_number": r.intent.number, "tenant_id": d.tenant_id,
        "attempt_id": r.intent.attempt_id, "endpoint_id": d.endpoint_id,
        "endpoint_config_version": r.endpoint_config_version or d.endpoint_config_version, "url": r.url or None,
        "started_at": r.started_at_ms, "finished_at": r.finished_at_ms, "http_status": r.http_status,
        "latency_ms": r.latency_ms, "outcome": r.outcome, "error_class": r.error_class,
        "response_sha256": r.response_sha256, "response_prefix": r.response_prefix,
        "signing_key_versions": list(r.signing_key_versions), "manual": r.manual,
        "requested_by": r.requested_by, "request_id": r.request_id, "hour": hour_of(d.created_at_ms),
        "write_ts": wts})


def replay(delivery_id: str, request_id: str, tenant_id: str, requested_by: str, requested_at_ms: int,
           reason: str, action: str, created_at_ms: int) -> Fact:
    """A replay request's audit row (the control plane writes it, and sends this fact)."""
    return ("replays", {
        "delivery_id": delivery_id, "request_id": request_id, "tenant_id": tenant_id, "requested_by": requested_by,
        "requested_at": requested_at_ms, "reason": reason, "action": action, "hour": hour_of(created_at_ms),
        "write_ts": requested_at_ms * 1000})
