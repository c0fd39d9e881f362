"""What the console's server and its pages share: the services it calls, its state (sessions'
codec, templates), the keys of what a request carries, and how a handler calls a blocking service.

:mod:`control_plane.console.app` builds the server from these and the pages
(:mod:`control_plane.console.views`, :mod:`control_plane.console.health`) read them; none of
those imports another for them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import jinja2
from aiohttp import web
from multidict import MultiDictProxy

from control_plane import errors
from control_plane.auth import Authenticator
from control_plane.catalog.service import CatalogStore
from control_plane.console.portal import PortalService
from control_plane.console.sessions import SID_BYTES, Kind, Session, SessionCodec, new_sid
from control_plane.domain import Principal
from control_plane.endpoints.health import EndpointHealthService
from control_plane.endpoints.service import EndpointService
from control_plane.history.account import TenantAccountService
from control_plane.history.deliveries import DeliveryService
from control_plane.history.ordering import OrderingService
from control_plane.history.reconcile import Reconciler
from control_plane.store import EndpointStore

HERE = Path(__file__).resolve().parent
T = TypeVar("T")


@dataclass(frozen=True)
class ConsoleServices:
    """What the console calls: the process's own service objects (server.build wires them)."""

    auth: Authenticator
    store: EndpointStore  # tenants and API keys: who a session is, and the operator's tenant list
    endpoints: EndpointService
    deliveries: DeliveryService
    ordering: OrderingService
    portal: PortalService
    reconciler: Reconciler
    health: EndpointHealthService  # the job's per-endpoint reports: ages, breakers, throttling
    now_ms: Callable[[], int]
    random_bytes: Callable[[int], bytes] = os.urandom
    # Operator view links: Prometheus' health page and the Flink dashboard.
    links: dict[str, str] = field(default_factory=dict)
    # Where the operator view reads the jobs' gauges and alerts ("": nowhere).
    prometheus_url: str = ""
    # The account page's service (None: the page says it is not available).
    account: TenantAccountService | None = None
    # The tenant's event-type catalog, read by its pages (None: not available).
    catalog: CatalogStore | None = None


async def blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A blocking service call, off the event loop."""
    return await asyncio.to_thread(fn, *args, **kwargs)


class Console:
    """The app's shared state: services, the session codec and the templates."""

    def __init__(self, services: ConsoleServices, codec: SessionCodec, secure_cookies: bool,
                 frame_ancestors: tuple[str, ...] = ()) -> None:
        self.services = services
        self.codec = codec
        self.secure_cookies = secure_cookies
        self.frame_ancestors = frame_ancestors
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every value, in every template: response bodies are hostile input
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["ms_time"] = _ms_time
        self.templates.filters["num"] = _num

    def render(self, request: web.Request, name: str, status: int = 200, **values: Any) -> web.Response:
        session: Session = request[SESSION]
        html = self.templates.get_template(name).render(
            session=session, csrf=self.codec.csrf_token(session), base=request[BASE], **values)
        return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")

    def login(self, request: web.Request, session: Session) -> None:
        """Replace the request's session (a new sid: no fixation); the cookie follows the response."""
        request[SESSION] = session
        request[CHANGED] = True

    def new_session(self, kind: Kind, ttl_ms: int, **fields: Any) -> Session:
        return Session(sid=new_sid(self.services.random_bytes(SID_BYTES)), kind=kind,
                       expires_at_ms=self.services.now_ms() + ttl_ms, **fields)

    def principal(self, request: web.Request) -> Principal:
        """The tenant principal of the request's session; Unauthenticated for any other."""
        session: Session = request[SESSION]
        if not session.is_tenant:
            raise errors.Unauthenticated("log in with a tenant API key")
        return Principal(session.tenant_id, session.key_id, session.read_only)


CONSOLE = web.AppKey("console", Console)
SESSION = web.RequestKey("session", Session)
CHANGED = web.RequestKey("session_changed", bool)
# What the tenant view's links and redirects start with: "" for a cookie session, "/s/<signed
# session>" for a portal session carried in the path.
BASE = web.RequestKey("base", str)
FORM = web.RequestKey("form", MultiDictProxy)


def _ms_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _num(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def form_time(text: str, name: str) -> int | None:
    """A datetime-local field (UTC) as unix ms; None when empty."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise errors.InvalidArgument(f"{name} is not a date and time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)
