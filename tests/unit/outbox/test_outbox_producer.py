"""outbox/producer.py: what write_event accepts and refuses before any SQL runs, and the canonical
bytes it stores. The database side (the caller's transaction, rollbacks, the unique event_id, the
table's size cap) is tested on the real PostgreSQL in tests/integration/test_outbox_producer.py."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from core.ingest import parse_event
from core.spans import Span, Tracer
from core.trace_context import HeadSampler, parse
from outbox.producer import OutboxError, canonical_payload, new_event_id, write_event


class RecordingConnection:
    """Stands in for a psycopg connection: records statements, never commits."""

    def __init__(self, autocommit: bool = False) -> None:
        self.autocommit = autocommit
        self.executed: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, query: str, params: tuple[Any, ...]) -> None:
        self.executed.append((query, params))


def write(conn: RecordingConnection | None = None, **kw: Any) -> tuple[str, RecordingConnection]:
    conn = conn or RecordingConnection()
    args: dict[str, Any] = {"tenant_id": "acme", "event_type": "invoice.paid", "payload": {"id": "inv_1"}, **kw}
    event_id = write_event(conn, **args)  # type: ignore[arg-type]
    return event_id, conn


def test_one_insert_with_the_canonical_bytes_and_no_commit() -> None:
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    event_id, conn = write(payload={"b": 2, "a": [1, "é"]}, object_id="inv_1", object_version=7,
                           schema_version="2026-01-01", event_id="evt_given", occurred_at=at)
    assert event_id == "evt_given"
    ((query, params),) = conn.executed
    assert query.startswith("INSERT INTO webhook_outbox")
    assert params == ("evt_given", "acme", "invoice.paid", "2026-01-01", "inv_1", 7, at,
                      '{"a":[1,"é"],"b":2}'.encode())


CANONICAL = [
    # payload                                 -> stored bytes
    ({"b": 1, "a": {"d": None, "c": True}}, b'{"a":{"c":true,"d":null},"b":1}'),
    ([3, "x"], b'[3,"x"]'),
    ({"n": "☕"}, '{"n":"☕"}'.encode()),
    ('{"kept":  "as is"}', b'{"kept":  "as is"}'),         # text: the producer's exact bytes
    (b'{"z":1,"a":2}', b'{"z":1,"a":2}'),                   # bytes: never re-serialised
    ("[]", b"[]"),
]


@pytest.mark.parametrize(("payload", "stored"), CANONICAL)
def test_canonical_payload(payload: Any, stored: bytes) -> None:
    assert canonical_payload(payload) == stored


REFUSED = [
    # field changes                                          message contains
    ({"tenant_id": "A"}, "tenant_id"),
    ({"tenant_id": ""}, "tenant_id must be 1..200"),
    ({"tenant_id": 7}, "tenant_id must be a string"),
    ({"event_type": "Invoice.Paid"}, "event_type 'Invoice.Paid' must match"),
    ({"event_type": "invoice..paid"}, "event_type"),
    ({"event_id": "evt 1"}, "event_id"),
    ({"event_id": ""}, "event_id must be 1..200"),
    ({"schema_version": ""}, "schema_version"),
    ({"object_id": 9}, "object_id must be a string"),
    ({"object_version": "7"}, "object_version must be an integer"),
    ({"object_version": True}, "object_version must be an integer"),
    ({"occurred_at": datetime(2026, 1, 1)}, "occurred_at must be a datetime with a time zone"),
    ({"occurred_at": "2026-01-01T00:00:00Z"}, "occurred_at must be a datetime"),
    ({"payload": "{not json"}, "payload is not strict JSON: it is not one JSON document"),
    ({"payload": b"\xff\xfe"}, "payload is not strict JSON: it is not UTF-8"),
    ({"payload": '{"a":1} {"b":2}'}, "payload is not strict JSON: it is not one JSON document"),
    # What the job would dead-letter as payload_not_json (core/strict_json.py) is refused here first.
    ({"payload": b'{"amount":NaN}'}, "NaN is not a JSON number"),
    ({"payload": '{"amount":Infinity}'}, "Infinity is not a JSON number"),
    ({"payload": b'{"amount":1e999}'}, "past the range of a double"),
    ({"payload": '{"note":"\\ud800"}'}, "lone surrogate"),
    ({"payload": b'{"amount":-5,"amount":5}'}, "the key 'amount' appears twice"),
    ({"payload": '{"a":1}'.encode("utf-16")}, "it is not UTF-8"),
    ({"payload": b'\xef\xbb\xbf{"a":1}'}, "byte order mark"),
    ({"payload": {"note": "\ud800"}}, "not JSON-serialisable"),
    ({"payload": {"x": float("nan")}}, "not JSON-serialisable"),
    ({"payload": {"x": object()}}, "not JSON-serialisable"),
    ({"payload": 42}, "payload must be a mapping, a list, bytes or str"),
    ({"payload": "[" + "1," * 600 + "1]", "max_payload_bytes": 1000}, "the limit is 1000"),
]


@pytest.mark.parametrize(("changes", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_refusals_name_the_field_and_write_nothing(changes: dict[str, Any], message: str) -> None:
    conn = RecordingConnection()
    with pytest.raises(OutboxError, match=message.replace("(", r"\(").replace(".", r"\.")):
        write(conn, **changes)
    assert conn.executed == []


def test_an_autocommit_connection_is_refused() -> None:
    """The row would commit on its own, apart from the business change: the dual write again."""
    conn = RecordingConnection(autocommit=True)
    with pytest.raises(OutboxError, match="autocommit"):
        write(conn)
    assert conn.executed == []


def test_event_ids_are_unique_time_ordered_and_valid_ids() -> None:
    assert new_event_id(0x0123456789AB, bytes(range(10))) == "evt_0123456789ab00010203040506070809"
    ids = [new_event_id(now_ms=1_000 + i) for i in range(50)]
    assert ids == sorted(ids) and len(set(ids)) == 50
    event_id, _ = write()
    assert event_id.startswith("evt_") and len(event_id) == 36


def test_occurred_at_in_any_zone_is_one_instant() -> None:
    east = datetime(2026, 12, 1, 13, 0, tzinfo=timezone(timedelta(hours=1)))
    _, conn = write(occurred_at=east)
    assert conn.executed[0][1][6] == datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_what_the_library_writes_the_job_reads_back_byte_for_byte() -> None:
    """The row as Debezium streams it (bytea -> base64, timestamptz -> ISO text) parses to the
    same event: the library and core.ingest agree on every field."""
    import base64

    at = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
    event_id, conn = write(payload={"id": "inv_1", "n": "☕"}, object_id="inv_1", object_version=3, occurred_at=at)
    (_, (eid, tenant, etype, schema, obj, version, occurred, body)), = conn.executed
    envelope = {"op": "c", "before": None, "after": {
        "event_id": eid, "tenant_id": tenant, "event_type": etype, "schema_version": schema, "object_id": obj,
        "object_version": version, "occurred_at": occurred.isoformat().replace("+00:00", "Z"),
        "payload": base64.b64encode(body).decode(), "envelope_version": 2}}
    record = parse_event(json.dumps(envelope).encode(), 256 * 1024)
    assert (record.event_id, record.tenant_id, record.event_type, record.payload) == (
        event_id, "acme", "invoice.paid", body)
    assert record.occurred_at_ms == int(at.timestamp() * 1000)


# -- trace context ----------------------------------------------------------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class MemorySpans:
    def __init__(self) -> None:
        self.spans: list[Span] = []

    def export(self, span: Span) -> None:
        self.spans.append(span)


def _row_trace(conn: RecordingConnection) -> str | None:
    ((query, params),) = conn.executed
    if "traceparent" not in query:
        return None
    assert len(params) == 9
    return str(params[8])


GIVEN = [
    # the caller's traceparent                     what the row carries (no tracer)
    (None, None),  # nothing named: the insert of a database not migrated to the column still works
    (TRACEPARENT, TRACEPARENT),
    (" " + TRACEPARENT[:-2] + "09\t", TRACEPARENT),  # kept in the normal form
    ("00-not-a-traceparent", None),  # invalid: ignored, the event is written
]


@pytest.mark.parametrize(("given", "row"), GIVEN)
def test_a_given_traceparent_is_stored_as_it_is_without_a_tracer(given: str | None, row: str | None) -> None:
    _, conn = write(traceparent=given)
    assert _row_trace(conn) == row


def test_a_tracer_starts_a_trace_and_the_row_carries_the_outbox_spans_id() -> None:
    spans = MemorySpans()
    event_id, conn = write(tracer=Tracer(spans, HeadSampler(1.0), random.Random(4)))
    (span,) = spans.spans
    assert span.name == "outbox write" and span.parent_span_id is None
    assert span.attributes["webhooks.event.id"] == event_id
    assert _row_trace(conn) == span.context.traceparent
    assert span.start_ns <= span.end_ns


def test_a_tracer_continues_the_callers_trace_as_a_child() -> None:
    spans = MemorySpans()
    _, conn = write(traceparent=TRACEPARENT, tracer=Tracer(spans, HeadSampler(0.0), random.Random(4)))
    (span,) = spans.spans  # the caller's decision, not the ratio (0)
    parent = parse(TRACEPARENT)
    assert span.context.trace_id == parent.trace_id and span.parent_span_id == parent.span_id
    assert _row_trace(conn) == span.context.traceparent


def test_a_trace_not_sampled_records_nothing_and_the_decision_rides_with_the_row() -> None:
    spans = MemorySpans()
    _, conn = write(tracer=Tracer(spans, HeadSampler(0.0), random.Random(4)))
    assert spans.spans == []
    row = _row_trace(conn)
    assert row is not None and parse(row).sampled is False  # the job does not sample it again


def test_the_traceparent_the_row_carries_reaches_the_event_the_job_reads() -> None:
    import base64

    _, conn = write(traceparent=TRACEPARENT)
    (_, (eid, tenant, etype, schema, obj, version, occurred, body, traceparent)), = conn.executed
    envelope = {"op": "c", "before": None, "after": {
        "event_id": eid, "tenant_id": tenant, "event_type": etype, "schema_version": schema, "object_id": obj,
        "object_version": version, "occurred_at": occurred.isoformat().replace("+00:00", "Z"),
        "payload": base64.b64encode(body).decode(), "envelope_version": 2, "traceparent": traceparent}}
    assert parse_event(json.dumps(envelope).encode(), 256 * 1024).traceparent == TRACEPARENT
