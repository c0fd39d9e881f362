"""A delivery's trace through the pure core: ingest reads an event's traceparent (keeping only a
valid one, in its normal form), fan-out hands the deliveries theirs, keyed state keeps it (a new
stored shape only when there is one), and the spans' values (core/spans.py)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest

from core import dispatch as dsp
from core.endpoint_store import STORED_V2, STORED_V3, decode, encode, with_manual, with_skip
from core.fanout import NewDelivery, deliveries_for
from core.ingest import parse_event
from core.outcomes import ErrorClass, HttpResult
from core.records import EndpointConfig, EndpointStatus, EventRecord
from core.spans import (
    ATTEMPT,
    FAN_OUT,
    MS,
    SpanKind,
    attempt_span,
    fan_out_span,
    http_span,
    outbox_span,
    rpc_span,
)
from core.trace_context import TraceContext

T0 = 1_795_978_800_000
TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

PLAIN: dict[str, Any] = {"schema": "webhooks.event/v1", "event_id": "evt_1", "tenant_id": "t_1",
                         "event_type": "invoice.paid", "schema_version": "1", "occurred_at": T0,
                         "payload": '{"id":"inv_9"}'}


def _outbox_envelope(**row: Any) -> bytes:
    after = {"event_id": "evt_1", "tenant_id": "t_1", "event_type": "invoice.paid", "schema_version": "1",
             "object_id": None, "object_version": None, "occurred_at": T0, "envelope_version": 2,
             "payload": base64.b64encode(b'{"id":"inv_9"}').decode(), **row}
    return json.dumps({"op": "c", "before": None, "after": after, "source": {}}).encode()


INGEST = [
    # the record                                                    the event's traceparent
    (json.dumps(PLAIN).encode(), None),
    (json.dumps({**PLAIN, "traceparent": TP}).encode(), TP),
    (json.dumps({**PLAIN, "traceparent": f" {TP[:-2]}09"}).encode(), TP),  # normal form: 00, the sampled bit
    (json.dumps({**PLAIN, "traceparent": "cc-" + TP[3:] + "-later"}).encode(), TP),
    (json.dumps({**PLAIN, "traceparent": "00-bad"}).encode(), None),  # invalid: ignored, not refused
    (json.dumps({**PLAIN, "traceparent": TP + "\r\nx-injected: 1"}).encode(), None),
    (json.dumps({**PLAIN, "traceparent": 42}).encode(), None),
    (json.dumps({**PLAIN, "traceparent": None}).encode(), None),
    (_outbox_envelope(), None),  # a row written before the column existed
    (_outbox_envelope(traceparent=None), None),
    (_outbox_envelope(traceparent=TP), TP),
    (_outbox_envelope(traceparent="ff-" + TP[3:]), None),
]


@pytest.mark.parametrize(("raw", "traceparent"), INGEST)
def test_ingest_keeps_a_valid_traceparent_in_normal_form_and_drops_any_other(raw: bytes,
                                                                          traceparent: str | None) -> None:
    event = parse_event(raw, 1024)
    assert event.traceparent == traceparent
    assert event.payload == b'{"id":"inv_9"}'  # the event itself is delivered either way


def test_the_plain_form_carries_it_only_when_there_is_one() -> None:
    event = parse_event(json.dumps({**PLAIN, "traceparent": TP}).encode(), 1024)
    assert json.loads(event.to_json())["traceparent"] == TP
    assert parse_event(event.to_json(), 1024) == event
    assert "traceparent" not in json.loads(replace(event, traceparent=None).to_json())


def _event(traceparent: str | None = TP) -> EventRecord:
    return EventRecord(event_id="evt_1", tenant_id="t_1", event_type="invoice.paid", schema_version="1",
                       object_id="", object_version=0, occurred_at_ms=T0, payload=b"{}", traceparent=traceparent)


def _config(endpoint_id: str) -> EndpointConfig:
    return EndpointConfig(endpoint_id=endpoint_id, tenant_id="t_1", config_version=3, url="https://example.com/",
                          status=EndpointStatus.ACTIVE, event_types=("*",), signing_keys=(), published_at_ms=T0)


def test_every_delivery_of_an_event_carries_the_trace_fan_out_gives_it() -> None:
    fan_out_trace = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    fanned = deliveries_for(_event(), [_config("ep_1"), _config("ep_2")], T0, 1000, trace=fan_out_trace)
    assert {d.trace for d in fanned} == {fan_out_trace}
    assert {d.trace for d in deliveries_for(_event(), [_config("ep_1")], T0, 1000)} == {None}


def _pending(trace: str | None) -> dsp.Pending:
    d = NewDelivery(delivery_id="dlv_1", event=replace(_event(None), payload=b""), endpoint_id="ep_1",
                    tenant_id="t_1", endpoint_config_version=3, created_at_ms=T0, expires_at_ms=T0 + 1000,
                    trace=trace)
    return dsp.Pending(delivery=d, stage=dsp.Stage.READY, attempt_count=1, issued=1,
                       manual=(dsp.ManualRequest("r1", "alice", T0, "t_1"),))


def test_keyed_state_keeps_a_deliverys_trace_and_stays_as_it_was_without_one() -> None:
    traced, plain = _pending(TP), _pending(None)
    assert encode(plain)[0] == STORED_V2  # no trace: the shape and size every entry had
    assert encode(traced)[0] == STORED_V3 and encode(traced)[-1] == TP
    assert decode(encode(traced), "ep_1", "dlv_1") == traced
    assert decode(encode(plain), "ep_1", "dlv_1") == plain
    skip = dsp.ManualRequest("s1", "ops", T0, "t_1")
    more = dsp.ManualRequest("r2", "bob", T0, "t_1")
    for p in (traced, plain):
        stored = encode(p)
        assert decode(with_skip(stored, skip), "ep_1", "dlv_1") == replace(p, skip=skip)
        assert decode(with_manual(stored, (more,)), "ep_1", "dlv_1").manual == (*p.manual, more)
        assert with_skip(stored, skip)[0] == stored[0]


CTX = TraceContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x1111, True)
PARENT = 0x00F067AA0BA902B7


def _delivery() -> NewDelivery:
    return _pending(TP).delivery


ATTEMPTS = [
    # result                                                      status attr  error            error.type
    (HttpResult(200), 200, None, None),
    (HttpResult(204), 204, None, None),
    (HttpResult(503), 503, "HTTP 503", "503"),
    (HttpResult(301), 301, "HTTP 301", "301"),
    (HttpResult(None, ErrorClass.TIMEOUT, detail="timed out"), None, "timeout: timed out", "timeout"),
    (HttpResult(None, ErrorClass.CONNECT), None, "connect", "connect"),
]


@pytest.mark.parametrize(("result", "status", "error", "error_type"), ATTEMPTS)
def test_an_attempt_span_says_what_the_receiver_answered(result: HttpResult, status: int | None, error: str | None,
                                                         error_type: str | None) -> None:
    span = attempt_span(CTX, PARENT, delivery=_delivery(), attempt=2, manual=False, config_version=3, result=result,
                        latency_ms=12, start_ns=T0 * MS, end_ns=T0 * MS + 12 * MS)
    assert (span.name, span.kind, span.context, span.parent_span_id) == (ATTEMPT, SpanKind.CLIENT, CTX, PARENT)
    assert span.attributes.get("http.response.status_code") == status
    assert span.error == error
    assert span.attributes.get("error.type") == error_type
    assert {k: span.attributes[k] for k in ("webhooks.attempt.number", "webhooks.attempt.latency_ms",
                                            "webhooks.endpoint.config_version", "webhooks.delivery.id",
                                            "webhooks.endpoint.id", "webhooks.tenant.id")} == {
        "webhooks.attempt.number": 2, "webhooks.attempt.latency_ms": 12, "webhooks.endpoint.config_version": 3,
        "webhooks.delivery.id": "dlv_1", "webhooks.endpoint.id": "ep_1", "webhooks.tenant.id": "t_1"}
    # Nothing of the request itself: an endpoint's URL may carry a credential.
    assert not any("example.com" in str(v) for v in span.attributes.values())


def test_the_fan_out_span_runs_from_the_events_arrival_to_the_decision() -> None:
    span = fan_out_span(CTX, PARENT, event=_event(), topic="webhooks.events", arrived_ms=T0, decided_ms=T0 + 40,
                        endpoints=2, skipped=1)
    assert (span.name, span.kind, span.start_ns, span.end_ns) == (FAN_OUT, SpanKind.CONSUMER, T0 * MS, (T0 + 40) * MS)
    assert span.attributes["webhooks.fanout.endpoints"] == 2 and span.attributes["webhooks.fanout.skipped"] == 1
    assert span.error is None
    refused = fan_out_span(CTX, None, event=_event(), topic="t", arrived_ms=T0, decided_ms=T0 - 5, endpoints=0,
                           refused="schema_invalid")
    assert refused.error == "schema_invalid" and refused.end_ns == refused.start_ns  # never ends before it starts


def test_the_outbox_span_is_the_producers() -> None:
    span = outbox_span(CTX, None, event_id="evt_1", tenant_id="t_1", event_type="invoice.paid", start_ns=1, end_ns=2)
    assert span.kind is SpanKind.PRODUCER and span.parent_span_id is None
    assert span.attributes["webhooks.event.id"] == "evt_1"


@pytest.mark.parametrize(("code", "error"), [("OK", None), ("NOT_FOUND", "NOT_FOUND"), ("INTERNAL", "INTERNAL")])
def test_an_rpc_span_is_an_error_unless_ok(code: str, error: str | None) -> None:
    span = rpc_span(CTX, None, service="webhooks.v1.ControlPlane", method="GetEndpoint", code=code, code_number=5,
                    start_ns=1, end_ns=2)
    assert span.name == "webhooks.v1.ControlPlane/GetEndpoint" and span.kind is SpanKind.SERVER
    assert span.error == error and span.attributes["rpc.grpc.status_code"] == 5


@pytest.mark.parametrize(("status", "error"), [(200, None), (404, None), (412, None), (500, "HTTP 500"),
                                               (503, "HTTP 503")])
def test_an_http_span_is_an_error_only_for_the_servers_own(status: int, error: str | None) -> None:
    span = http_span(CTX, PARENT, method="GET", route="/v1/webhook-endpoints/{endpoint_id}", status=status,
                     start_ns=1, end_ns=2)
    assert span.name == "GET /v1/webhook-endpoints/{endpoint_id}" and span.error == error
    assert http_span(CTX, None, method="GET", route=None, status=404, start_ns=1, end_ns=2).name == "GET"
