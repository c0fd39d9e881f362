"""The Sender's part of a request: what it raises when the request cannot be built."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core import custom_headers, dispatch
from core.custom_headers import HeaderInput, SealedHeader
from core.fanout import NewDelivery
from core.records import EndpointConfig, EndpointStatus, EventRecord, SigningKey
from core.secrets import Keyring, encrypt_secret
from core.settings import DispatchSettings
from core.signing import generate_secret
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
