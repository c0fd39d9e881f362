"""One trace per delivery on the real stack: a job and control plane of this module's own with
tracing on at ratio 1.0, an outbox of its own (PostgreSQL + Debezium) streaming to the job's
events topic, the session's receiver, and the stack's Jaeger (`make test` starts it if it is not
running: stack/test.sh) whose query API the spans are read back from.

The trace asserted: ``outbox write`` (the producer library) -> ``fan-out`` (the job) ->
``webhook attempt`` (one per request, with the receiver's status), the receiver's ``traceparent``
naming the attempt span in the outbox's trace, and the Kafka record's ``traceparent`` header the
row's. Without tracing (the session's own job) a traceparent an event carries reaches the
receiver unchanged.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from cassandra.cluster import Session

from core.records import delivery_id_for
from core.settings import Settings
from core.trace_context import TraceContext, parse
from outbox.producer import write_event
from stack.outbox_relay import OutboxRelay
from tests.support.faults import wait_all_reached
from tests.support.helpers import create_endpoints, event, eventually, new_tenant, produce
from tests.support.stack_fixtures import RUN, RUN_ID, second_stack
from tests.support.topic_watch import TopicWatch
from tracing import tracer

pytestmark = pytest.mark.integration

JAEGER = os.environ.get("WEBHOOKS_JAEGER_URL", f"http://127.0.0.1:{os.environ.get('WEBHOOKS_JAEGER_UI_PORT', '16686')}")
TRACED = {"WEBHOOKS_TRACING__ENABLED": "true", "WEBHOOKS_TRACING__SAMPLE_RATIO": "1.0",
          # Batches leave within a fifth of a second, so the trace is in Jaeger soon after the request.
          "WEBHOOKS_TRACING__EXPORT_DELAY_MS": "200"}


@pytest.fixture(scope="module")
def traced_stack(job_env: dict[str, str]) -> Iterator[tuple[Settings, str, Session]]:
    with second_stack(job_env, "trace", TRACED) as stack:
        yield stack


@pytest.fixture(scope="module")
def traced_channel(traced_stack: tuple[Settings, str, Session]) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(traced_stack[1])
    grpc.channel_ready_future(ch).result(timeout=10)
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def traced_relay(traced_stack: tuple[Settings, str, Session], job_env: dict[str, str]) -> Iterator[OutboxRelay]:
    """An outbox of this module's own streaming to the traced job's events topic."""
    settings = traced_stack[0]
    relay = OutboxRelay({**job_env, "WEBHOOKS_KAFKA__EVENTS_TOPIC": settings.kafka.events_topic},
                        RUN / f"test-trace-outbox-{RUN_ID}", flush_ms=10_000)
    relay.start()
    yield relay
    relay.stop()


def _jaeger_trace(ctx: TraceContext) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{JAEGER}/api/traces/{ctx.trace_id_hex}", timeout=5) as resp:
            data = json.load(resp)["data"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return data[0] if data else None


def _spans(ctx: TraceContext, need: dict[str, int], timeout: float = 60) -> list[dict[str, Any]]:
    """The trace's spans once Jaeger holds at least ``need`` of each operation."""
    def complete() -> list[dict[str, Any]] | None:
        trace = _jaeger_trace(ctx)
        if trace is None:
            return None
        spans: list[dict[str, Any]] = trace["spans"]
        for s in spans:
            s["service"] = trace["processes"][s["processID"]]["serviceName"]
            s["tagmap"] = {t["key"]: t["value"] for t in s["tags"]}
        names = [s["operationName"] for s in spans]
        return spans if all(names.count(op) >= n for op, n in need.items()) else None

    return eventually(complete, timeout=timeout, interval=1, what=f"trace {ctx.trace_id_hex} in Jaeger")


def _id(hex_id: str) -> int:
    return int(hex_id, 16)


def _parent(span: dict[str, Any]) -> int | None:
    refs = [r for r in span["references"] if r["refType"] == "CHILD_OF"]
    return _id(refs[0]["spanID"]) if refs else None


def _one(spans: list[dict[str, Any]], operation: str) -> dict[str, Any]:
    (found,) = [s for s in spans if s["operationName"] == operation]
    return found


def test_a_delivery_is_one_trace_from_the_outbox_to_the_receiver(traced_stack, traced_channel, traced_relay,
                                                                 receiver) -> None:
    settings = traced_stack[0]
    tenant_id, api_key = new_tenant(traced_channel, settings)
    path = f"/trace/{tenant_id}"
    # The first request fails: the trace has two attempts, each with its status.
    receiver.set_behaviour(path, "503 then ok")
    (endpoint_id,) = create_endpoints(traced_channel, api_key, [receiver.base_url + path], ["order.*"])
    producer = tracer(settings.tracing, settings.tracing.producer_service_name)
    assert producer is not None
    watch = TopicWatch(settings)
    try:
        with traced_relay.connect() as conn:
            event_id = write_event(conn, tenant_id, "order.paid", {"id": "o_1"}, tracer=producer)
            (row_traceparent,) = conn.execute("SELECT traceparent FROM webhook_outbox WHERE event_id = %s",
                                              (event_id,)).fetchone()
        assert producer.sink.flush()  # type: ignore[attr-defined]  # the outbox span, now
        outbox = parse(row_traceparent)
        assert outbox.sampled
        # Debezium put the row's traceparent in the record's header (the job reads it from the row).
        watch.wait_for({event_id})
        assert ("traceparent", row_traceparent.encode()) in watch.headers[event_id]
    finally:
        watch.close()

    delivery_id = delivery_id_for(event_id, endpoint_id)
    wait_all_reached(receiver, {delivery_id}, timeout=60)
    eventually(lambda: len([r for r in receiver.requests(path) if r.webhook_id == delivery_id]) >= 2 or None,
               timeout=60, what="the retry at the receiver")
    requests = [r for r in receiver.requests(path) if r.webhook_id == delivery_id][:2]
    got = [parse(r.headers["traceparent"]) for r in requests]
    for ctx in got:  # the receiver's requests are in the outbox's trace, each naming its own attempt
        assert ctx.trace_id == outbox.trace_id and ctx.sampled
    assert len({ctx.span_id for ctx in got} | {outbox.span_id}) == 3

    spans = _spans(outbox, {"outbox write": 1, "fan-out": 1, "webhook attempt": 2})
    write = _one(spans, "outbox write")
    fan_out = _one(spans, "fan-out")
    attempts = sorted((s for s in spans if s["operationName"] == "webhook attempt"),
                      key=lambda s: int(s["tagmap"]["webhooks.attempt.number"]))
    assert _id(write["spanID"]) == outbox.span_id and write["service"] == settings.tracing.producer_service_name
    assert _parent(fan_out) == outbox.span_id and fan_out["service"] == settings.tracing.job_service_name
    assert fan_out["tagmap"]["webhooks.event.id"] == event_id
    for attempt, number, status, ctx in zip(attempts, (1, 2), (503, 200), got, strict=True):
        assert _parent(attempt) == _id(fan_out["spanID"])
        assert _id(attempt["spanID"]) == ctx.span_id  # the receiver got this span's id
        tags = attempt["tagmap"]
        assert int(tags["webhooks.attempt.number"]) == number
        assert int(tags["http.response.status_code"]) == status
        assert tags["webhooks.delivery.id"] == delivery_id and tags["webhooks.endpoint.id"] == endpoint_id
        assert tags["webhooks.tenant.id"] == tenant_id
        assert int(tags["webhooks.endpoint.config_version"]) >= 1
        assert (tags.get("otel.status_code") == "ERROR") is (status != 200)


def test_a_direct_producers_traceparent_is_continued(traced_stack, traced_channel, receiver) -> None:
    """An event produced straight to the topic (webhooks.event/v1) with a traceparent: fan-out is
    a child of the producer's span (which this test never exported), the attempt of fan-out."""
    settings = traced_stack[0]
    tenant_id, api_key = new_tenant(traced_channel, settings)
    path = f"/trace-direct/{tenant_id}"
    (endpoint_id,) = create_endpoints(traced_channel, api_key, [receiver.base_url + path], ["order.*"])
    producer = TraceContext(int.from_bytes(os.urandom(16), "big") | 1, int.from_bytes(os.urandom(8), "big") | 1, True)
    ev = event(tenant_id, "order.shipped", b'{"id": "o_2"}', traceparent=producer.traceparent)
    produce(settings, [ev.to_json()], [ev.event_id])
    delivery_id = delivery_id_for(ev.event_id, endpoint_id)
    wait_all_reached(receiver, {delivery_id}, timeout=60)
    (req,) = [r for r in receiver.requests(path) if r.webhook_id == delivery_id]
    assert parse(req.headers["traceparent"]).trace_id == producer.trace_id
    spans = _spans(producer, {"fan-out": 1, "webhook attempt": 1})
    assert _parent(_one(spans, "fan-out")) == producer.span_id
    assert _id(_one(spans, "webhook attempt")["spanID"]) == parse(req.headers["traceparent"]).span_id


def test_an_untraced_job_passes_an_events_traceparent_on_unchanged(settings, grpc_channel, delivery_job,
                                                                   receiver) -> None:
    assert not settings.tracing.enabled  # the session's job (stack.isolation: off unless a run asks)
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    path = f"/untraced/{tenant_id}"
    (endpoint_id,) = create_endpoints(grpc_channel, api_key, [receiver.base_url + path], ["order.*"])
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    ev = event(tenant_id, "order.shipped", b'{"id": "o_3"}', traceparent=traceparent)
    produce(settings, [ev.to_json()], [ev.event_id])
    delivery_id = delivery_id_for(ev.event_id, endpoint_id)
    wait_all_reached(receiver, {delivery_id}, timeout=60)
    (req,) = [r for r in receiver.requests(path) if r.webhook_id == delivery_id]
    assert req.headers["traceparent"] == traceparent
