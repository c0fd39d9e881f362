"""Emit a webhook event from an application: one outbox row, inside the caller's transaction.

::

    with psycopg.connect(dsn) as conn:            # not autocommit: psycopg opens a transaction
        conn.execute("UPDATE invoices SET status = 'paid' WHERE id = %s", (invoice_id,))
        event_id = write_event(conn, "acme", "invoice.paid", {"id": invoice_id, "amount": 4200},
                               object_id=invoice_id, object_version=7)
        # the `with` block commits both rows together, or neither

Tracing: ``traceparent`` continues the application's own trace (a W3C traceparent, e.g. its
current span's); with a ``tracer`` (``tracing.tracer(settings.tracing, ...)``, None when tracing is
off) the row is a span of its own -- ``outbox write``, a child of the given traceparent or the root
of a new, head-sampled trace -- and the row carries that span's traceparent to the receivers'
requests (docs/producers.md, tracing). Without one, a given traceparent is stored as it is.

The business change and the event commit or roll back together, so there is no dual write: a
crash after the commit still leaves the row, and Debezium publishes it from the WAL (maybe twice
-- consumers dedupe by event_id). ``write_event`` never commits and refuses an autocommit
connection, where the row would be committed on its own.

Everything the delivery job would refuse is refused here first, with :class:`OutboxError` naming
the field, so a bad event fails the producer's request instead of reaching the dead-letter topic.
With ``schemas`` (an :class:`outbox.schemas.SchemaGuard`) that includes a payload that does not
match its type's schema version in the tenant's event-type catalog.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from core import identifiers, spans, strict_json, trace_context
from outbox.schemas import SchemaGuard, SchemaRefused

log = logging.getLogger(__name__)

# The delivery job's default limit (ingest.max_payload_bytes); pass the deployment's own if it differs.
DEFAULT_MAX_PAYLOAD_BYTES = 256 * 1024
_MAX_TEXT = 200

JsonPayload = Mapping[str, Any] | Sequence[Any] | bytes | str


class OutboxError(ValueError):
    """The event was refused; nothing was written. The message names the field and the rule."""


def new_event_id(now_ms: int | None = None, random_bytes: bytes | None = None) -> str:
    """``evt_`` + 12 hex digits of unix ms + 20 random hex digits: unique, and sorted by time so
    ids written together sit together in indexes and logs."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rnd = os.urandom(10) if random_bytes is None else random_bytes
    return f"evt_{ms:012x}{rnd.hex()}"


def canonical_payload(payload: JsonPayload, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> bytes:
    """The exact body bytes receivers get. A mapping or list is serialised compactly with sorted
    keys (the same data always gives the same bytes); bytes or text must already be one strict
    JSON document in UTF-8 (core.strict_json: no NaN, lone surrogate or key twice) and are kept
    byte for byte, since receivers verify signatures over these bytes."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        body = bytes(payload)
    elif isinstance(payload, str):
        body = payload.encode("utf-8")
    elif isinstance(payload, (Mapping, list, tuple)):
        try:
            body = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise OutboxError(f"payload is not JSON-serialisable: {exc}") from exc
    else:
        raise OutboxError(f"payload must be a mapping, a list, bytes or str, got {type(payload).__name__}")
    if len(body) > max_bytes:
        raise OutboxError(f"payload is {len(body)} bytes; the limit is {max_bytes}")
    try:
        # The job's own check (core.ingest dead-letters anything else as payload_not_json), on
        # the stored bytes whatever made them, so the two can never disagree.
        strict_json.loads(body)
    except strict_json.NotStrictJson as exc:
        raise OutboxError(f"payload is not strict JSON: {exc}") from None
    return body


def _check(name: str, value: object, pattern: Any = None, required: bool = True) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str):
        raise OutboxError(f"{name} must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= _MAX_TEXT:
        raise OutboxError(f"{name} must be 1..{_MAX_TEXT} characters")
    if pattern is not None and not pattern.fullmatch(value):
        raise OutboxError(f"{name} {value!r} must match {pattern.pattern}")


def write_event(
    conn: psycopg.Connection[Any],
    tenant_id: str,
    event_type: str,
    payload: JsonPayload,
    *,
    object_id: str | None = None,
    object_version: int | None = None,
    schema_version: str = "1",
    event_id: str | None = None,
    occurred_at: datetime | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    schemas: SchemaGuard | None = None,
    traceparent: str | None = None,
    tracer: spans.Tracer | None = None,
) -> str:
    """Insert one outbox row in ``conn``'s open transaction and return its event_id.

    Does not commit. Raises :class:`OutboxError` for invalid input (nothing is written), and
    psycopg's ``UniqueViolation`` if ``event_id`` was already written: the caller's transaction is
    then aborted, as for any failed statement. ``schemas`` checks the payload against the tenant's
    catalog first (the job checks again at fan-out either way). An invalid ``traceparent`` is
    ignored (logged), as the W3C specification asks: tracing never refuses an event."""
    started_ns = time.time_ns() if tracer is not None else 0
    if conn.autocommit:
        raise OutboxError("write_event needs a transaction: the connection is in autocommit mode")
    _check("tenant_id", tenant_id, identifiers.TENANT_ID)
    _check("event_type", event_type, identifiers.EVENT_TYPE)
    _check("schema_version", schema_version)
    _check("object_id", object_id, required=False)
    if event_id is None:
        event_id = new_event_id()
    _check("event_id", event_id, identifiers.ID)
    if object_version is not None and (isinstance(object_version, bool) or not isinstance(object_version, int)):
        raise OutboxError(f"object_version must be an integer, got {type(object_version).__name__}")
    if occurred_at is None:
        occurred_at = datetime.now(UTC)
    elif not isinstance(occurred_at, datetime) or occurred_at.tzinfo is None:
        raise OutboxError("occurred_at must be a datetime with a time zone")
    body = canonical_payload(payload, max_payload_bytes)
    if schemas is not None:
        try:
            schemas.check(tenant_id, event_type, schema_version, body)
        except SchemaRefused as exc:
            raise OutboxError(str(exc)) from None
    step = None
    if traceparent is not None and trace_context.parse_or_none(traceparent) is None:
        log.warning("write_event: ignoring an invalid traceparent (W3C Trace Context) for event %s", event_id)
        traceparent = None
    if tracer is not None:
        step = tracer.begin(traceparent)
        traceparent = step.forward
    elif traceparent is not None:
        traceparent = trace_context.normalize(traceparent)
    if traceparent is None:
        # Without a trace the column is not named: a database not yet migrated to it still works.
        conn.execute(
            "INSERT INTO webhook_outbox (event_id, tenant_id, event_type, schema_version, object_id,"
            " object_version, occurred_at, payload) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (event_id, tenant_id, event_type, schema_version, object_id, object_version, occurred_at, body),
        )
    else:
        conn.execute(
            "INSERT INTO webhook_outbox (event_id, tenant_id, event_type, schema_version, object_id,"
            " object_version, occurred_at, payload, traceparent) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (event_id, tenant_id, event_type, schema_version, object_id, object_version, occurred_at, body,
             traceparent),
        )
    if tracer is not None and step is not None and step.span is not None:
        tracer.sink.export(spans.outbox_span(step.span, step.parent_span_id, event_id=event_id, tenant_id=tenant_id,
                                             event_type=event_type, start_ns=started_ns, end_ns=time.time_ns()))
    return event_id
