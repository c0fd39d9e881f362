"""The console's pages: each handler reads the form or query, calls one service method with the
session's principal (control_plane.console.app), and renders a template. No business rule here:
what may change, for whom, and what is audited are the services' decisions."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from aiohttp import web
from multidict import MultiDictProxy

from control_plane import errors
from control_plane.console import health
from control_plane.console.context import BASE, CHANGED, CONSOLE, FORM, SESSION, blocking, form_time
from control_plane.console.portal import PATH_PREFIX, PATH_SESSION, SESSION_TTL_S
from control_plane.console.sessions import LOGIN_TTL_MS, Kind, Session
from control_plane.domain import DeliveryStatus, EndpointSpec
from core.custom_headers import HeaderInput, InvalidHeaders, parse_flag_list
from core.fanout import filter_accepts
from core.records import EndpointStatus

LOG_PAGE = 25
# Endpoints a page lists (and the log's endpoint choice offers); a tenant with more pages through
# `webhookctl endpoints list`.
ENDPOINTS_SHOWN = 100


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/", _home)
    r.add_get("/login", _login_page)
    r.add_post("/login", _login)
    r.add_post("/logout", _logout)
    r.add_get("/portal/{token}", _portal)
    # The tenant view, for a cookie session and under a portal session's path prefix.
    for base in ("", f"{PATH_PREFIX}{{{PATH_SESSION}}}"):
        r.add_get(f"{base}/endpoints", _endpoints)
        r.add_post(f"{base}/endpoints", _create)
        r.add_get(f"{base}/endpoints/{{endpoint_id}}", _endpoint)
        r.add_post(f"{base}/endpoints/{{endpoint_id}}/{{action}}", _endpoint_action)
        r.add_get(f"{base}/deliveries", _deliveries)
        r.add_get(f"{base}/deliveries/{{delivery_id}}", _delivery)
        r.add_post(f"{base}/deliveries/{{delivery_id}}/replay", _replay)
    r.add_get("/operator", _operator)
    r.add_post("/operator/portal-link", _operator_link)


# -- sessions -------------------------------------------------------------------------------------


async def _home(request: web.Request) -> web.StreamResponse:
    session: Session = request[SESSION]
    target = "/operator" if session.kind is Kind.ADMIN else "/endpoints" if session.is_tenant else "/login"
    raise web.HTTPSeeOther(target)


async def _login_page(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    return c.render(request, "login.html", error="")


async def _login(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    credential = _field(request, "credential")
    metadata = [("authorization", f"Bearer {credential}")]
    try:
        principal = await blocking(c.services.auth.tenant, metadata)
    except errors.PermissionDenied:  # the admin token: the operator view
        await blocking(c.services.auth.admin, metadata)
        c.login(request, c.new_session(Kind.ADMIN, LOGIN_TTL_MS, key_id="admin"))
        raise web.HTTPSeeOther("/operator") from None
    except errors.Unauthenticated:
        return c.render(request, "login.html", status=401, error="Unknown or revoked credential.")
    c.login(request, c.new_session(Kind.TENANT, LOGIN_TTL_MS, tenant_id=principal.tenant_id,
                                   key_id=principal.key_id, read_only=principal.read_only))
    raise web.HTTPSeeOther("/endpoints")


async def _logout(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    c.login(request, c.new_session(Kind.ANONYMOUS, 60_000))
    raise web.HTTPSeeOther("/login")


async def _portal(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    request[CHANGED] = False  # no cookie, not even an anonymous one: the portal's session is in its URLs
    try:
        link = await blocking(c.services.portal.redeem, request.match_info["token"])
    except errors.NotFound:
        return c.render(request, "error.html", status=404, title="Link not valid",
                        message="This portal link is unknown, has expired or was already used. "
                                "Ask for a new one.")
    session = c.new_session(Kind.PORTAL, SESSION_TTL_S * 1000, tenant_id=link.tenant_id,
                            key_id=f"portal_{link.link_id}")
    # In the path, not in a cookie: an iframe on the SaaS's own site gets no cookie of ours
    # (control_plane.console.portal says why).
    raise web.HTTPSeeOther(f"{PATH_PREFIX}{c.codec.encode(session)}/endpoints")


# -- endpoints ------------------------------------------------------------------------------------


async def _endpoints(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    page = await blocking(c.services.endpoints.list, principal, ENDPOINTS_SHOWN, "")
    strip = await blocking(health.tenant_health, c.services, principal, [e.endpoint_id for e in page.items])
    return c.render(request, "endpoints.html", endpoints=page.items, more=bool(page.next_cursor),
                    health=strip, request_id=_request_id(), now_ms=c.services.now_ms())


async def _create(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    spec = EndpointSpec(url=_field(request, "url"), description=_field(request, "description"),
                        event_types=tuple(t for t in _field(request, "event_types").replace(",", " ").split() if t),
                        rate_limit_per_s=None, max_in_flight=None)
    created = await blocking(c.services.endpoints.create, principal, spec, _field(request, "request_id"),
                             _field(request, "signature_scheme"), headers=_headers(request))
    return c.render(request, "created.html", endpoint=created.endpoint, secret=created.signing_secret,
                    public_key=created.public_key, rotated=None)


async def _endpoint(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    endpoint_id = request.match_info["endpoint_id"]
    endpoint = await blocking(c.services.endpoints.get, principal, endpoint_id)
    versions = await blocking(c.services.endpoints.versions, principal, endpoint_id)
    keys = await blocking(c.services.ordering.blocked_keys, principal, endpoint_id, 50, "") \
        if endpoint.spec.ordering_key else None
    strip = await blocking(health.tenant_health, c.services, principal, [endpoint_id])
    return c.render(request, "endpoint.html", endpoint=endpoint, versions=versions[:20],
                    blocked=keys.items if keys else (), health=strip, now_ms=c.services.now_ms(),
                    flash=request.query.get("done", ""))


async def _endpoint_action(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    endpoint_id, action = request.match_info["endpoint_id"], request.match_info["action"]
    s = c.services.endpoints
    if action in ("disable", "enable"):
        await blocking(s.set_enabled, principal, endpoint_id, enabled=action == "enable")
        done = f"endpoint {action}d"
    elif action == "ping":
        sent = await blocking(s.send_test_event, principal, endpoint_id)
        raise web.HTTPSeeOther(f"{request[BASE]}/deliveries?endpoint={endpoint_id}&sent={sent.delivery_id}")
    elif action == "verify":
        await blocking(s.verify, principal, endpoint_id)
        done = "ownership verified"
    elif action == "resend-challenge":
        await blocking(s.resend_challenge, principal, endpoint_id)
        done = "new ownership challenge sent"
    elif action == "rotate":
        overlap = _field(request, "overlap_s")
        if overlap and not overlap.isdigit():
            raise errors.InvalidArgument("overlap must be a number of seconds")
        rotated = await blocking(s.rotate_secret, principal, endpoint_id,
                                 revoke_immediately=_field(request, "revoke_now") == "on",
                                 overlap_s=int(overlap or 0), signature_scheme="")
        return c.render(request, "created.html", endpoint=rotated.endpoint, secret=rotated.signing_secret,
                        public_key=rotated.public_key, rotated=rotated)
    elif action == "headers":
        updated = await blocking(s.update, principal, endpoint_id, EndpointSpec("", "", (), None, None), ["headers"],
                                 headers=_headers(request))
        done = f"custom headers saved (v{updated.config_version})"
    elif action == "skip-head":
        reason = _required_reason(request)
        skipped = await blocking(c.services.ordering.skip_head, principal, endpoint_id,
                                 _field(request, "ordering_key"), _field(request, "delivery_id"), reason,
                                 _field(request, "request_id"))
        done = f"skip of delivery {skipped.delivery_id} queued"
    else:
        raise errors.NotFound(f"no action {action}")
    raise web.HTTPSeeOther(f"{request[BASE]}/endpoints/{endpoint_id}?done={done}")


# -- deliveries -----------------------------------------------------------------------------------


async def _deliveries(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    q = request.query
    page = await blocking(c.services.endpoints.list, principal, ENDPOINTS_SHOWN, "")
    endpoint_id = q.get("endpoint") or (page.items[0].endpoint_id if page.items else "")
    filters = {"endpoint": endpoint_id, "status": q.get("status", ""), "since": q.get("since", ""),
               "until": q.get("until", ""), "event_type": q.get("event_type", "").strip()}
    rows: list[Any] = []
    next_cursor = ""
    if endpoint_id:
        statuses = [DeliveryStatus(filters["status"])] if filters["status"] in set(DeliveryStatus) else []
        listed = await blocking(c.services.deliveries.list, principal, endpoint_id, statuses,
                                form_time(filters["since"], "since"), form_time(filters["until"], "until"), LOG_PAGE,
                                q.get("cursor", ""))
        next_cursor = listed.next_cursor
        wanted = [d for d in listed.items
                  if not filters["event_type"] or filter_accepts([filters["event_type"]], d.event_type)]
        details = await asyncio.gather(*(blocking(c.services.deliveries.get, principal, d.delivery_id)
                                         for d in wanted))
        rows = [{"summary": d, "detail": detail, "manual": any(a.manual for a in detail.attempts)}
                for d, detail in zip(wanted, details, strict=True)]
    return c.render(request, "deliveries.html", endpoints=page.items, filters=filters, rows=rows,
                    next_cursor=next_cursor, statuses=[s.value for s in DeliveryStatus],
                    sent=q.get("sent", ""))


async def _delivery(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    detail = await blocking(c.services.deliveries.get, principal, request.match_info["delivery_id"])
    refusal = await blocking(c.services.deliveries.replay_refusal, principal, detail)
    return c.render(request, "delivery.html", d=detail, request_id=_request_id(), replay_refusal=refusal,
                    replayed=request.query.get("replayed", ""), status_class=health.attempt_class)


async def _replay(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    delivery_id = request.match_info["delivery_id"]
    replayed = await blocking(c.services.deliveries.replay, principal, delivery_id, _field(request, "request_id"),
                              _required_reason(request))
    raise web.HTTPSeeOther(f"{request[BASE]}/deliveries/{delivery_id}?replayed={replayed.request_id}")


# -- operator -------------------------------------------------------------------------------------


def _admin(request: web.Request) -> None:
    session: Session = request[SESSION]
    if session.kind is not Kind.ADMIN:
        # A tenant or portal session is told nothing about the operator view, not even that it exists.
        raise errors.NotFound("page not found")


async def _operator(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    _admin(request)
    view = await blocking(health.operator_view, c.services)
    return c.render(request, "operator.html", view=view, link=None)


async def _operator_link(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    _admin(request)
    ttl = _field(request, "ttl_s")
    issued = await blocking(c.services.portal.create_link, _field(request, "tenant_id"),
                            int(ttl) if ttl.isdigit() else 0, "admin")
    view = await blocking(health.operator_view, c.services)
    return c.render(request, "operator.html", view=view, link=issued)


# -- helpers --------------------------------------------------------------------------------------


def _field(request: web.Request, name: str) -> str:
    form: MultiDictProxy[Any] = request[FORM]
    value = form.get(name, "")
    return value.strip() if isinstance(value, str) else ""


def _headers(request: web.Request) -> tuple[HeaderInput, ...]:
    """The custom headers of a form: one `Name: value` per line, plain and secret apart."""
    try:
        return tuple(h for name, secret in (("headers", False), ("secret_headers", True))
                     for h in parse_flag_list([line for line in _field(request, name).splitlines() if line.strip()],
                                              secret=secret))
    except InvalidHeaders as exc:
        raise errors.InvalidArgument(str(exc)) from None


def _required_reason(request: web.Request) -> str:
    reason = _field(request, "reason")
    if not reason:
        raise errors.InvalidArgument("a reason is required: it is recorded with the request for the audit")
    return reason


def _request_id() -> str:
    """An idempotency key per rendered form: submitting it twice is one change."""
    return "con_" + uuid.uuid4().hex


def status_label(status: EndpointStatus) -> str:
    return status.value.replace("_", " ")
