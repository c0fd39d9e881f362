"""The recording receiver itself: every behaviour, exact recordings, and the standalone control API."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import select
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from stack.certs import CertPaths, ensure_certs
from tests.support.behaviours import (
    Behaviour,
    from_json,
    gone,
    hang,
    huge_body,
    ok,
    parse_script,
    redirect,
    reset,
    retry_after,
    slow,
    status,
    when_header,
)
from tests.support.receiver import Receiver, ReceiverControl, Recording, verify_signature

REPO = Path(__file__).resolve().parents[3]
T = TypeVar("T")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertPaths:
    paths, _ = ensure_certs(tmp_path_factory.mktemp("certs"))
    return paths


@pytest.fixture(scope="module")
def client_ssl(certs: CertPaths) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs.ca_cert))


@pytest.fixture(scope="module")
def module_receiver(certs: CertPaths) -> Iterator[Receiver]:
    with Receiver() as rx:
        rx.start("127.0.0.1", 0, certs.server_chain, certs.server_key)
        yield rx


@pytest.fixture
def rx(module_receiver: Receiver) -> Iterator[Receiver]:
    yield module_receiver
    module_receiver.clear()
    module_receiver.clear_behaviours()


class Reply:
    def __init__(self, status: int, headers: Any, body: bytes, elapsed: float) -> None:
        self.status, self.headers, self.body, self.elapsed = status, headers, body, elapsed


class Client:
    """Sends test requests from one long-lived event loop.

    One loop for the whole module, not asyncio.run per request: a client that gives up on a TLS
    connection closes it in the background, and a loop closed at once would leak that socket.
    """

    def __init__(self, ssl_ctx: ssl.SSLContext, runner: asyncio.Runner) -> None:
        self.ssl_ctx, self.runner = ssl_ctx, runner

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    def post(
        self,
        url: str,
        body: bytes = b'{"hello":"world"}',
        headers: dict[str, str] | None = None,
        timeout: float = 5.0,
        ssl_ctx: ssl.SSLContext | None = None,
    ) -> Reply:
        async def go() -> Reply:
            start = time.monotonic()
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                session.post(
                    url, data=body, headers=headers, ssl=ssl_ctx or self.ssl_ctx, allow_redirects=False
                ) as resp,
            ):
                data = await resp.read()
                return Reply(resp.status, resp.headers, data, time.monotonic() - start)

        return self.run(go())


@pytest.fixture(scope="module")
def client(client_ssl: ssl.SSLContext) -> Iterator[Client]:
    with asyncio.Runner() as runner:
        yield Client(client_ssl, runner)


# ---- behaviours ---------------------------------------------------------------------------------


def test_default_is_200_and_the_recording_is_exact(rx: Receiver, client: Client) -> None:
    body = b'{"type":"invoice.paid","amount":42}\n\x00\xff'  # exact bytes, not text
    before_wall, before_mono = time.time(), time.monotonic()
    reply = client.post(
        f"{rx.base_url}/ep/plain?x=1",
        body,
        {"webhook-id": "msg_1", "X-Extra": "a", "Content-Type": "application/json"},
    )
    assert reply.status == 200

    (rec,) = rx.requests("/ep/plain")
    assert rec.path == "/ep/plain"
    assert rec.method == "POST"
    assert rec.body == body
    assert rec.query == "x=1"
    assert rec.headers["Webhook-Id"] == "msg_1"  # case-insensitive
    assert rec.headers["x-extra"] == "a"
    assert rec.headers["content-type"] == "application/json"
    assert rec.webhook_id == "msg_1"
    assert rec.behaviour == ok()
    assert before_wall <= rec.received_at <= time.time()
    assert before_mono <= rec.received_monotonic <= time.monotonic()
    assert rx.requests() == [rec]
    assert rx.counts() == {"/ep/plain": 1}


def test_script_500_then_200_last_one_sticks(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/flaky", "500 then 200")
    statuses = [client.post(f"{rx.base_url}/ep/flaky").status for _ in range(3)]
    assert statuses == [500, 200, 200]
    assert [r.behaviour for r in rx.requests("/ep/flaky")] == [status(500), status(200), status(200)]


def test_behaviours_are_per_path(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/down", status(503))
    assert client.post(f"{rx.base_url}/ep/down").status == 503
    assert client.post(f"{rx.base_url}/ep/up").status == 200


def test_when_header_fails_only_the_matching_requests(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/one_bad", when_header("webhook-object-version", "1", 500))
    assert client.post(f"{rx.base_url}/ep/one_bad", headers={"webhook-object-version": "1"}).status == 500
    assert client.post(f"{rx.base_url}/ep/one_bad", headers={"webhook-object-version": "2"}).status == 200
    assert client.post(f"{rx.base_url}/ep/one_bad").status == 200
    rx.set_behaviour("/ep/later", when_header("webhook-event-id", "evt_1", 503, retry_after=30))
    r = client.post(f"{rx.base_url}/ep/later", headers={"webhook-event-id": "evt_1"})
    assert (r.status, r.headers.get("Retry-After")) == (503, "30")


def test_status_with_body_and_headers(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/teapot", status(418, b"short and stout", {"X-Why": "tea"}))
    reply = client.post(f"{rx.base_url}/ep/teapot")
    assert (reply.status, reply.body, reply.headers["X-Why"]) == (418, b"short and stout", "tea")


def test_429_with_retry_after(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/busy", retry_after(429, 7))
    reply = client.post(f"{rx.base_url}/ep/busy")
    assert (reply.status, reply.headers["Retry-After"]) == (429, "7")


def test_410_gone(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/old", gone())
    assert client.post(f"{rx.base_url}/ep/old").status == 410


def test_301_is_not_followed(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/moved", redirect(301, "/ep/elsewhere"))
    reply = client.post(f"{rx.base_url}/ep/moved")
    assert (reply.status, reply.headers["Location"]) == (301, "/ep/elsewhere")
    assert rx.requests("/ep/elsewhere") == []


def test_hang_ends_with_the_client_timeout(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/hang", hang())
    start = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        client.post(f"{rx.base_url}/ep/hang", timeout=0.3)
    assert 0.25 <= time.monotonic() - start < 3
    (rec,) = rx.requests("/ep/hang")  # recorded even though never answered
    assert rec.behaviour == hang()


def test_reset_raises_a_connection_error(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/reset", reset())
    with pytest.raises(aiohttp.ClientConnectionError):
        client.post(f"{rx.base_url}/ep/reset")
    assert [r.behaviour for r in rx.requests("/ep/reset")] == [reset()]
    # The receiver is still fine afterwards.
    assert client.post(f"{rx.base_url}/ep/after-reset").status == 200


def test_slow_then_200(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/slow", slow(0.3))
    reply = client.post(f"{rx.base_url}/ep/slow")
    assert reply.status == 200
    assert reply.elapsed >= 0.3


def test_huge_body_is_streamed(rx: Receiver, client: Client) -> None:
    n = 5_000_001
    rx.set_behaviour("/ep/huge", huge_body(n))

    async def first_chunk_then_full() -> tuple[str | None, str | None, int, int]:
        async with aiohttp.ClientSession() as session:
            # A bounded client can stop after the first bytes and the receiver does not mind.
            async with session.post(f"{rx.base_url}/ep/huge", data=b"{}", ssl=client.ssl_ctx) as resp:
                first = len(await resp.content.read(1024))
            async with session.post(f"{rx.base_url}/ep/huge", data=b"{}", ssl=client.ssl_ctx) as resp:
                full = len(await resp.read())
                return resp.headers.get("Transfer-Encoding"), resp.headers.get("Content-Length"), first, full

    encoding, length, first, full = client.run(first_chunk_then_full())
    assert (encoding, length) == ("chunked", None)
    assert first == 1024
    assert full == n


def test_tls_needs_the_test_ca(rx: Receiver, client: Client) -> None:
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        client.post(f"{rx.base_url}/ep/untrusted", ssl_ctx=ssl.create_default_context())


# ---- recordings ---------------------------------------------------------------------------------


def test_wait_for_returns_recordings_or_times_out(rx: Receiver, client: Client) -> None:
    client.post(f"{rx.base_url}/ep/wait", b"1")
    client.post(f"{rx.base_url}/ep/wait", b"2")
    assert [r.body for r in rx.wait_for("/ep/wait", 2, timeout=2)] == [b"1", b"2"]
    with pytest.raises(TimeoutError, match="2 of 3"):
        rx.wait_for("/ep/wait", 3, timeout=0.1)


def test_clear_forgets_recordings_but_keeps_behaviours(rx: Receiver, client: Client) -> None:
    rx.set_behaviour("/ep/c", status(202))
    client.post(f"{rx.base_url}/ep/c")
    rx.clear()
    assert rx.requests() == [] and rx.counts() == {}
    assert client.post(f"{rx.base_url}/ep/c").status == 202


@pytest.mark.parametrize("mode", ["count", "none"])
def test_light_record_modes(mode: Any, certs: CertPaths, client: Client) -> None:
    with Receiver(record=mode) as light:
        base = light.start(certfile=certs.server_chain, keyfile=certs.server_key)
        for i in range(3):
            client.post(f"{base}/ep/bench", b"payload", {"webhook-id": f"msg_{i}"})
        assert light.counts() == {"/ep/bench": 3}
        recs = light.requests("/ep/bench")
        if mode == "none":
            assert recs == []
        else:
            assert [r.webhook_id for r in recs] == ["msg_0", "msg_1", "msg_2"]
            assert all(r.body == b"" and len(r.headers) == 0 for r in recs)
            assert recs[0].received_monotonic <= recs[1].received_monotonic <= recs[2].received_monotonic


def test_async_use_inside_a_running_loop(certs: CertPaths, client: Client) -> None:
    client.run(_serve_on_the_callers_loop(certs, client.ssl_ctx))


async def _serve_on_the_callers_loop(certs: CertPaths, client_ssl: ssl.SSLContext) -> None:
    async with Receiver() as rx:
        base = await rx.serve(certfile=certs.server_chain, keyfile=certs.server_key)
        rx.set_behaviour("/ep/async", "503 then ok")
        async with aiohttp.ClientSession() as session:
            for expected in (503, 200):
                async with session.post(f"{base}/ep/async", data=b"{}", ssl=client_ssl) as resp:
                    assert resp.status == expected
        assert len(await rx.wait_for_async("/ep/async", 2, timeout=2)) == 2


# ---- signatures ---------------------------------------------------------------------------------


def _sign(secret: str, msg_id: str, ts: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def test_verify_signature_with_the_official_verifier(rx: Receiver, client: Client) -> None:
    old, new, other = ("whsec_" + base64.b64encode(bytes([i]) * 24).decode() for i in (1, 2, 3))
    body, ts = b'{"event":"x"}', int(time.time())
    headers = {
        "webhook-id": "msg_sig",
        "webhook-timestamp": str(ts),
        "webhook-signature": f"{_sign(old, 'msg_sig', ts, body)} {_sign(new, 'msg_sig', ts, body)}",
    }
    client.post(f"{rx.base_url}/ep/signed", body, headers)
    (rec,) = rx.requests("/ep/signed")
    assert verify_signature(rec, [other, new, old]) == [new, old]
    assert verify_signature(rec, [other]) == []

    client.post(f"{rx.base_url}/ep/unsigned", body)
    assert verify_signature(rx.requests("/ep/unsigned")[0], [old]) == []


# ---- behaviour scripts and their JSON form ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ok", [ok()]),
        ("500 then 200", [status(500), status(200)]),
        ("retry_after 429 3 then gone", [retry_after(429, 3), gone()]),
        ("redirect 301 /new then hang then reset", [redirect(301, "/new"), hang(), reset()]),
        ("slow 0.5 then huge_body 1000", [slow(0.5), huge_body(1000)]),
    ],
)
def test_parse_script(text: str, expected: list[Behaviour]) -> None:
    assert parse_script(text) == expected


@pytest.mark.parametrize(
    "text", ["", "teapot", "redirect 301", "500 then", "then ok", "slow soon", "status 500 body", "gone 1"]
)
def test_parse_script_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError):
        parse_script(text)


@pytest.mark.parametrize(
    "behaviour",
    [
        ok(),
        status(500, b"\x00body", {"A": "b"}),
        retry_after(503, "soon"),
        gone(),
        redirect(308, "/x"),
        hang(),
        reset(),
        slow(0.25, 202),
        huge_body(10),
        when_header("webhook-object-id", "inv_1", 503, retry_after=30),
    ],
)
def test_behaviour_json_round_trip(behaviour: Behaviour) -> None:
    assert from_json(json.loads(json.dumps(behaviour.to_json()))) == behaviour


def test_recording_json_round_trip() -> None:
    rec = Recording(
        "/p",
        "POST",
        CIMultiDictProxy(CIMultiDict([("A", "1"), ("a", "2")])),
        b"\xff",
        "q=1",
        1.5,
        2.5,
        status(500),
        "msg",
    )
    back = Recording.from_json(json.loads(json.dumps(rec.to_json())))
    assert back == rec
    assert back.headers.getall("a") == ["1", "2"]


# ---- standalone process and its control API -----------------------------------------------------


@pytest.fixture
def standalone(certs: CertPaths, tmp_path: Path) -> Iterator[tuple[str, ReceiverControl]]:
    """The receiver as its own process on OS-chosen free ports, stopped by the pid we started."""
    args = [
        "--port",
        "0",
        "--control-port",
        "0",
        "--cert",
        str(certs.server_chain),
        "--key",
        str(certs.server_key),
    ]
    stderr_path = tmp_path / "receiver.stderr"
    with (
        stderr_path.open("w") as stderr,
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.receiver", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        ) as proc,
    ):
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 20)
            line = proc.stdout.readline() if ready else ""
            assert line.startswith("receiver url="), f"no ready line; stderr: {stderr_path.read_text()}"
            fields = dict(part.split("=", 1) for part in line.split()[1:])
            yield fields["url"], ReceiverControl(fields["control"])
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                returncode = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
    assert returncode == 0, stderr_path.read_text()


def test_standalone_control_api(standalone: tuple[str, ReceiverControl], client: Client) -> None:
    base, control = standalone
    assert base.startswith("https://127.0.0.1:") and control.control_url.startswith("http://127.0.0.1:")
    assert control.health()

    control.set_behaviour("/ep/remote", "500 then 200")
    control.set_behaviour("/ep/limited", retry_after(429, 2))
    assert [client.post(f"{base}/ep/remote", b"a").status for _ in range(2)] == [500, 200]
    reply = client.post(f"{base}/ep/limited", b"b", {"webhook-id": "msg_r"})
    assert (reply.status, reply.headers["Retry-After"]) == (429, "2")

    remote = control.wait_for("/ep/remote", 2, timeout=5)
    assert [(r.body, r.behaviour) for r in remote] == [(b"a", status(500)), (b"a", status(200))]
    (limited,) = control.requests("/ep/limited")
    assert (limited.body, limited.webhook_id, limited.headers["Webhook-Id"]) == (b"b", "msg_r", "msg_r")
    assert len(control.requests()) == 3
    assert control.counts() == {"/ep/remote": 2, "/ep/limited": 1}

    control.clear()
    assert control.requests() == [] and control.counts() == {}
    control.clear_behaviours("/ep/remote")
    assert client.post(f"{base}/ep/remote").status == 200


def test_standalone_control_api_plain_http(standalone: tuple[str, ReceiverControl], client: Client) -> None:
    """The raw API, as a shell script or another language would use it."""
    base, control = standalone
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def call(
        method: str, path: str, body: bytes | None = None, ctype: str = "text/plain"
    ) -> tuple[int, bytes]:
        req = urllib.request.Request(control.control_url + path, data=body, method=method)
        req.add_header("Content-Type", ctype)
        try:
            with opener.open(req, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    assert call("PUT", "/_control/behaviour/ep/text", b"503 then gone")[0] == 200
    assert (
        call("PUT", "/_control/behaviour/ep/json", b'{"kind": "status", "code": 201}', "application/json")[0]
        == 200
    )
    assert call("PUT", "/_control/behaviour/ep/bad", b"teapot")[0] == 400
    assert [client.post(f"{base}/ep/text").status for _ in range(3)] == [503, 410, 410]
    assert client.post(f"{base}/ep/json").status == 201

    code, data = call("GET", "/_control/requests?path=/ep/text")
    payload = json.loads(data)
    assert code == 200 and payload["record"] == "full"
    assert [r["behaviour"]["kind"] for r in payload["requests"]] == ["status", "gone", "gone"]
    assert call("DELETE", "/_control/requests")[0] == 204
    assert json.loads(call("GET", "/_control/requests")[1])["requests"] == []
    assert call("DELETE", "/_control/behaviour")[0] == 204
    assert client.post(f"{base}/ep/text").status == 200
