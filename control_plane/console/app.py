"""The console's HTTP server: aiohttp on 127.0.0.1, pages rendered on the server by jinja2.

The console is another front end of the service layer, like the gRPC servicers: its handlers
(control_plane.console.views) call the same EndpointService, DeliveryService and OrderingService
methods with the same Principal, so tenancy, validation, audit rows and config publication are
the services' and nothing here repeats them.

Every response passes the middlewares below, in this order:

* ``security_headers``: a CSP with no script at all (``default-src 'none'``; styles from our own
  /static only), no framing but by ourselves and the configured portal hosts, no referrer, no caching.
* ``sessions``: the signed session cookie (control_plane.console.sessions), HttpOnly,
  SameSite=Strict, Secure when the console is served over TLS; an anonymous session for visitors.
  A portal session travels in the path instead (``/s/<signed session>/...``, control_plane.console.
  portal says why): no cookie is read or set for such a request.
* ``csrf``: every POST carries the session's CSRF token or is refused (403) before its handler.
* ``errors``: domain errors become pages with the domain's message and status (NotFound -> 404:
  another tenant's id answers exactly like one that does not exist).

The server runs on its own thread and event loop; the services are blocking (Cassandra, Kafka), so
handlers call them on worker threads (``blocking``).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Awaitable, Callable

from aiohttp import web

from control_plane import errors
from control_plane.console import account_pages, catalog_pages, figures_pages, views
from control_plane.console.context import (
    BASE,
    CHANGED,
    CONSOLE,
    FORM,
    HERE,
    SESSION,
    Console,
    blocking,
)
from control_plane.console.portal import PATH_PREFIX, PATH_SESSION
from control_plane.console.sessions import (
    ANONYMOUS_TTL_MS,
    COOKIE_NAME,
    Kind,
    Session,
)
from core.secrets import redact

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_STATUS = {
    errors.InvalidArgument: 400, errors.FailedPrecondition: 409, errors.AlreadyExists: 409, errors.Aborted: 409,
    errors.NotFound: 404, errors.Unauthenticated: 401, errors.PermissionDenied: 403, errors.Unavailable: 503,
}


def _csp(frame_ancestors: tuple[str, ...]) -> str:
    ancestors = " ".join(["'self'", *frame_ancestors])
    return ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; "
            f"frame-ancestors {ancestors}")


def build_app(console: Console) -> web.Application:
    csp = _csp(console.frame_ancestors)

    @web.middleware
    async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            response = exc
        response.headers["Content-Security-Policy"] = csp
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        if not request.path.startswith("/static/"):
            response.headers["Cache-Control"] = "no-store"
        if isinstance(response, web.HTTPException):
            raise response
        return response

    @web.middleware
    async def sessions(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/static/") or request.match_info.http_exception is not None:
            # No session for a stylesheet or an unknown path: a portal page would otherwise get
            # an anonymous cookie with its stylesheet (and its favicon).
            return await handler(request)
        now = console.services.now_ms()
        carried = request.match_info.get(PATH_SESSION)
        if carried is not None:
            return await _path_session(request, handler, carried, now)
        request[BASE] = ""
        raw = request.cookies.get(COOKIE_NAME, "")
        session = console.codec.decode(raw, now) if raw else None
        if session is not None and session.kind is Kind.TENANT and not await blocking(_key_live, console, session):
            session = None  # the API key was revoked since: the session ends with it
        request[CHANGED] = session is None
        request[SESSION] = session or console.new_session(Kind.ANONYMOUS, ANONYMOUS_TTL_MS)
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            response = exc
        if request[CHANGED]:
            fresh: Session = request[SESSION]
            response.set_cookie(COOKIE_NAME, console.codec.encode(fresh), httponly=True, samesite="Strict",
                                secure=console.secure_cookies, path="/",
                                max_age=max(1, (fresh.expires_at_ms - now) // 1000))
        if isinstance(response, web.HTTPException):
            raise response
        return response

    @web.middleware
    async def csrf(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            form = await request.post()
            request[FORM] = form
            if not console.codec.csrf_ok(request[SESSION], str(form.get("csrf_token", ""))):
                log.warning("console: %s %s refused: missing or wrong CSRF token", request.method, request.path)
                return console.render(request, "error.html", status=403, title="Refused",
                                      message="This form has expired or did not come from this console. "
                                              "Reload the page and try again.")
        return await handler(request)

    @web.middleware
    async def errors_as_pages(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except errors.Unauthenticated:
            if request.method == "GET":
                raise web.HTTPSeeOther("/login") from None
            return console.render(request, "error.html", status=401, title="Not logged in",
                                  message="Your session has ended; log in again.")
        except errors.ControlPlaneError as exc:
            status = _STATUS.get(type(exc), 400)
            return console.render(request, "error.html", status=status, title=_TITLES.get(status, "Refused"),
                                  message=redact(exc.message))

    async def _path_session(request: web.Request, handler: Handler, carried: str, now: int) -> web.StreamResponse:
        """A portal session in the path: only a portal session may travel there (an API key's
        or the admin's never does), and no cookie is read or written."""
        session = console.codec.decode(carried, now)
        request[CHANGED] = False
        request[BASE] = ""
        if session is None or session.kind is not Kind.PORTAL:
            request[SESSION] = console.new_session(Kind.ANONYMOUS, ANONYMOUS_TTL_MS)
            return console.render(request, "error.html", status=401, title="Portal session ended",
                                  message="This portal session has expired. Open the webhooks page again.")
        request[SESSION] = session
        request[BASE] = f"{PATH_PREFIX}{carried}"
        return await handler(request)

    app = web.Application(middlewares=[security_headers, sessions, csrf, errors_as_pages],
                          client_max_size=256 * 1024)
    app[CONSOLE] = console
    views.add_routes(app)
    for base in ("", f"{PATH_PREFIX}{{{PATH_SESSION}}}"):  # a cookie session, and a portal session's path
        catalog_pages.add_routes(app, base)
        figures_pages.add_routes(app, base)
        account_pages.add_routes(app, base)
    app.router.add_static("/static/", HERE / "static", follow_symlinks=False)
    return app


_TITLES = {400: "Not accepted", 404: "Not found", 409: "Not possible now", 403: "Not allowed",
           503: "Unavailable, retry"}


def _key_live(console: Console, session: Session) -> bool:
    key = console.services.store.get_api_key_by_id(session.tenant_id, session.key_id)
    return key is not None and key.revoked_at_ms is None


class ConsoleServer:
    """The console on its own thread and event loop (the gRPC server keeps its thread pool); the
    HTTP API (control_plane.httpapi.server) runs on one too, under its own ``name``."""

    def __init__(self, app: web.Application, host: str, port: int, name: str = "console") -> None:
        self._app = app
        self._host = host
        self._port = port
        self._name = name
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, access_log=None)
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self.port = port

    def start(self) -> int:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        log.info("%s serving on http://%s:%d", self._name, self._host, self.port)
        return self.port

    async def _start(self) -> None:
        await self._runner.setup()
        # Bound here so that port 0 (tests) reports the port the OS chose.
        sock = socket.create_server((self._host, self._port), reuse_port=False)
        self.port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock).start()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
