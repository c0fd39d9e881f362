"""HttpSender against in-process HTTPS servers on loopback (127.0.0.1 / 127.0.0.2) only.

No test sends a packet anywhere else: host names are answered by fake resolvers with loopback
addresses, and ``dev_allow_cidrs`` lets exactly the loopback addresses a test means to reach
through the policy. Certificates come from a throwaway ``trustme`` CA the sender trusts through
``ca_bundle``. Each test runs its own event loop (``asyncio.run``) and finishes in about a second.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import trustme
from aiohttp import web

from core.dispatch import NotSent
from core.egress import EgressPolicy, check_resolved
from core.outcomes import ErrorClass, classify
from core.settings import DispatchSettings
from operators import http_sender as http_sender_module
from operators.http_sender import HttpSender, SendResult

HOST = "hooks.example.com"
ALLOWED_IP = "127.0.0.2"
BLOCKED_IP = "127.0.0.1"
TOTAL_TIMEOUT_S = 1.0
MAX_BODY = 1024


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(HOST, "127.0.0.1", "127.0.0.2").configure_cert(context)
    return context


@pytest.fixture(scope="module")
def settings(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> DispatchSettings:
    bundle = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    return DispatchSettings(
        connect_timeout_s=0.5,
        total_timeout_s=TOTAL_TIMEOUT_S,
        max_response_bytes=MAX_BODY,
        max_header_bytes=2048,
        ca_bundle=bundle,
        user_agent="webhooks-test/1",
    )


def policy_for(ports: Sequence[int], *allowed: str) -> EgressPolicy:
    return EgressPolicy(
        allowed_ports=frozenset(ports),
        dev_allow_cidrs=tuple(ipaddress.ip_network(f"{a}/32") for a in allowed),
    )


class FakeDns:
    """Answers from a script, one answer per lookup (the last repeats); records every lookup.
    Unknown names fail like NXDOMAIN, so nothing ever reaches a real resolver."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self._answers = answers
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        script = self._answers.get(host)
        if not script:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return script.pop(0) if len(script) > 1 else script[0]


@asynccontextmanager
async def sender(
    settings: DispatchSettings, policy: EgressPolicy, dns: FakeDns
) -> AsyncIterator[HttpSender]:
    s = await HttpSender.create(settings, policy, resolver=dns)
    try:
        yield s
    finally:
        await s.close()


async def send_once(settings: DispatchSettings, port: int) -> SendResult:
    """One POST to https://HOST:port/ with HOST answering the allowed loopback address."""
    async with sender(settings, policy_for([port], ALLOWED_IP), FakeDns({HOST: [[ALLOWED_IP]]})) as s:
        return await s.send(f"https://{HOST}:{port}/", BODY, HEADERS)


@dataclass(frozen=True)
class Seen:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes


@asynccontextmanager
async def web_server(
    host: str, tls: ssl.SSLContext, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> AsyncIterator[tuple[int, list[Seen]]]:
    """An aiohttp HTTPS server; yields its port and the requests it received."""
    seen: list[Seen] = []

    async def record(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen.append(Seen(request.method, request.path_qs, dict(request.headers), body))
        return await handler(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port, seen
    finally:
        await runner.cleanup()


RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(host: str, tls: ssl.SSLContext, handler: RawHandler) -> AsyncIterator[int]:
    """A TLS socket server whose handler misbehaves at the byte level."""

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # the client hung up on us, which is what these tests provoke
        finally:
            writer.close()

    server = await asyncio.start_server(guarded, host, 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.close()
        await server.wait_closed()


async def read_request_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


def ok(text: str = "ok") -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=text)

    return handler


BODY = b'{"id":"inv_9","amount":100}'
HEADERS = {"webhook-id": "dlv_1", "webhook-timestamp": "1700000000", "webhook-signature": "v1,abc="}


T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# --- the happy path ----------------------------------------------------------------------------


def test_200_ok_sends_exact_bytes_and_headers(server_tls: ssl.SSLContext, settings: DispatchSettings) -> None:
    async def scenario() -> tuple[SendResult, list[Seen], FakeDns]:
        dns = FakeDns({HOST: [[ALLOWED_IP]]})
        async with (
            web_server(ALLOWED_IP, server_tls, ok("thanks")) as (port, seen),
            sender(settings, policy_for([port], ALLOWED_IP), dns) as s,
        ):
            result = await s.send(f"https://{HOST}:{port}/hook?x=1", BODY, HEADERS)
        return result, seen, dns

    result, seen, dns = run(scenario())
    assert (result.status, result.error, result.error_detail) == (200, None, "")
    assert result.response_prefix == "thanks"
    assert result.response_sha256 == hashlib.sha256(b"thanks").hexdigest()
    assert 0 <= result.latency_ms < 1000
    assert classify(result.http_result) is None
    assert dns.lookups == [HOST]
    (request,) = seen
    assert (request.method, request.path_qs) == ("POST", "/hook?x=1")
    assert request.headers["Host"].split(":")[0] == HOST  # the name, though we connected to an IP
    assert request.headers["webhook-id"] == "dlv_1"
    assert request.headers["User-Agent"] == "webhooks-test/1"
    assert request.headers["Accept-Encoding"] == "identity"
    assert request.body == BODY  # the exact bytes, as signed


# --- DNS rebinding -----------------------------------------------------------------------------


def test_rebinding_after_validation_never_reaches_the_blocked_address(
    server_tls: ssl.SSLContext, settings: DispatchSettings
) -> None:
    """The control plane validated the name (answer: allowed 127.0.0.2); at send time the name
    answers 127.0.0.1, which the policy blocks. The sender must refuse, not connect."""

    async def scenario() -> tuple[SendResult, list[Seen]]:
        # A receiver on the blocked address, at the URL's port: it records anything that arrives.
        async with web_server(BLOCKED_IP, server_tls, ok()) as (port, blocked_seen):
            policy = policy_for([port], ALLOWED_IP)
            dns = FakeDns({HOST: [[ALLOWED_IP], [BLOCKED_IP]]})
            check_resolved(await dns(HOST, port), policy)  # endpoint creation: passes
            async with sender(settings, policy, dns) as s:
                result = await s.send(f"https://{HOST}:{port}/", BODY, HEADERS)
        return result, blocked_seen

    result, blocked_seen = run(scenario())
    assert result.status is None and result.error is ErrorClass.EGRESS_REFUSED
    assert "127.0.0.1 is loopback" in result.error_detail
    assert blocked_seen == []


def test_every_new_connection_is_resolved_and_judged_again(
    server_tls: ssl.SSLContext, settings: DispatchSettings
) -> None:
    """First send: the name answers 127.0.0.2 and is delivered. The server closes the connection,
    the name now answers 127.0.0.1: the second send is refused before any connection."""

    async def close_after(_: web.Request) -> web.Response:
        return web.Response(text="ok", headers={"Connection": "close"})

    blocked_hits = 0

    async def count(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal blocked_hits
        blocked_hits += 1
        writer.close()

    async def scenario() -> tuple[list[SendResult], int]:
        # Same port on both addresses, so only the DNS answer decides where a connection goes.
        async with web_server(ALLOWED_IP, server_tls, close_after) as (port, allowed_seen):
            blocked = await asyncio.start_server(count, BLOCKED_IP, port)
            dns = FakeDns({HOST: [[ALLOWED_IP], [BLOCKED_IP]]})
            async with sender(settings, policy_for([port], ALLOWED_IP), dns) as s:
                results = [await s.send(f"https://{HOST}:{port}/", BODY, HEADERS) for _ in range(2)]
            blocked.close()
            await blocked.wait_closed()
            return results, len(allowed_seen)

    (first, second), allowed_hits = run(scenario())
    assert first.status == 200
    assert second.error is ErrorClass.EGRESS_REFUSED
    assert (allowed_hits, blocked_hits) == (1, 0)


def test_mixed_answer_is_refused_whole(server_tls: ssl.SSLContext, settings: DispatchSettings) -> None:
    async def scenario() -> tuple[SendResult, int, int]:
        async with web_server(ALLOWED_IP, server_tls, ok()) as (port, allowed_seen):
            dns = FakeDns({HOST: [[ALLOWED_IP, BLOCKED_IP]]})
            async with sender(settings, policy_for([port], ALLOWED_IP), dns) as s:
                result = await s.send(f"https://{HOST}:{port}/", BODY, HEADERS)
            return result, len(allowed_seen), len(dns.lookups)

    result, hits, lookups = run(scenario())
    assert result.error is ErrorClass.EGRESS_REFUSED and (hits, lookups) == (0, 1)


# --- redirects, sizes, time --------------------------------------------------------------------


def test_redirect_to_internal_address_is_returned_not_followed(
    server_tls: ssl.SSLContext, settings: DispatchSettings
) -> None:
    async def scenario() -> tuple[SendResult, list[Seen], list[Seen]]:
        internal = web_server(BLOCKED_IP, server_tls, ok("internal secrets"))
        async with internal as (internal_port, internal_seen):
            target = f"https://{BLOCKED_IP}:{internal_port}/admin"

            async def redirect(_: web.Request) -> web.Response:
                return web.Response(status=302, headers={"Location": target})

            async with web_server(ALLOWED_IP, server_tls, redirect) as (port, seen):
                # Both addresses allowed: only "never follow" keeps the internal server unvisited.
                policy = policy_for([port, internal_port], ALLOWED_IP, BLOCKED_IP)
                async with sender(settings, policy, FakeDns({HOST: [[ALLOWED_IP]]})) as s:
                    result = await s.send(f"https://{HOST}:{port}/", BODY, HEADERS)
        return result, seen, internal_seen

    result, seen, internal_seen = run(scenario())
    assert result.status == 302 and result.error is None
    assert classify(result.http_result) is ErrorClass.REDIRECT
    assert len(seen) == 1 and internal_seen == []


def test_endless_body_is_cut_at_the_cap(server_tls: ssl.SSLContext, settings: DispatchSettings) -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        while True:  # no length, no end: only the client's cap stops this
            writer.write(b"x" * 65536)
            await writer.drain()

    async def scenario() -> SendResult:
        async with raw_server(ALLOWED_IP, server_tls, endless) as port:
            return await send_once(settings, port)

    result = run(scenario())
    assert result.status == 200 and result.error is ErrorClass.BODY_TOO_LARGE
    assert f"exceeds {MAX_BODY} bytes" in result.error_detail
    assert result.response_sha256 == hashlib.sha256(b"x" * MAX_BODY).hexdigest()
    assert result.response_prefix == "x" * 256
    assert classify(result.http_result) is None  # the 200 still decides
    assert result.latency_ms < TOTAL_TIMEOUT_S * 1000


def test_large_declared_body_is_cut_too(server_tls: ssl.SSLContext, settings: DispatchSettings) -> None:
    async def scenario() -> SendResult:
        async with web_server(ALLOWED_IP, server_tls, ok("y" * (MAX_BODY * 50))) as (port, _):
            return await send_once(settings, port)

    result = run(scenario())
    assert (result.status, result.error) == (200, ErrorClass.BODY_TOO_LARGE)


def test_slow_drip_before_the_status_line_hits_the_total_timeout(
    server_tls: ssl.SSLContext, settings: DispatchSettings
) -> None:
    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request_head(reader)
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.1)  # always active, never finished

    async def scenario() -> SendResult:
        async with raw_server(ALLOWED_IP, server_tls, drip) as port:
            return await send_once(settings, port)

    result = run(scenario())
    assert result.status is None and result.error is ErrorClass.TIMEOUT
    assert TOTAL_TIMEOUT_S * 1000 * 0.9 <= result.latency_ms < TOTAL_TIMEOUT_S * 1000 * 2


def test_slow_drip_body_after_status_keeps_the_status(
    server_tls: ssl.SSLContext, settings: DispatchSettings
) -> None:
    async def drip_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(100):
            writer.write(b"z")
            await writer.drain()
            await asyncio.sleep(0.1)

    async def scenario() -> SendResult:
        async with raw_server(ALLOWED_IP, server_tls, drip_body) as port:
            return await send_once(settings, port)

    result = run(scenario())
    assert result.status == 200 and result.error is ErrorClass.TIMEOUT
    assert result.error_detail.startswith("after HTTP 200")
    assert result.latency_ms < TOTAL_TIMEOUT_S * 1000 * 2


def test_hang_past_the_timeout(server_tls: ssl.SSLContext, settings: DispatchSettings) -> None:
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request_head(reader)
        await asyncio.sleep(30)

    async def scenario() -> SendResult:
        async with raw_server(ALLOWED_IP, server_tls, hang) as port:
            return await send_once(settings, port)

    result = run(scenario())
    assert (result.status, result.error) == (None, ErrorClass.TIMEOUT)
    assert result.latency_ms < TOTAL_TIMEOUT_S * 1000 * 2


# --- broken connections ------------------------------------------------------------------------


def test_connection_reset(server_tls: ssl.SSLContext, settings: DispatchSettings) -> None:
    async def reset(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request_head(reader)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close => RST
        writer.transport.abort()

    async def scenario() -> SendResult:
        async with raw_server(ALLOWED_IP, server_tls, reset) as port:
            return await send_once(settings, port)

    result = run(scenario())
    assert (result.status, result.error) == (None, ErrorClass.RESET)


def test_closed_without_response(server_tls: ssl.SSLContext, settings: DispatchSettings) -> None:
    async def close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request_head(reader)

    async def scenario() -> SendResult:
        async with raw_server(ALLOWED_IP, server_tls, close) as port:
            return await send_once(settings, port)

    result = run(scenario())
    assert (result.status, result.error) == (None, ErrorClass.RESET)


def test_oversized_response_header_is_a_protocol_error(
    server_tls: ssl.SSLContext, settings: DispatchSettings
) -> None:
    async def huge_header(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 10_000 + b"\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(2)

    async def scenario() -> SendResult:
        async with raw_server(ALLOWED_IP, server_tls, huge_header) as port:
            return await send_once(settings, port)

    result = run(scenario())
    assert (result.status, result.error) == (None, ErrorClass.PROTOCOL)


def test_connect_refused(settings: DispatchSettings) -> None:
    with socket.socket() as probe:  # a port with nobody listening
        probe.bind((ALLOWED_IP, 0))
        port = probe.getsockname()[1]

    async def scenario() -> SendResult:
        async with sender(settings, policy_for([port], ALLOWED_IP), FakeDns({HOST: [[ALLOWED_IP]]})) as s:
            return await s.send(f"https://{HOST}:{port}/", BODY, HEADERS)

    result = run(scenario())
    assert (result.status, result.error) == (None, ErrorClass.CONNECT)


def test_dns_failure(settings: DispatchSettings) -> None:
    async def scenario() -> SendResult:
        async with sender(settings, policy_for([443]), FakeDns({})) as s:
            return await s.send("https://nowhere.example.com/", BODY, HEADERS)

    result = run(scenario())
    assert (result.status, result.error) == (None, ErrorClass.DNS)


# --- TLS ---------------------------------------------------------------------------------------


def test_untrusted_certificate_is_a_tls_error(settings: DispatchSettings) -> None:
    rogue = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert(HOST).configure_cert(rogue)

    async def scenario() -> tuple[SendResult, list[Seen]]:
        async with web_server(ALLOWED_IP, rogue, ok()) as (port, seen):
            return await send_once(settings, port), seen

    result, seen = run(scenario())
    assert (result.status, result.error) == (None, ErrorClass.TLS)
    assert seen == []


def test_certificate_for_another_name_is_a_tls_error(ca: trustme.CA, settings: DispatchSettings) -> None:
    """Pinning connects to the validated IP, but verification is still against the host name."""
    other = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("other.example.com").configure_cert(other)

    async def scenario() -> SendResult:
        async with web_server(ALLOWED_IP, other, ok()) as (port, _):
            return await send_once(settings, port)

    assert run(scenario()).error is ErrorClass.TLS


# --- refused before any connection ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://hooks.example.com/", "scheme: only https"),
        ("https://127.0.0.1/", "loopback: 127.0.0.1 is loopback"),
        ("https://0x7f.1/", "loopback: 127.0.0.1 is loopback"),
        ("https://[::ffff:127.0.0.1]/", "embeds IPv4 127.0.0.1"),
        ("https://user:pw@hooks.example.com/", "userinfo"),
        ("https://localhost/", "blocked_hostname"),
    ],
)
def test_refused_urls_never_connect(url: str, reason: str, settings: DispatchSettings) -> None:
    dns = FakeDns({HOST: [[BLOCKED_IP]]})

    async def scenario() -> SendResult:
        async with sender(settings, policy_for([443], ALLOWED_IP), dns) as s:
            return await s.send(url, BODY, HEADERS)

    result = run(scenario())
    assert (result.status, result.error) == (None, ErrorClass.EGRESS_REFUSED)
    assert reason in result.error_detail
    assert dns.lookups == []


def test_secrets_never_appear_in_error_details(settings: DispatchSettings) -> None:
    secret = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"

    async def scenario() -> SendResult:
        async with sender(settings, policy_for([443]), FakeDns({})) as s:
            return await s.send(f"https://{secret}.example.com/", BODY, HEADERS)

    result = run(scenario())
    assert result.error is ErrorClass.EGRESS_REFUSED
    assert "whsec_[REDACTED]" in result.error_detail and secret not in result.error_detail


# -- errors of ours before the request leaves ------------------------------------------------------

def _parse_target_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("a bug judging the URL")
    monkeypatch.setattr(http_sender_module, "parse_target", broken)


def _address_check_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> None:
        raise KeyError("a bug judging the addresses")
    monkeypatch.setattr(http_sender_module, "check_resolved", broken)


@pytest.mark.parametrize("fail", [_parse_target_fails, _address_check_fails, None],
                         ids=["the URL check raises", "the address check raises", "the session is closed"])
def test_an_error_of_ours_before_the_request_leaves_raises_not_sent(
        settings: DispatchSettings, monkeypatch: pytest.MonkeyPatch, fail: Any) -> None:
    # Such errors came back as a result with error class internal: recorded as a sent attempt,
    # spending the retry budget, though no byte had left.
    if fail is not None:
        fail(monkeypatch)

    async def scenario() -> None:
        dns = FakeDns({HOST: [[ALLOWED_IP]]})
        async with sender(settings, policy_for([9], ALLOWED_IP), dns) as s:
            if fail is None:
                await s.close()
            await s.send(f"https://{HOST}:9/", BODY, HEADERS)

    with pytest.raises(NotSent):
        asyncio.run(scenario())
