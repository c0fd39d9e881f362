"""The control plane's HTTP+JSON API: the gRPC services' methods at the routes their protos name.

One generic adapter, no second service: the routes come from the protos' ``google.api.http``
options (control_plane.httpapi.transcoding), and a request is dispatched to the very method handler
the gRPC server registered (``MethodRegistry`` records them as ``server.build`` adds each
servicer), called with a context that carries the HTTP request's ``Authorization: Bearer <api
key>`` as the gRPC metadata. Tenancy, validation, audit and publication are therefore exactly the
gRPC API's.

Beside the transcoding, HTTP has its own conventions, kept here:

* errors are ``application/problem+json`` (control_plane.httpapi.problems);
* ``Idempotency-Key`` on POST and PATCH (control_plane.httpapi.idempotency), also set as the
  RPC's ``request_id`` when it has one;
* an endpoint's ``ETag`` is its ``config_version``; a PATCH with ``If-Match`` applies only to that
  version, checked in the same conditional write (412 stale-version otherwise);
* ``GET /v1/openapi.json`` is the OpenAPI 3.1 document of these routes (control_plane.httpapi.openapi_doc).

The server runs on its own thread and event loop like the console (the same aiohttp stack);
servicers block (Cassandra, Kafka), so each call runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
from aiohttp import web
from google.protobuf import message_factory
from google.protobuf.message import Message

from control_plane import metrics, traced_calls
from control_plane.httpapi import openapi_doc
from control_plane.httpapi import problems as http_problems
from control_plane.httpapi import transcoding as http_transcoding
from control_plane.httpapi.idempotency import (
    IDEMPOTENCY_KEY_FORM,
    IdempotencyStore,
    InProgress,
    Kept,
    Replay,
    Reused,
    Run,
    fingerprint,
    scope_of,
)
from control_plane.httpapi.problems import PROBLEM_JSON, Problem, problem
from control_plane.httpapi.transcoding import BadRequest, Route
from control_plane.rpc.servicer import ERROR_CLASS_KEY
from core.spans import Tracer

log = logging.getLogger(__name__)

IDEMPOTENCY_KEY = "Idempotency-Key"
_ENDPOINT = "webhooks.v1.Endpoint"
_KEPT_HEADERS = ("ETag", "Location")


# -- the handlers the gRPC server registered ---------------------------------------------------


class MethodRegistry:
    """Stands in for the grpc.Server while services are added: passes everything on and records
    each service's method handlers, which the HTTP API calls."""

    def __init__(self, server: grpc.Server) -> None:
        self._server = server
        self.handlers: dict[tuple[str, str], grpc.RpcMethodHandler] = {}

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for method, handler in handlers.items():
            self.handlers[(service, method)] = handler
        self._server.add_registered_method_handlers(service, handlers)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    def as_server(self) -> grpc.Server:
        return cast(grpc.Server, self)


class RpcAbort(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, error_class: str | None) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.error_class = error_class


class HttpContext:
    """The grpc.ServicerContext a servicer sees when called over HTTP: the part of it servicers use
    (the credential's metadata, the peer, the error's class and the abort)."""

    def __init__(self, authorization: str | None, peer: str) -> None:
        self._metadata = (("authorization", authorization),) if authorization is not None else ()
        self._peer = peer
        self._error_class: str | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def set_trailing_metadata(self, metadata: Iterable[tuple[str, str]]) -> None:
        for key, value in metadata:
            if key == ERROR_CLASS_KEY:
                self._error_class = value

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RpcAbort(code, details, self._error_class)


# -- the API -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


def _problem_answer(p: Problem, *headers: tuple[str, str]) -> Answer:
    return Answer(p.status, p.body(), PROBLEM_JSON, headers)


@dataclass
class HttpApi:
    """Routes -> registered handlers, with HTTP's conventions around each call."""

    table: Sequence[Route]
    handlers: dict[tuple[str, str], grpc.RpcMethodHandler]
    idempotency: IdempotencyStore
    document: dict[str, Any] = field(default_factory=dict)
    # A span per request when tracing is on (control_plane.traced_calls); None: off.
    tracer: Tracer | None = None

    def __post_init__(self) -> None:
        missing = [f"{r.service}/{r.name}" for r in self.table if (r.service, r.name) not in self.handlers]
        if missing:
            raise ValueError(f"routes without a registered handler: {', '.join(missing)}")
        self._document_bytes = json.dumps(self.document, indent=1).encode()

    # Blocking: runs on a worker thread.
    def handle(self, verb: str, path: str, query: Sequence[tuple[str, str]], headers: dict[str, str],
               body: bytes, peer: str = "") -> Answer:
        start, start_ns = time.perf_counter(), time.time_ns()
        answer = self._answer(verb, path, query, headers, body, peer)
        route = http_transcoding.match(self.table, verb, path)[0]
        metrics.http_request(route.name if route is not None else "-", answer.status, time.perf_counter() - start)
        if self.tracer is not None:
            traced_calls.http_request_span(self.tracer, headers.get("traceparent"), verb,
                                           route.template if route is not None else None, answer.status, start_ns)
        return answer

    def _answer(self, verb: str, path: str, query: Sequence[tuple[str, str]], headers: dict[str, str],
                body: bytes, peer: str) -> Answer:
        if verb == "GET" and path == openapi_doc.DOCUMENT_PATH:
            return Answer(200, self._document_bytes)
        if verb == "GET" and path.startswith(http_problems.TYPE_PREFIX):
            described = http_problems.type_document(path[len(http_problems.TYPE_PREFIX):])
            if described is not None:
                return Answer(200, json.dumps(described).encode())
        route, params, allowed = http_transcoding.match(self.table, verb, path)
        if route is None:
            if allowed:
                return _problem_answer(problem("method-not-allowed", f"{path} takes {', '.join(allowed)}", path),
                                       ("Allow", ", ".join(allowed)))
            return _problem_answer(problem("no-route", f"no route {path}; the routes: {openapi_doc.DOCUMENT_PATH}",
                                           path))
        key = headers.get(IDEMPOTENCY_KEY.lower())
        if key is None or verb not in ("POST", "PATCH"):
            return self._call(route, params, query, headers, body, path, peer, None)
        if not IDEMPOTENCY_KEY_FORM.fullmatch(key):
            return _problem_answer(problem("invalid-argument",
                                           "Idempotency-Key must be 1-128 of A-Z a-z 0-9 _ - (a UUID fits)", path))
        scope = scope_of(headers.get("authorization", ""))
        begun = self.idempotency.begin(scope, key, fingerprint(verb, path, query, body))
        if isinstance(begun, Replay):
            return Answer(begun.kept.status, begun.kept.body, _content_type(begun.kept.status),
                          (*begun.kept.headers, ("Idempotency-Replayed", "true")))
        if isinstance(begun, Reused):
            return _problem_answer(problem(
                "idempotency-key-reused",
                f"Idempotency-Key {key!r} was used for a different request (method, path, query or body); "
                "a new request needs a new key", path))
        if isinstance(begun, InProgress):
            return _problem_answer(problem("idempotency-key-in-progress",
                                           f"a request with Idempotency-Key {key!r} is still running; retry", path))
        assert isinstance(begun, Run)
        try:
            answer = self._call(route, params, query, headers, body, path, peer, key)
        except BaseException:
            self.idempotency.abandon(scope, key)
            raise
        if _keep(answer):
            self.idempotency.finish(scope, key, Kept(answer.status, tuple(
                (k, v) for k, v in answer.headers if k in _KEPT_HEADERS), answer.body))
        else:
            self.idempotency.abandon(scope, key)
        return answer

    def _call(self, route: Route, params: dict[str, str], query: Sequence[tuple[str, str]],
              headers: dict[str, str], body: bytes, path: str, peer: str, key: str | None) -> Answer:
        if body.strip() and not headers.get("content-type", "application/json").startswith(
                ("application/json", "application/merge-patch+json")):
            return _problem_answer(problem("unsupported-media-type", "send Content-Type: application/json", path))
        if not headers.get("authorization"):
            # Before the request is read: an anonymous caller learns nothing about it.
            return _problem_answer(problem("unauthenticated", "send Authorization: Bearer <api key>", path),
                                   ("WWW-Authenticate", "Bearer"))
        try:
            request = http_transcoding.build_request(route, params, query, body)
            self._bind_headers(route, request, headers, key)
        except BadRequest as exc:
            return _problem_answer(problem("invalid-argument", str(exc), path))
        except (ValueError, TypeError) as exc:  # a value the message cannot hold that a check above missed
            return _problem_answer(problem("invalid-argument", f"a value does not fit its field: {exc}", path))
        context = HttpContext(headers.get("authorization"), peer)
        handler = self.handlers[(route.service, route.name)]
        try:
            if route.streams:
                messages = list(handler.unary_stream(request, context))  # type: ignore[misc]
                response = messages[-1] if messages else _empty(route)
            else:
                response = handler.unary_unary(request, context)  # type: ignore[misc]
        except RpcAbort as abort:
            return _problem_answer(Problem(http_problems.of_rpc(abort.code, abort.error_class), abort.details,
                                           path))
        except Exception:  # noqa: BLE001 -- the servicers map theirs; this is the last resort
            log.exception("HTTP %s %s failed", route.verb, route.template)
            return _problem_answer(problem("internal", "internal error; it has been logged", path))
        out_headers: list[tuple[str, str]] = []
        if route.response.full_name == _ENDPOINT:
            out_headers.append(("ETag", f'"{response.config_version}"'))
        status = 201 if route.verb == "POST" and route.name.startswith("Create") else 200
        return Answer(status, json.dumps(http_transcoding.to_json(response)).encode(), headers=tuple(out_headers))

    @staticmethod
    def _bind_headers(route: Route, request: Message, headers: dict[str, str], key: str | None) -> None:
        if_match = headers.get("if-match")
        if if_match is not None and if_match.strip() != "*":
            if not route.takes_if_match():
                raise BadRequest(f"If-Match is not taken by {route.verb} {route.template}")
            m = http_transcoding.ETAG_FORM.match(if_match.strip())
            if m is None:
                raise BadRequest('If-Match must be one ETag, as the endpoint\'s read answered it ("3")')
            setattr(request, http_transcoding.IF_MATCH_FIELD, int(m.group(1)))
        if key is not None and "request_id" in route.request.fields_by_name:
            given = getattr(request, "request_id")  # noqa: B009
            if given and given != key:
                raise BadRequest("request_id and Idempotency-Key differ; send one of them")
            setattr(request, "request_id", key)  # noqa: B010


def _empty(route: Route) -> Message:
    return message_factory.GetMessageClass(route.response)()


def _content_type(status: int) -> str:
    return "application/json" if status < 400 else PROBLEM_JSON


def _keep(answer: Answer) -> bool:
    """Kept for a replay: what will not change on a retry (a success, a refusal of the request)."""
    if answer.status >= 500 or answer.status in (401, 403):
        return False
    return not (answer.status == 409 and b"/v1/problems/aborted" in answer.body)


# -- aiohttp -----------------------------------------------------------------------------------


def build_app(api: HttpApi) -> web.Application:
    @web.middleware
    async def problems(request: web.Request, handler: Any) -> web.StreamResponse:
        """aiohttp's own refusals (a path it cannot route, a body too large) as problem+json too."""
        try:
            return cast(web.StreamResponse, await handler(request))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            known = {404: "no-route", 405: "method-not-allowed", 413: "request-too-large",
                     415: "unsupported-media-type"}
            slug = known.get(exc.status, "internal" if exc.status >= 500 else "invalid-argument")
            p = problem(slug, exc.reason)
            return web.Response(status=p.status, body=p.body(), content_type=PROBLEM_JSON)

    async def dispatch(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k.lower(): v for k, v in request.headers.items()}
        answer = await asyncio.to_thread(api.handle, request.method, request.path, list(request.query.items()),
                                         headers, body, request.remote or "")
        response = web.Response(status=answer.status, body=answer.body, content_type=answer.content_type)
        for name, value in answer.headers:
            response.headers[name] = value
        response.headers["Cache-Control"] = "no-store"
        return response

    app = web.Application(client_max_size=1024 * 1024, middlewares=[problems])
    app.router.add_route("*", r"/{tail:[\s\S]*}", dispatch)  # every path, newlines included
    return app


def serve(api: HttpApi, host: str, port: int) -> Any:
    """The API on its own thread and loop (the console's server class); ``.stop()`` ends it."""
    from control_plane.console.app import ConsoleServer

    server = ConsoleServer(build_app(api), host, port, name="http-api")
    server.start()
    log.info("HTTP API on http://%s:%d%s", host, server.port, openapi_doc.DOCUMENT_PATH)
    return server


def wire(registry: MethodRegistry, idempotency: IdempotencyStore, server_url: str = "",
         tracer: Tracer | None = None) -> HttpApi:
    """The API over the handlers ``registry`` recorded, for the routes of openapi_doc.services()."""
    table = http_transcoding.routes(openapi_doc.services())
    return HttpApi(table, registry.handlers, idempotency, openapi_doc.document(table, server_url), tracer)

