"""`webhookctl listen`: a local HTTPS receiver that shows every delivery the stack makes to it.

    webhookctl listen [--endpoint ID] [--event-type TYPE] [--status CODE] [--port N] [--json] [--keep]

It serves https://127.0.0.1:PORT/webhookctl-listen with the stack's development certificate
(.run/certs, issued by the dev CA the delivery job trusts under `make run LOCAL_RECEIVERS=1`),
creates an endpoint of the API key's tenant pointing there (or, with --endpoint, points an existing
one there), sends it a ping, and prints one line per request: event type, delivery id, attempt,
whether the Standard Webhooks signature verified (with the official `standardwebhooks` library)
and a body excerpt; --json prints everything. It answers --status (default 200), so
`--status 503` shows retries and the breaker. On Ctrl-C it deletes the endpoint it created
(--keep keeps it).

Only a stack that allows loopback egress can deliver here: when the control plane refuses the URL,
or the ping comes back refused, the listener says which switch is missing. Production never has it.

The pure parts (verification, a line, the JSON record, the diagnoses) are functions at the top;
the server and the API calls below them only wire those to aiohttp and gRPC.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import ssl
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.field_mask_pb2 import FieldMask
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from control_plane.rpc.api import pb
from core.settings import load_settings
from stack.certs import CertPaths

PATH = "/webhookctl-listen"
DEFAULT_PORT = 8443  # the port stack/local_receivers.sh allows
EXCERPT_CHARS = 60
PING_WAIT_S = 20.0
SWITCH_HINT = ("On the local dev stack: `make down`, then `make run LOCAL_RECEIVERS=1` (stack/local_receivers.sh); "
               "production mode never allows it.")

# -- pure parts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verification:
    ok: bool
    reason: str  # why not, from the library; "" when verified


def verify(secret: str, headers: Mapping[str, str], body: bytes) -> Verification:
    """The official Standard Webhooks check (v1 signatures, 5-minute timestamp tolerance)."""
    try:
        Webhook(secret).verify(body, {k.lower(): v for k, v in headers.items()}, json_parse=False)
    except WebhookVerificationError as exc:
        return Verification(False, str(exc))
    except ValueError as exc:  # a malformed signature header, a body that is not UTF-8
        return Verification(False, f"malformed request: {type(exc).__name__}")
    return Verification(True, "")


@dataclass(frozen=True)
class Received:
    """One request as it arrived, and what the listener made of it and answered."""

    at: datetime
    method: str
    path: str
    headers: Mapping[str, str]  # lower-case names
    body: bytes
    verification: Verification
    status: int

    @property
    def delivery_id(self) -> str:
        return self.headers.get("webhook-id", "-")

    @property
    def event_type(self) -> str:
        return self.headers.get("webhook-event-type", "-")

    @property
    def attempt(self) -> str:
        return self.headers.get("webhook-attempt", "?")


def excerpt(body: bytes, limit: int = EXCERPT_CHARS) -> str:
    text = " ".join(body.decode("utf-8", errors="replace").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def line(r: Received) -> str:
    verified = "yes" if r.verification.ok else f"NO ({r.verification.reason})"
    return (f"{r.at.strftime('%H:%M:%S')}  {r.event_type}  {r.delivery_id}  attempt {r.attempt}  "
            f"verified {verified}  -> {r.status}  {excerpt(r.body)}")


def record(r: Received) -> dict[str, Any]:
    """Everything about one request (--json): the body as text when it is UTF-8, else base64."""
    try:
        body: dict[str, str] = {"body": r.body.decode("utf-8")}
    except UnicodeDecodeError:
        body = {"body_base64": base64.b64encode(r.body).decode("ascii")}
    return {
        "received_at": r.at.isoformat(), "method": r.method, "path": r.path,
        "delivery_id": r.delivery_id, "event_type": r.event_type, "attempt": r.attempt,
        "verified": r.verification.ok, "verification_error": r.verification.reason or None,
        "answered": r.status, "headers": dict(r.headers), **body,
    }


def refusal_hint(details: str, url: str) -> str | None:
    """What to tell the user when the control plane refuses the listener's URL, or None when the
    refusal is not about the stack's egress policy."""
    if "url refused (loopback)" in details or "url refused (port)" in details:
        return (f"this stack refuses endpoints at {url}: {details}\n"
                f"Its egress policy allows public HTTPS only, so it cannot deliver to this listener. {SWITCH_HINT}")
    return None


def ping_diagnosis(attempts: list[tuple[str, int, str]], waited_s: float) -> str:
    """Why the ping did not arrive, from its delivery's attempts (outcome, http status, error class)."""
    if not attempts:
        return (f"no attempt of the ping after {waited_s:.0f} s: is the delivery job running "
                "(`make status`, Flink dashboard http://127.0.0.1:8081)?")
    outcome, http, error = attempts[-1]
    if error == "egress_refused":
        return f"the delivery job refuses 127.0.0.1 (egress policy): it runs without the allowance. {SWITCH_HINT}"
    if error == "tls":
        return ("the delivery job does not trust the listener's certificate (dispatch.ca_bundle is not "
                f"the stack's dev CA, .run/certs/ca.pem). {SWITCH_HINT}")
    return f"the ping's last attempt: {outcome} ({http or error or 'no status'}); still listening"


# -- the server and the API calls -------------------------------------------------------------


class Listener:
    """The aiohttp handler: verify, print, answer."""

    def __init__(self, status: int, as_json: bool) -> None:
        self.status = status
        self.as_json = as_json
        self.secret = ""  # set once the endpoint is known
        self._seen: dict[str, asyncio.Event] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        verification = (verify(self.secret, headers, body) if self.secret
                        else Verification(False, "no signing secret known"))
        r = Received(datetime.now(UTC).astimezone(), request.method, request.path_qs, headers, body,
                     verification, self.status)
        print(json.dumps(record(r)) if self.as_json else line(r), flush=True)
        self._event(r.delivery_id).set()
        return web.Response(status=self.status, text="ok\n" if self.status < 300 else "listener says no\n")

    def _event(self, delivery_id: str) -> asyncio.Event:
        return self._seen.setdefault(delivery_id, asyncio.Event())

    async def arrived(self, delivery_id: str, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._event(delivery_id).wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class ListenError(Exception):
    """A reason the listener cannot run, for people."""


@dataclass(frozen=True)
class Target:
    endpoint_id: str
    secret: str
    created: bool


def _note(text: str) -> None:
    print(f"webhookctl listen: {text}", file=sys.stderr, flush=True)


def _create(tenant: Any, url: str, event_types: list[str]) -> Target:
    try:
        r = tenant.CreateEndpoint(pb.CreateEndpointRequest(
            url=url, event_types=event_types, description="webhookctl listen",
            metadata={"created_by": "webhookctl listen"}))
    except grpc.RpcError as err:
        hint = refusal_hint(err.details() or "", url)  # type: ignore[attr-defined]
        if hint and err.code() == grpc.StatusCode.INVALID_ARGUMENT:  # type: ignore[attr-defined]
            raise ListenError(hint) from None
        raise
    return Target(r.endpoint.endpoint_id, r.signing_secret, created=True)


def _reuse(tenant: Any, endpoint_id: str, url: str) -> Target:
    secret = os.environ.get("WEBHOOKCTL_SIGNING_SECRET", "")
    e = tenant.GetEndpoint(pb.GetEndpointRequest(endpoint_id=endpoint_id))
    if not secret:
        raise ListenError(
            f"endpoint {endpoint_id}'s signing secret was shown once, at creation: set WEBHOOKCTL_SIGNING_SECRET "
            f"to it (or `webhookctl endpoints rotate-secret {endpoint_id}` prints a new one)")
    if e.signing_keys and all(k.public_key for k in e.signing_keys):
        raise ListenError(f"endpoint {endpoint_id} signs with ed25519 (v1a) only; the official Standard Webhooks "
                          "library verifies v1 (HMAC) signatures")
    if e.url != url:
        try:
            tenant.UpdateEndpoint(pb.UpdateEndpointRequest(
                endpoint_id=endpoint_id, endpoint=pb.Endpoint(url=url), update_mask=FieldMask(paths=["url"])))
        except grpc.RpcError as err:
            hint = refusal_hint(err.details() or "", url)  # type: ignore[attr-defined]
            if hint:
                raise ListenError(hint) from None
            raise
        _note(f"endpoint {endpoint_id} now points here (was {e.url}); "
              f"`webhookctl endpoints update {endpoint_id} --url {e.url}` puts it back")
    return Target(endpoint_id, secret, created=False)


async def _check_ping(listener: Listener, tenant: Any, endpoint_id: str) -> None:
    ping = await asyncio.to_thread(tenant.SendTestEvent, pb.GetEndpointRequest(endpoint_id=endpoint_id))
    if await listener.arrived(ping.delivery_id, PING_WAIT_S):
        return
    try:
        d = await asyncio.to_thread(tenant.GetDelivery, pb.GetDeliveryRequest(delivery_id=ping.delivery_id))
        attempts = [(a.outcome, a.http_status, a.error_class) for a in d.attempts]
    except grpc.RpcError:  # no record yet: the job has not taken the ping
        attempts = []
    _note(ping_diagnosis(attempts, PING_WAIT_S))


async def serve(args: argparse.Namespace, tenant: Any, certs: CertPaths) -> int:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(str(certs.server_chain), str(certs.server_key))
    listener = Listener(args.status, args.json)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", listener.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    url = f"https://127.0.0.1:{args.port}{PATH}"
    target: Target | None = None
    try:
        try:
            await web.TCPSite(runner, "127.0.0.1", args.port, ssl_context=tls).start()
        except OSError as exc:
            raise ListenError(f"cannot listen on 127.0.0.1:{args.port}: {exc.strerror} (--port)") from None
        if args.endpoint:
            target = await asyncio.to_thread(_reuse, tenant, args.endpoint, url)
        else:
            target = await asyncio.to_thread(_create, tenant, url, args.event_type or ["*"])
        listener.secret = target.secret
        _note(f"listening on {url} for endpoint {target.endpoint_id}; answering {args.status}; Ctrl-C stops"
              + ("" if not target.created or args.keep else " and deletes the endpoint"))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        checking = asyncio.create_task(_check_ping(listener, tenant, target.endpoint_id)) if args.ping else None
        await stop.wait()
        if checking is not None:
            checking.cancel()
    except ListenError as exc:
        _note(str(exc))
        return 1
    finally:
        await runner.cleanup()
        if target is not None and target.created and not args.keep:
            try:
                await asyncio.to_thread(tenant.DeleteEndpoint, pb.GetEndpointRequest(endpoint_id=target.endpoint_id))
                _note(f"deleted endpoint {target.endpoint_id}")
            except grpc.RpcError as err:
                _note(f"could not delete endpoint {target.endpoint_id}: {err.details()}")  # type: ignore[attr-defined]
    return 0


def run(args: argparse.Namespace, tenant: Any) -> int:
    certs = CertPaths.under(load_settings().run_dir / "certs")
    if not (certs.server_chain.exists() and certs.server_key.exists()):
        _note(f"no development certificate in {certs.server_chain.parent}: `make run` creates it")
        return 2
    return asyncio.run(serve(args, tenant, certs))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", metavar="ENDPOINT_ID",
                   help="point this existing endpoint here instead of creating one (its secret in "
                   "WEBHOOKCTL_SIGNING_SECRET); it is not deleted on exit")
    p.add_argument("--event-type", action="append", help="repeat; what a created endpoint subscribes to (default *)")
    p.add_argument("--status", type=int, default=200, help="HTTP status to answer (503: watch retries and the breaker)")
    p.add_argument("--port", type=int, default=int(os.environ.get("WEBHOOKCTL_LISTEN_PORT", DEFAULT_PORT)),
                   help=f"port on 127.0.0.1 (default {DEFAULT_PORT}, the one LOCAL_RECEIVERS allows; "
                   "or WEBHOOKCTL_LISTEN_PORT)")
    p.add_argument("--keep", action="store_true", help="keep the created endpoint on exit")
    p.add_argument("--no-ping", dest="ping", action="store_false",
                   help="skip the ping that checks the stack can reach the listener")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="one JSON object per request: headers, body, verification (same as the global --json)")
