"""Turn one raw record of the CDC topic into an :class:`EventRecord`, or say exactly why not.

Two forms are accepted, so a real Debezium connector on an outbox table can feed the job as is:

1. The plain form ``webhooks.event/v1`` documented in :mod:`core.records`.
2. A Debezium change event of the outbox table, with or without the JSON-converter ``schema``
   wrapper. Only inserts (``op`` ``c`` or ``r`` for snapshot reads) are events; updates and deletes
   of outbox rows are housekeeping and are refused with reason ``not_an_insert``::

       {"schema": {...}, "payload": {"op": "c", "before": null, "source": {...},
        "after": {"event_id": "evt_1", "tenant_id": "t_1", "event_type": "invoice.paid",
                  "schema_version": "2026-01-01", "object_id": "inv_9", "object_version": 3,
                  "occurred_at": 1764442800000, "payload": "{\\"id\\":\\"inv_9\\"}"}}}

   The outbox columns are the plain form's fields; ``occurred_at`` may be RFC 3339 text or unix
   milliseconds (Debezium renders timestamps as epoch numbers), and ``envelope_version`` (default 1)
   versions the outbox row layout. Version 2 is the platform's own outbox table
   (outbox/sql/001_webhook_outbox.sql): ``payload`` is a bytea column, which Debezium renders as
   base64. Its optional ``traceparent`` column (outbox/sql/002_traceparent.sql) is read like the
   plain form's field.

In either form a ``traceparent`` that is not a valid W3C trace context (core.trace_context) is
dropped, never refused: the event is delivered, without a trace to continue. A valid one is kept
in its normal form (version 00), so no producer's text ever reaches a receiver's header as given.

In every form the payload must be one strict RFC 8259 document in UTF-8 (:mod:`core.strict_json`:
no NaN or Infinity, no lone surrogate, no key twice, nothing after it): every delivery is sent as
application/json, and the catalog check must judge what a receiver reads. Anything else is
refused with reason ``payload_not_json``. The record itself is parsed as strictly (reasons
``not_utf8`` and ``malformed_json``; a UTF-8 byte order mark before it is tolerated).

Every refusal is an :class:`IngestError` with a stable ``reason`` code (for the dead-letter topic
and the metric) and a human ``detail``. :func:`check_target` refuses (``untrusted_target``) an
event aimed at one endpoint that the control plane did not produce. An integer the history
cannot hold (``object_version`` past a bigint, ``occurred_at`` past year 9999) is refused with
reason ``out_of_range`` and the field named in the detail.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Any

from core import strict_json, target_proof, trace_context
from core.operational_events import is_operational
from core.records import EVENT_SCHEMA_V1, REDRIVE_SCHEMA_V1, EventRecord, RedriveRequest, json_object
from core.timeutil import iso_to_ms

SUPPORTED_OUTBOX_VERSIONS = {1, 2}
_MAX_ID_LEN = 200
# What the history can hold: object_version is a Cassandra bigint, occurred_at a timestamp that
# every attempt's signed headers also render as RFC 3339 text (Python's datetime: years 1..9999).
# A value past these is refused here: accepted, it would fail every write of its delivery, and
# every send.
_BIGINT = (-(2**63), 2**63 - 1)
_TIMESTAMP_MS = (-62_135_596_800_000, 253_402_300_799_999)  # 0001-01-01 .. 9999-12-31, UTC
_BOM = b"\xef\xbb\xbf"


class IngestError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def parse_event(raw: bytes, max_payload_bytes: int, *, check_payload: bool = True) -> EventRecord:
    """The event ``raw`` holds. ``check_payload=False`` is for an event ingest admitted before (a
    redrive): one admitted before payloads had to be strict JSON is still redriven."""
    event = _from_record(_record(raw), max_payload_bytes)
    if check_payload:
        _check_json(event.payload)  # last: the costliest check, and a payload too large is never parsed
    return event


def parse_redrive(raw: bytes | str) -> RedriveRequest:
    """A redrive request (schema ``webhooks.redrive/v1``, :class:`core.records.RedriveRequest`), its
    event read as :func:`parse_event` reads an event admitted before; ValueError if unreadable."""
    d = json_object(raw)
    if d.get("schema") != REDRIVE_SCHEMA_V1:
        raise ValueError(f"unknown redrive schema {d.get('schema')!r}")
    try:
        event = parse_event(json.dumps(d["event"]).encode(), max_payload_bytes=1 << 30, check_payload=False)
    except IngestError as exc:
        raise ValueError(f"redrive of {d.get('delivery_id')!r}: unreadable event: {exc}") from exc
    return RedriveRequest(
        delivery_id=str(d["delivery_id"]),
        tenant_id=str(d["tenant_id"]),
        endpoint_id=str(d["endpoint_id"]),
        endpoint_config_version=int(d["endpoint_config_version"]),
        created_at_ms=int(d["created_at_ms"]),
        expires_at_ms=int(d["expires_at_ms"]),
        event=event,
        reason=str(d["reason"]),
        requested_by=str(d["requested_by"]),
    )


def _record(raw: bytes) -> dict[str, Any]:
    # A UTF-8 byte order mark before the record is still tolerated, as json.loads(bytes) did;
    # a payload's is not (the payload is what receivers are sent).
    if raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    try:
        doc = strict_json.loads(raw)
    except strict_json.NotUtf8 as exc:
        raise IngestError("not_utf8", f"record is not UTF-8: {exc}") from exc
    except strict_json.NotStrictJson as exc:
        raise IngestError("malformed_json", f"record is not strict JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise IngestError("malformed_json", "record must be a JSON object")
    return doc


def _from_record(doc: dict[str, Any], max_payload_bytes: int) -> EventRecord:
    if "schema" in doc and isinstance(doc["schema"], str):
        if doc["schema"] != EVENT_SCHEMA_V1:
            raise IngestError("unknown_schema", f"unsupported event schema {doc['schema']!r}")
        return _from_fields(doc, max_payload_bytes)
    if "payload" in doc and isinstance(doc["payload"], dict) and "op" in doc["payload"]:
        return _from_debezium(doc["payload"], max_payload_bytes)
    if "op" in doc and ("after" in doc or "before" in doc):
        return _from_debezium(doc, max_payload_bytes)
    raise IngestError("unknown_schema", "record is neither webhooks.event/v1 nor a Debezium envelope")


def _from_debezium(envelope: dict[str, Any], max_payload_bytes: int) -> EventRecord:
    op = envelope.get("op")
    if op not in ("c", "r"):
        raise IngestError("not_an_insert", f"Debezium op {op!r} is not an outbox insert")
    after = envelope.get("after")
    if not isinstance(after, dict):
        raise IngestError("missing_field", "Debezium insert has no 'after' row")
    version = after.get("envelope_version", 1)
    if version not in SUPPORTED_OUTBOX_VERSIONS:
        raise IngestError("unknown_schema", f"unsupported outbox envelope_version {version!r}")
    if version == 2:
        return _from_fields(after, max_payload_bytes, _bytea(after))
    return _from_fields(after, max_payload_bytes)


def _bytea(after: dict[str, Any]) -> bytes:
    value = after.get("payload")
    if value is None:
        raise IngestError("missing_field", "payload is required")
    if not isinstance(value, str):
        raise IngestError("wrong_type", "payload must be base64 text (a bytea column)")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise IngestError("wrong_type", f"payload is not base64: {exc}") from exc


def _from_fields(d: dict[str, Any], max_payload_bytes: int, payload: bytes | None = None) -> EventRecord:
    if payload is None:
        payload = _payload_bytes(d)
    if len(payload) > max_payload_bytes:
        raise IngestError(
            "payload_too_large", f"payload is {len(payload)} bytes; the limit is {max_payload_bytes}"
        )
    return EventRecord(
        event_id=_ident(d, "event_id"),
        tenant_id=_ident(d, "tenant_id"),
        event_type=_ident(d, "event_type"),
        schema_version=_text(d, "schema_version"),
        object_id=_text(d, "object_id", required=False),
        object_version=_int(d, "object_version", required=False),
        occurred_at_ms=_timestamp(d, "occurred_at"),
        payload=payload,
        target_endpoint_id=_text(d, "target_endpoint_id", required=False) or None,
        target_proof=_text(d, "target_proof", required=False) or None,
        # One dict lookup when absent: tracing's whole cost on an event without a trace.
        traceparent=trace_context.normalize(d["traceparent"]) if d.get("traceparent") is not None else None,
    )


def check_target(event: EventRecord, keys: Sequence[bytes]) -> None:
    """Refuse an event aimed at one endpoint without the control plane's proof (core.target_proof):
    any producer could otherwise reach an endpoint that never subscribed to the event's type. An
    operational event (``webhooks.*``) needs the platform's proof as well: only the control plane
    emits them."""
    if is_operational(event.event_type) and not any(
            target_proof.verify(key, event.tenant_id, event.event_id, target_proof.OPERATIONAL, event.target_proof)
            for key in keys):
        raise IngestError("untrusted_operational", f"{event.event_type}: webhooks.* events are the platform's own "
                          "operational events; producers cannot emit them (no valid target_proof)")
    if event.target_endpoint_id is None:
        return
    if not any(target_proof.verify(key, event.tenant_id, event.event_id, event.target_endpoint_id, event.target_proof)
               for key in keys):
        raise IngestError("untrusted_target", f"target_endpoint_id {event.target_endpoint_id} is honoured only "
                          "on the control plane's own test events (no valid target_proof)")


def _check_json(payload: bytes) -> None:
    try:
        strict_json.loads(payload)
    except strict_json.NotStrictJson as exc:
        raise IngestError("payload_not_json", f"payload is not one strict JSON document in UTF-8: {exc}") from exc


def _payload_bytes(d: dict[str, Any]) -> bytes:
    if "payload_base64" in d:
        value = d["payload_base64"]
        if not isinstance(value, str):
            raise IngestError("wrong_type", "payload_base64 must be a string")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise IngestError("wrong_type", f"payload_base64 is not base64: {exc}") from exc
    if "payload" not in d:
        raise IngestError("missing_field", "payload (or payload_base64) is required")
    value = d["payload"]
    if not isinstance(value, str):
        # A JSON object here would have to be re-serialised, and re-serialising changes bytes that
        # receivers verify signatures over; the producer must hand us the exact bytes.
        raise IngestError("wrong_type", "payload must be a string holding the exact body bytes")
    return value.encode("utf-8")


def _text(d: dict[str, Any], name: str, required: bool = True) -> str:
    if name not in d or d[name] is None:
        if required:
            raise IngestError("missing_field", f"{name} is required")
        return ""
    value = d[name]
    if not isinstance(value, str):
        raise IngestError("wrong_type", f"{name} must be a string, got {type(value).__name__}")
    return value


def _ident(d: dict[str, Any], name: str) -> str:
    value = _text(d, name)
    if not value or len(value) > _MAX_ID_LEN:
        raise IngestError("wrong_type", f"{name} must be 1..{_MAX_ID_LEN} characters")
    return value


def _int(d: dict[str, Any], name: str, required: bool = True) -> int:
    if name not in d or d[name] is None:
        if required:
            raise IngestError("missing_field", f"{name} is required")
        return 0
    value = d[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise IngestError("wrong_type", f"{name} must be an integer, got {type(value).__name__}")
    return _in_range(name, value, _BIGINT)


def _in_range(name: str, value: int, bounds: tuple[int, int]) -> int:
    low, high = bounds
    if not low <= value <= high:
        raise IngestError("out_of_range", f"{name} {value} is outside {low}..{high}, what the history can hold")
    return value


def _timestamp(d: dict[str, Any], name: str) -> int:
    if name not in d or d[name] is None:
        raise IngestError("missing_field", f"{name} is required")
    value = d[name]
    if isinstance(value, bool):
        raise IngestError("wrong_type", f"{name} must be RFC 3339 text or unix milliseconds")
    if isinstance(value, int):
        return _in_range(name, value, _TIMESTAMP_MS)
    if isinstance(value, str):
        try:
            ms = iso_to_ms(value)
        except ValueError as exc:
            raise IngestError("wrong_type", f"{name} is not an RFC 3339 timestamp: {exc}") from exc
        return _in_range(name, ms, _TIMESTAMP_MS)  # a year-1 time with a positive offset is earlier
    raise IngestError("wrong_type", f"{name} must be RFC 3339 text or unix milliseconds")
