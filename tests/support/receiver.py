"""A recording HTTPS webhook receiver for tests and benchmarks. Binds 127.0.0.1 only.

Every request to any path is recorded and answered by that path's behaviour (default: 200).

In-process (its own event loop in a background thread):

    with Receiver() as rx:                                  # or rx = Receiver(); rx.start(...)
        base = rx.start(certfile="server.pem", keyfile="server.key")   # -> "https://127.0.0.1:PORT"
        rx.set_behaviour("/ep/a", "500 then 200")           # or status(500), ok()
        ...                                                 # dispatcher POSTs to f"{base}/ep/a"
        first, second = rx.wait_for("/ep/a", 2, timeout=10)
        assert verify_signature(second, ["whsec_..."]) == ["whsec_..."]

Standalone (for the benchmark and for tests whose sender runs in another process, e.g. Flink):

    python -m tests.support.receiver --port 8443 --cert server.pem --key server.key \
        --control-port 8444 [--record full|count|none]

It prints one line `receiver url=https://127.0.0.1:PORT control=http://127.0.0.1:PORT` once it
listens (ports chosen by the OS when given 0) and stops cleanly on SIGTERM/SIGINT. The plain-HTTP
control API (steer it from Python with `ReceiverControl`, same method names as `Receiver`):

    PUT    /_control/behaviour/{path}   body: a script ("500 then 200") or JSON (one behaviour
                                        `{"kind": "status", "code": 500}`, a list of them, or
                                        `{"script": "..."}`)
    DELETE /_control/behaviour/{path}   back to the default (200); DELETE /_control/behaviour: all
    GET    /_control/requests?path=P    recordings as JSON (bodies base64); path optional
    DELETE /_control/requests           forget recordings and counts
    GET    /_control/counts             {path: requests seen}, kept in every record mode
    GET    /_control/health             "ok"

Record modes: `full` keeps method, headers, exact body, times and behaviour; `count` keeps only
arrival times, the behaviour and the `webhook-id` header (for benchmarks); `none` keeps counts.
Nothing is logged per request.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import signal
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from tests.support.behaviours import BODY, Behaviour, Ok, from_json, parse_script

RecordMode = Literal["none", "count", "full"]
RECORD_MODES: tuple[RecordMode, ...] = ("none", "count", "full")
HOST = "127.0.0.1"
_DEFAULT = Ok()
_NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())


@dataclass(frozen=True, slots=True)
class Recording:
    path: str
    method: str
    headers: CIMultiDictProxy[str]  # case-insensitive, duplicates kept; empty in count mode
    body: bytes  # exactly the bytes received; b"" in count mode
    query: str
    received_at: float  # time.time()
    received_monotonic: float  # time.monotonic(), for intervals between attempts
    behaviour: Behaviour
    webhook_id: str | None

    def json(self) -> Any:
        return json.loads(self.body)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "method": self.method,
            "headers": list(self.headers.items()),
            "body_b64": base64.b64encode(self.body).decode(),
            "query": self.query,
            "received_at": self.received_at,
            "received_monotonic": self.received_monotonic,
            "behaviour": self.behaviour.to_json(),
            "webhook_id": self.webhook_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recording:
        return cls(
            path=data["path"],
            method=data["method"],
            headers=CIMultiDictProxy(CIMultiDict([(k, v) for k, v in data["headers"]])),
            body=base64.b64decode(data["body_b64"]),
            query=data["query"],
            received_at=data["received_at"],
            received_monotonic=data["received_monotonic"],
            behaviour=from_json(data["behaviour"]),
            webhook_id=data["webhook_id"],
        )


def verify_signature(recording: Recording, secrets: Iterable[str]) -> list[str]:
    """The secrets (in the order given) whose Standard Webhooks signature the request carries.

    Uses the official `standardwebhooks` verifier, so its 5-minute timestamp tolerance applies.
    Needs a recording made in `full` mode. An empty list means no secret verified.
    """
    if isinstance(secrets, str):
        secrets = [secrets]
    headers = {k.lower(): v for k, v in recording.headers.items()}
    verified: list[str] = []
    for secret in secrets:
        try:
            Webhook(secret).verify(recording.body, headers, json_parse=False)
        except (WebhookVerificationError, ValueError):  # ValueError: malformed header or body
            continue
        verified.append(secret)
    return verified


def _as_script(behaviours: tuple[Behaviour | str, ...]) -> list[Behaviour]:
    script: list[Behaviour] = []
    for b in behaviours:
        script.extend(parse_script(b) if isinstance(b, str) else [b])
    if not script:
        raise ValueError("set_behaviour needs at least one behaviour")
    return script


def _normalise(path: str) -> str:
    return path if path.startswith("/") else "/" + path


class Receiver:
    """The receiver: behaviour plans, recordings, and the servers that serve them.

    State methods are safe to call from any thread while the server runs in its own.
    """

    def __init__(self, record: RecordMode = "full") -> None:
        if record not in RECORD_MODES:
            raise ValueError(f"record must be one of {RECORD_MODES}, not {record!r}")
        self.record = record
        self.base_url: str | None = None
        self.control_url: str | None = None
        # path -> remaining script; the last entry sticks. Only the server loop pops, and
        # set_behaviour swaps in a whole new list, so the hot path needs no lock.
        self._plans: dict[str, list[Behaviour]] = {}
        self._lock = threading.Lock()
        self._all: list[Recording] = []
        self._by_path: dict[str, list[Recording]] = {}
        self._counts: dict[str, int] = {}
        self._runners: list[web.BaseRunner] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- behaviours -------------------------------------------------------------------------

    def set_behaviour(self, path: str, *behaviours: Behaviour | str) -> None:
        """Answer requests to `path` with this script: one behaviour per request, the last sticks."""
        self._plans[_normalise(path)] = _as_script(behaviours)

    def clear_behaviours(self, path: str | None = None) -> None:
        if path is None:
            self._plans = {}
        else:
            self._plans.pop(_normalise(path), None)

    def _next_behaviour(self, path: str) -> Behaviour:
        plan = self._plans.get(path)
        if plan is None:
            return _DEFAULT
        return plan.pop(0) if len(plan) > 1 else plan[0]

    # ---- recordings -------------------------------------------------------------------------

    def requests(self, path: str | None = None) -> list[Recording]:
        """Recordings in arrival order, for one path or all."""
        with self._lock:
            if path is None:
                return list(self._all)
            return list(self._by_path.get(_normalise(path), ()))

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def clear(self) -> None:
        """Forget recordings and counts (behaviours stay)."""
        with self._lock:
            self._all = []
            self._by_path = {}
            self._counts = {}

    def _seen(self, path: str) -> int:
        with self._lock:
            return self._counts.get(path, 0)

    def wait_for(self, path: str, count: int, timeout: float = 10.0) -> list[Recording]:
        """Block until `path` has had at least `count` requests; return its recordings."""
        path = _normalise(path)
        deadline = time.monotonic() + timeout
        while self._seen(path) < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{path}: {self._seen(path)} of {count} requests after {timeout}s")
            time.sleep(0.005)
        return self.requests(path)

    async def wait_for_async(self, path: str, count: int, timeout: float = 10.0) -> list[Recording]:
        """`wait_for` for coroutines, which must not block their loop."""
        path = _normalise(path)
        deadline = time.monotonic() + timeout
        while self._seen(path) < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{path}: {self._seen(path)} of {count} requests after {timeout}s")
            await asyncio.sleep(0.005)
        return self.requests(path)

    # ---- the webhook endpoint ---------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        # content.read() rather than request.read(): no 1 MiB client_max_size cap on bodies.
        body = await request.content.read()
        request[BODY] = body  # the stream is consumed: behaviours that look at the body read it here
        received_at, received_monotonic = time.time(), time.monotonic()
        path = request.path
        behaviour = self._next_behaviour(path)
        rec: Recording | None = None
        if self.record == "full":
            rec = Recording(
                path,
                request.method,
                request.headers,
                body,
                request.query_string,
                received_at,
                received_monotonic,
                behaviour,
                request.headers.get("webhook-id"),
            )
        elif self.record == "count":
            rec = Recording(
                path,
                request.method,
                _NO_HEADERS,
                b"",
                "",
                received_at,
                received_monotonic,
                behaviour,
                request.headers.get("webhook-id"),
            )
        with self._lock:
            self._counts[path] = self._counts.get(path, 0) + 1
            if rec is not None:
                self._all.append(rec)
                self._by_path.setdefault(path, []).append(rec)
        return await behaviour.respond(request)

    # ---- the control API ----------------------------------------------------------------------

    def _control_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/_control/health", self._c_health)
        app.router.add_put("/_control/behaviour/{path:.+}", self._c_set_behaviour)
        app.router.add_delete("/_control/behaviour/{path:.+}", self._c_clear_behaviour)
        app.router.add_delete("/_control/behaviour", self._c_clear_behaviour)
        app.router.add_get("/_control/requests", self._c_requests)
        app.router.add_delete("/_control/requests", self._c_clear)
        app.router.add_get("/_control/counts", self._c_counts)
        return app

    async def _c_health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _c_set_behaviour(self, request: web.Request) -> web.Response:
        text = await request.text()
        try:
            if request.content_type == "application/json":
                data = json.loads(text)
                if isinstance(data, dict) and "script" in data:
                    script = parse_script(data["script"])
                elif isinstance(data, dict):
                    script = [from_json(data)]
                else:
                    script = [from_json(d) for d in data]
            else:
                script = parse_script(text)
            self.set_behaviour(request.match_info["path"], *script)
        except (ValueError, TypeError, KeyError) as e:
            return web.Response(status=400, text=f"bad behaviour: {e}\n")
        return web.json_response([b.to_json() for b in script])

    async def _c_clear_behaviour(self, request: web.Request) -> web.Response:
        self.clear_behaviours(request.match_info.get("path"))
        return web.Response(status=204)

    async def _c_requests(self, request: web.Request) -> web.Response:
        recordings = self.requests(request.query.get("path"))
        return web.json_response({"record": self.record, "requests": [r.to_json() for r in recordings]})

    async def _c_clear(self, request: web.Request) -> web.Response:
        self.clear()
        return web.Response(status=204)

    async def _c_counts(self, request: web.Request) -> web.Response:
        return web.json_response(self.counts())

    # ---- lifecycle on the current loop (used by the thread below and by the CLI) --------------

    async def serve(
        self,
        host: str = HOST,
        port: int = 0,
        certfile: str | Path | None = None,
        keyfile: str | Path | None = None,
        control_port: int | None = None,
    ) -> str:
        """Start listening on the running loop; return the base URL. TLS when certfile is given."""
        if self._runners:
            raise RuntimeError("receiver already started")
        ssl_ctx = None
        if certfile is not None:
            ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_ctx.load_cert_chain(str(certfile), None if keyfile is None else str(keyfile))
        # handler_cancellation: a client that gives up cancels its `hang`/`slow` handler, so
        # abandoned requests do not pile up; access_log=None: no per-request logging.
        server = web.Server(self._handle, handler_cancellation=True, access_log=None)
        runner: web.BaseRunner = web.ServerRunner(server, shutdown_timeout=0.5)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, host, port, ssl_context=ssl_ctx, backlog=1024).start()
        bound = cast(tuple[str, int], runner.addresses[0])[1]
        self.base_url = f"{'https' if ssl_ctx else 'http'}://{host}:{bound}"
        if control_port is not None:
            control = web.AppRunner(self._control_app(), access_log=None, shutdown_timeout=0.5)
            await control.setup()
            self._runners.append(control)
            await web.TCPSite(control, host, control_port).start()
            self.control_url = f"http://{host}:{cast(tuple[str, int], control.addresses[0])[1]}"
        return self.base_url

    async def shutdown(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    # ---- lifecycle in a background thread (for synchronous tests) -----------------------------

    def start(
        self,
        host: str = HOST,
        port: int = 0,
        certfile: str | Path | None = None,
        keyfile: str | Path | None = None,
        *,
        control_port: int | None = None,
    ) -> str:
        """Run the receiver on its own loop in a daemon thread; return its base URL."""
        if self._thread is not None:
            raise RuntimeError("receiver already started")
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="recording-receiver", daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            future = asyncio.run_coroutine_threadsafe(
                self.serve(host, port, certfile, keyfile, control_port), loop
            )
            return future.result(timeout=10)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.shutdown(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()
            self._loop = self._thread = None

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Receiver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()


class ReceiverControl:
    """Steer a receiver in another process through its control API (same methods as Receiver)."""

    def __init__(self, control_url: str, timeout: float = 10.0) -> None:
        self.control_url = control_url.rstrip("/")
        self.timeout = timeout
        # No proxies: the control API is on 127.0.0.1 and must be reached directly.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _call(self, method: str, path: str, body: bytes | None = None, content_type: str = "") -> bytes:
        req = urllib.request.Request(self.control_url + path, data=body, method=method)
        if content_type:
            req.add_header("Content-Type", content_type)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return cast(bytes, resp.read())
        except urllib.error.HTTPError as e:
            raise ValueError(f"{method} {path}: {e.code} {e.read().decode(errors='replace')}") from None

    def health(self) -> bool:
        try:
            return self._call("GET", "/_control/health") == b"ok"
        except OSError:
            return False

    def set_behaviour(self, path: str, *behaviours: Behaviour | str) -> None:
        body = json.dumps([b.to_json() for b in _as_script(behaviours)]).encode()
        self._call("PUT", "/_control/behaviour" + _quote(path), body, "application/json")

    def clear_behaviours(self, path: str | None = None) -> None:
        self._call("DELETE", "/_control/behaviour" + ("" if path is None else _quote(path)))

    def requests(self, path: str | None = None) -> list[Recording]:
        query = "" if path is None else "?" + urllib.parse.urlencode({"path": _normalise(path)})
        data = json.loads(self._call("GET", "/_control/requests" + query))
        return [Recording.from_json(r) for r in data["requests"]]

    def counts(self) -> dict[str, int]:
        return cast(dict[str, int], json.loads(self._call("GET", "/_control/counts")))

    def clear(self) -> None:
        self._call("DELETE", "/_control/requests")

    def wait_for(self, path: str, count: int, timeout: float = 10.0) -> list[Recording]:
        path = _normalise(path)
        deadline = time.monotonic() + timeout
        while (seen := self.counts().get(path, 0)) < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{path}: {seen} of {count} requests after {timeout}s")
            time.sleep(0.02)
        return self.requests(path)


def _quote(path: str) -> str:
    return urllib.parse.quote(_normalise(path))


async def _run_standalone(args: argparse.Namespace) -> None:
    receiver = Receiver(record=args.record)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await receiver.serve(HOST, args.port, args.cert, args.key, args.control_port)
    print(f"receiver url={receiver.base_url} control={receiver.control_url or '-'}", flush=True)
    try:
        await stop.wait()
    finally:
        await receiver.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.receiver", description="Recording webhook receiver on 127.0.0.1."
    )
    parser.add_argument("--port", type=int, required=True, help="webhook port (0: let the OS choose)")
    parser.add_argument("--cert", help="server certificate chain (PEM); plain HTTP without it")
    parser.add_argument("--key", help="server private key (PEM)")
    parser.add_argument("--control-port", type=int, help="plain-HTTP control API port (0: OS chooses)")
    parser.add_argument("--record", choices=RECORD_MODES, default="full")
    args = parser.parse_args(argv)
    if (args.cert is None) != (args.key is None):
        parser.error("--cert and --key go together")
    asyncio.run(_run_standalone(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
