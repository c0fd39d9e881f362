"""`webhookctl listen` without a stack: verification with the official library, the printed line and
JSON record, the diagnoses, and the HTTPS server end to end against a recording API stub."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import ssl
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import aiohttp
import pytest

from control_plane.cli import listen
from control_plane.errors import InvalidArgument
from control_plane.rpc.api import pb
from control_plane.validation import DestinationValidator
from core import signing
from core.egress import EgressPolicy
from core.settings import EgressSettings
from stack.certs import CertPaths, ensure_certs

SECRET = signing.generate_secret(b"\x05" * 32)
OTHER = signing.generate_secret(b"\x06" * 32)
BODY = b'{"id": "inv_1", "amount": 4200}'


def signed(body: bytes = BODY, secret: str = SECRET, at_s: int | None = None, **extra: str) -> dict[str, str]:
    """Headers the dispatcher sends (core.signing.build_headers), at a timestamp within the
    library's 5-minute tolerance unless ``at_s`` says otherwise."""
    ts = int(time.time()) if at_s is None else at_s
    headers = signing.build_headers("dlv_1", ts, body, [(1, signing.signing_material(secret))],
                                    event_type="invoice.paid", event_id="evt_1", occurred_at_ms=ts * 1000,
                                    schema_version="1", attempt=1)
    return {**headers, **extra}


@pytest.mark.parametrize(
    ("secret", "headers", "body", "ok", "reason"),
    # Headers are made when the test runs, not when it is collected: in the whole suite the unit
    # tests run many minutes after collection, and a timestamp signed then is stale by now.
    [
        (SECRET, lambda: signed(), BODY, True, ""),
        (OTHER, lambda: signed(), BODY, False, "No matching signature found"),
        (SECRET, lambda: signed(), BODY + b" ", False, "No matching signature found"),
        (SECRET, lambda: {k: v for k, v in signed().items() if k != "webhook-signature"}, BODY, False,
         "Missing required headers"),
        (SECRET, lambda: signed(at_s=int(time.time()) - 600), BODY, False, "Message timestamp too old"),
        (SECRET, lambda: signed(body=b"\xff\xfe"), b"\xff\xfe", False, "malformed request: UnicodeDecodeError"),
    ],
    ids=["signed", "other-secret", "body-changed", "no-signature", "stale", "not-utf8"],
)
def test_verify_uses_the_official_library(secret: str, headers: Callable[[], dict[str, str]], body: bytes, ok: bool,
                                          reason: str) -> None:
    assert listen.verify(secret, headers(), body) == listen.Verification(ok, reason)


def test_verify_accepts_any_live_key_during_a_rotation() -> None:
    ts = int(time.time())
    keys = [(2, signing.signing_material(OTHER)), (1, signing.signing_material(SECRET))]
    headers = signing.sign("dlv_1", ts, BODY, keys)
    assert listen.verify(SECRET, headers, BODY).ok and listen.verify(OTHER, headers, BODY).ok


AT = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=1)))


def received(body: bytes = BODY, ok: bool = True, reason: str = "", status: int = 200,
             headers: dict[str, str] | None = None) -> listen.Received:
    h = headers if headers is not None else {
        "webhook-id": "dlv_1", "webhook-event-type": "invoice.paid", "webhook-attempt": "2"}
    return listen.Received(AT, "POST", "/webhookctl-listen", h, body, listen.Verification(ok, reason), status)


@pytest.mark.parametrize(
    ("r", "expected"),
    [
        (received(), '03:04:05  invoice.paid  dlv_1  attempt 2  verified yes  -> 200  {"id": "inv_1", "amount": 4200}'),
        (received(ok=False, reason="No matching signature found", status=503),
         '03:04:05  invoice.paid  dlv_1  attempt 2  verified NO (No matching signature found)  -> 503  '
         '{"id": "inv_1", "amount": 4200}'),
        (received(headers={}, body=b'{\n  "a":   1\n}'), '03:04:05  -  -  attempt ?  verified yes  -> 200  { "a": 1 }'),
        (received(body=b"x" * 100), "03:04:05  invoice.paid  dlv_1  attempt 2  verified yes  -> 200  "
         + "x" * 57 + "..."),
    ],
    ids=["verified", "not-verified", "no-headers", "long-body"],
)
def test_one_line_per_delivery(r: listen.Received, expected: str) -> None:
    assert listen.line(r) == expected


def test_the_json_record_has_everything_and_base64_for_bytes_that_are_not_text() -> None:
    text = listen.record(received(ok=False, reason="stale"))
    assert text == {
        "received_at": "2025-01-02T03:04:05+01:00", "method": "POST", "path": "/webhookctl-listen",
        "delivery_id": "dlv_1", "event_type": "invoice.paid", "attempt": "2", "verified": False,
        "verification_error": "stale", "answered": 200,
        "headers": {"webhook-id": "dlv_1", "webhook-event-type": "invoice.paid", "webhook-attempt": "2"},
        "body": BODY.decode(),
    }
    raw = listen.record(received(body=b"\xff\x00"))
    assert raw["body_base64"] == "/wA=" and "body" not in raw


def _refusal(settings: EgressSettings) -> str:
    url = "https://127.0.0.1:8443/webhookctl-listen"
    with pytest.raises(InvalidArgument) as refused:
        DestinationValidator(EgressPolicy.from_settings(settings))(url)
    return str(refused.value)


@pytest.mark.parametrize(
    "settings",
    [EgressSettings(), EgressSettings(allowed_ports=[443, 8443])],
    ids=["strict-stack: port refused first", "port allowed, loopback refused"],
)
def test_a_stack_without_the_allowance_is_explained_with_the_switch(settings: EgressSettings) -> None:
    """The hint reads the control plane's real refusal, so a reworded message fails here."""
    hint = listen.refusal_hint(_refusal(settings), "https://127.0.0.1:8443/webhookctl-listen")
    assert hint is not None and "make run LOCAL_RECEIVERS=1" in hint and "production" in hint


def test_other_refusals_get_no_egress_hint() -> None:
    assert listen.refusal_hint("url is required (an https:// URL)", "https://127.0.0.1:8443/") is None


@pytest.mark.parametrize(
    ("attempts", "says"),
    [
        ([], "is the delivery job running"),
        ([("retry", 0, "egress_refused")], "make run LOCAL_RECEIVERS=1"),
        ([("retry", 0, "tls")], "does not trust the listener's certificate"),
        ([("retry", 0, "connect"), ("retry", 502, "http_5xx")], "last attempt: retry (502)"),
    ],
)
def test_a_ping_that_did_not_arrive_is_diagnosed(attempts: list[tuple[str, int, str]], says: str) -> None:
    assert says in listen.ping_diagnosis(attempts, 20)


# -- the server, end to end on loopback -------------------------------------------------------


class FakeTenant:
    """The tenant API as the listener calls it; records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def CreateEndpoint(self, request: Any) -> Any:
        self.calls.append(("CreateEndpoint", request))
        return pb.CreateEndpointResponse(endpoint=pb.Endpoint(endpoint_id="ep_1"), signing_secret=SECRET)

    def DeleteEndpoint(self, request: Any) -> Any:
        self.calls.append(("DeleteEndpoint", request))
        return pb.Endpoint(endpoint_id=request.endpoint_id)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertPaths:
    paths, _ = ensure_certs(tmp_path_factory.mktemp("certs"))
    return paths


def test_the_listener_verifies_prints_answers_and_deletes_its_endpoint(
        certs: CertPaths, capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    args = argparse.Namespace(endpoint=None, event_type=["invoice.*"], status=503, port=port, keep=False,
                              ping=False, json=False)
    tenant = FakeTenant()

    async def scenario() -> list[int]:
        serving = asyncio.create_task(listen.serve(args, tenant, certs))
        client_tls = ssl.create_default_context(cafile=str(certs.ca_cert))
        statuses = []
        async with aiohttp.ClientSession() as session:
            for _ in range(100):  # until the endpoint exists (the server starts first)
                if tenant.calls:
                    break
                await asyncio.sleep(0.05)
            for secret in (SECRET, OTHER):
                async with session.post(f"https://127.0.0.1:{port}{listen.PATH}", data=BODY,
                                        headers=signed(secret=secret), ssl=client_tls) as response:
                    statuses.append(response.status)
        os.kill(os.getpid(), signal.SIGTERM)  # the listener's own handler stops it
        assert await serving == 0
        return statuses

    assert asyncio.run(scenario()) == [503, 503]
    create, delete = tenant.calls
    assert create[0] == "CreateEndpoint"
    assert create[1].url == f"https://127.0.0.1:{port}/webhookctl-listen"
    assert list(create[1].event_types) == ["invoice.*"]
    assert delete == ("DeleteEndpoint", pb.GetEndpointRequest(endpoint_id="ep_1"))
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 2
    assert "invoice.paid  dlv_1  attempt 1  verified yes  -> 503" in lines[0]
    assert "verified NO (No matching signature found)  -> 503" in lines[1]
    assert "listening on" in err and "deleted endpoint ep_1" in err


def test_a_busy_port_is_reported_before_any_endpoint_is_created(
        certs: CertPaths, capsys: pytest.CaptureFixture[str]) -> None:
    tenant = FakeTenant()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = argparse.Namespace(endpoint=None, event_type=None, status=200, port=taken.getsockname()[1],
                                  keep=False, ping=False, json=False)
        assert asyncio.run(listen.serve(args, tenant, certs)) == 1
    assert tenant.calls == []
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
