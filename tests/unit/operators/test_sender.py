"""The Sender's part of a request: what it raises when the request cannot be built."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

import pytest

from core import custom_headers, dispatch
from core.custom_headers import HeaderInput, SealedHeader
from core.fanout import NewDelivery
from core.records import EndpointConfig, EndpointStatus, EventRecord, SigningKey
from core.secrets import Keyring, encrypt_secret
from core.settings import DispatchSettings
from core.signing import generate_secret
from core.spans import Span, Tracer
from core.trace_context import HeadSampler, parse
from operators import sender as sender_module
from operators.http_sender import SendResult
from operators.sender import Sender, SigningKeyUnavailable

T0 = 1_700_000_000_000


class RecordingHttp:
    def __init__(self) -> None:
        self.calls = 0

    async def send(self, *_: Any) -> None:
        self.calls += 1


def _broken(*_: Any, **__: Any) -> None:
    raise ValueError("secret-looking value whsec_abc")


@pytest.mark.parametrize("step", ["minimise", "build_headers"])
def test_a_request_that_cannot_be_built_raises_not_sent_and_nothing_leaves(
        monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    # Such an error escaped as itself and was recorded as a sent attempt (class internal).
    monkeypatch.setattr(sender_module, step, _broken)
    http = RecordingHttp()
    s = Sender(DispatchSettings(), http, None)  # type: ignore[arg-type]
    e = EventRecord(event_id="evt_1", tenant_id="t_1", event_type="invoice.paid", schema_version="1",
                    object_id="", object_version=0, occurred_at_ms=T0, payload=b"{}")
    p = dispatch.Pending(
        delivery=NewDelivery(delivery_id="dlv_1", event=e, endpoint_id="ep_1", tenant_id="t_1",
                             endpoint_config_version=1, created_at_ms=T0, expires_at_ms=T0 + 86_400_000),
        stage=dispatch.Stage.SENDING, intent=dispatch.Intent(1, "att_1"))
    cfg = EndpointConfig(endpoint_id="ep_1", tenant_id="t_1", url="https://example.com/", status=EndpointStatus.ACTIVE,
                         event_types=("*",), config_version=1, published_at_ms=T0, signing_keys=())
    with pytest.raises(dispatch.NotSent) as raised:
        asyncio.run(s.send(p, b"{}", cfg, []))
    assert http.calls == 0
    assert "whsec" not in str(raised.value)  # the type only, never the message


# -- custom headers ---------------------------------------------------------------------------------

RING = Keyring.single(bytes(range(32)))
SECRET = "sk_live_header_secret"


class CapturingHttp:
    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    async def send(self, url: str, body: bytes, headers: Any) -> SendResult:
        self.headers.append(dict(headers))
        return SendResult(status=200, error=None, error_detail="", latency_ms=1)


def _config(headers: tuple[SealedHeader, ...], endpoint_id: str = "ep_1") -> EndpointConfig:
    secret = generate_secret(bytes(32))
    key = SigningKey(1, encrypt_secret(RING, secret, tenant_id="t_1", endpoint_id=endpoint_id, key_version=1,
                                       nonce=bytes(12)))
    return EndpointConfig(endpoint_id=endpoint_id, tenant_id="t_1", url="https://example.com/",
                          status=EndpointStatus.ACTIVE, event_types=("*",), config_version=2, published_at_ms=T0,
                          signing_keys=(key,), headers=headers)


def _pending() -> dispatch.Pending:
    e = EventRecord(event_id="evt_1", tenant_id="t_1", event_type="invoice.paid", schema_version="1",
                    object_id="", object_version=0, occurred_at_ms=T0, payload=b"{}")
    return dispatch.Pending(
        delivery=NewDelivery(delivery_id="dlv_1", event=e, endpoint_id="ep_1", tenant_id="t_1",
                             endpoint_config_version=2, created_at_ms=T0, expires_at_ms=T0 + 86_400_000),
        stage=dispatch.Stage.SENDING, intent=dispatch.Intent(1, "att_1"))


def _sealed(endpoint_id: str = "ep_1") -> tuple[SealedHeader, ...]:
    return custom_headers.seal([HeaderInput("X-Tenant", "acme"), HeaderInput("Authorization", SECRET, True)], (),
                               RING, tenant_id="t_1", endpoint_id=endpoint_id, random_bytes=lambda n: b"\x01" * n)


def test_custom_headers_go_with_every_request_secret_values_opened_signature_intact() -> None:
    http = CapturingHttp()
    s = Sender(DispatchSettings(), http, RING)  # type: ignore[arg-type]
    cfg = _config(_sealed())
    for _ in range(2):  # a retry sends them again
        asyncio.run(s.send(_pending(), b"{}", cfg, s.keys(cfg, T0)))
    for sent in http.headers:
        assert sent["X-Tenant"] == "acme" and sent["Authorization"] == SECRET
        assert sent["webhook-id"] == "dlv_1" and sent["webhook-signature"].startswith("v1,")
        assert sent["user-agent"] == DispatchSettings().user_agent


def test_a_secret_header_that_does_not_open_holds_the_endpoint_before_anything_is_sent() -> None:
    http = CapturingHttp()
    s = Sender(DispatchSettings(), http, RING)  # type: ignore[arg-type]
    cfg = _config(_sealed(endpoint_id="ep_other"))  # sealed for another endpoint: does not open here
    with pytest.raises(SigningKeyUnavailable, match="custom header 'Authorization'") as raised:
        s.keys(cfg, T0)
    assert SECRET not in str(raised.value)
    assert http.headers == []


# -- trace context ----------------------------------------------------------------------------------

TRACED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
UNSAMPLED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


class MemorySpans:
    def __init__(self) -> None:
        self.spans: list[Span] = []

    def export(self, span: Span) -> None:
        self.spans.append(span)


def _traced(trace: str | None) -> dispatch.Pending:
    p = _pending()
    return replace(p, delivery=replace(p.delivery, trace=trace))


def _send(s: Sender, p: dispatch.Pending) -> dict[str, str]:
    http = s._http  # type: ignore[attr-defined]
    cfg = _config(())
    asyncio.run(s.send(p, b"{}", cfg, s.keys(cfg, T0)))
    return http.headers[-1]  # type: ignore[no-any-return]


@pytest.mark.parametrize("trace", [TRACED, UNSAMPLED])
def test_tracing_off_passes_the_deliverys_traceparent_on_as_it_came(trace: str) -> None:
    s = Sender(DispatchSettings(), CapturingHttp(), RING)  # type: ignore[arg-type]
    assert _send(s, _traced(trace))["traceparent"] == trace


def test_without_a_trace_no_traceparent_is_sent_whether_tracing_is_on_or_off() -> None:
    spans = MemorySpans()
    for tracer in (None, Tracer(spans, HeadSampler(1.0), random.Random(1))):
        s = Sender(DispatchSettings(), CapturingHttp(), RING, tracer)  # type: ignore[arg-type]
        assert "traceparent" not in _send(s, _traced(None))
    assert spans.spans == []  # an attempt never starts a trace


def test_tracing_on_each_attempt_is_a_child_span_of_fan_out_and_the_receiver_gets_its_id() -> None:
    spans = MemorySpans()
    tracer = Tracer(spans, HeadSampler(0.0), random.Random(1))
    s = Sender(DispatchSettings(), CapturingHttp(), RING, tracer)  # type: ignore[arg-type]
    sent = [_send(s, _traced(TRACED))["traceparent"] for _ in range(2)]  # a retry is a span of its own
    fan_out = parse(TRACED)
    for header, span in zip(sent, spans.spans, strict=True):
        got = parse(header)
        assert got.trace_id == fan_out.trace_id and got.sampled  # the parent decided, not the ratio (0)
        assert got.span_id == span.context.span_id != fan_out.span_id
        assert span.parent_span_id == fan_out.span_id
        assert span.attributes["http.response.status_code"] == 200 and span.error is None
        assert span.attributes["webhooks.attempt.number"] == 1
        assert span.attributes["webhooks.endpoint.config_version"] == 2
    assert sent[0] != sent[1]


def test_tracing_on_an_unsampled_trace_goes_on_unchanged_and_nothing_is_recorded() -> None:
    spans = MemorySpans()
    tracer = Tracer(spans, HeadSampler(1.0), random.Random(1))
    s = Sender(DispatchSettings(), CapturingHttp(), RING, tracer)  # type: ignore[arg-type]
    assert _send(s, _traced(UNSAMPLED))["traceparent"] == UNSAMPLED
    assert spans.spans == []


def test_the_traceparent_header_is_the_platforms_a_custom_one_cannot_replace() -> None:
    with pytest.raises(custom_headers.InvalidHeaders, match="reserved .the delivery's W3C trace context"):
        custom_headers.check([HeaderInput("TraceParent", TRACED)])
    assert custom_headers.with_platform_headers({"traceparent": "x", "tracestate": "y"}, {"a": "b"}) == {"a": "b"}
