"""The console's pure parts: signed sessions and CSRF tokens, one-time portal links (in-memory
store, fixed clock), the health strip's summary and the job's reports by tenant; and, through
aiohttp's test server with fake services, which sessions a portal path accepts. The pages
themselves are tested in a real browser (tests/integration/test_console.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace

import pytest
from aiohttp.test_utils import TestClient, TestServer

from control_plane.console.app import Console, build_app
from control_plane.console.health import summarise
from control_plane.console.portal import PortalLink, PortalService
from control_plane.console.sessions import Kind, Session, SessionCodec
from control_plane.domain import DeliveryStatus, DeliverySummary, Page, Principal, Tenant
from control_plane.endpoints.health import EndpointHealthService
from control_plane.errors import InvalidArgument, NotFound
from core.breaker import CircuitState
from core.endpoint_health import EndpointReport

KEY = b"k" * 32
T0 = 1_800_000_000_000


def _session(**kw: object) -> Session:
    return Session(**{"sid": "s1", "kind": Kind.TENANT, "expires_at_ms": T0 + 1000, "tenant_id": "acme",
                      "key_id": "key_1", **kw})  # type: ignore[arg-type]


def test_a_session_round_trips_until_it_expires() -> None:
    codec = SessionCodec(KEY)
    cookie = codec.encode(_session())
    assert codec.decode(cookie, T0) == _session()
    assert codec.decode(cookie, T0 + 1000) is None


@pytest.mark.parametrize("tamper", [
    lambda c: c[:-2] + ("AA" if not c.endswith("AA") else "BB"),  # the tag
    lambda c: SessionCodec(b"x" * 32).encode(_session(tenant_id="other")).split(".")[0] + "." + c.split(".")[1],
    lambda c: c.split(".")[0],  # no tag
    lambda c: "",
    lambda c: "garbage.garbage",
])
def test_a_tampered_or_foreign_cookie_is_refused(tamper) -> None:  # type: ignore[no-untyped-def]
    codec = SessionCodec(KEY)
    assert codec.decode(tamper(codec.encode(_session())), T0) is None


def test_csrf_tokens_are_bound_to_the_session() -> None:
    codec = SessionCodec(KEY)
    mine, other = _session(), _session(sid="s2")
    assert codec.csrf_ok(mine, codec.csrf_token(mine))
    assert not codec.csrf_ok(mine, codec.csrf_token(other))
    assert not codec.csrf_ok(mine, "")
    assert not SessionCodec(b"x" * 32).csrf_ok(mine, codec.csrf_token(mine))


class _Links:
    def __init__(self) -> None:
        self.rows: dict[str, PortalLink] = {}

    def put_link(self, link: PortalLink, ttl_s: int) -> None:
        self.rows[link.token_hash] = link

    def get_link(self, token_hash: str) -> PortalLink | None:
        return self.rows.get(token_hash)

    def redeem(self, link: PortalLink, at_ms: int) -> bool:
        if self.rows[link.token_hash].redeemed_at_ms is not None:
            return False
        self.rows[link.token_hash] = replace(link, redeemed_at_ms=at_ms)
        return True


class _Tenants:
    def get_tenant(self, tenant_id: str) -> Tenant | None:
        return Tenant(tenant_id, "Acme", T0) if tenant_id == "acme" else None


def _portal(clock: list[int]) -> tuple[PortalService, _Links]:
    links = _Links()
    counter = iter(range(1, 1000))
    service = PortalService(links, _Tenants(), lambda: clock[0],  # type: ignore[arg-type]
                            lambda n: bytes([next(counter)]) * n, "http://127.0.0.1:8090/")
    return service, links


def test_a_portal_link_opens_once_for_its_tenant_and_only_its_hash_is_stored() -> None:
    clock = [T0]
    portal, links = _portal(clock)
    issued = portal.create_link("acme", 60, "admin")
    assert issued.url.startswith("http://127.0.0.1:8090/portal/wpl_")
    token = issued.url.rsplit("/", 1)[1]
    assert all(token not in repr(row) for row in links.rows.values())
    assert portal.redeem(token).tenant_id == "acme"
    with pytest.raises(NotFound):
        portal.redeem(token)


@pytest.mark.parametrize("opened_after_ms, opens", [(59_999, True), (60_000, False)])
def test_a_portal_link_expires(opened_after_ms: int, opens: bool) -> None:
    clock = [T0]
    portal, _ = _portal(clock)
    token = portal.create_link("acme", 60, "admin").url.rsplit("/", 1)[1]
    clock[0] = T0 + opened_after_ms
    if opens:
        assert portal.redeem(token).tenant_id == "acme"
    else:
        with pytest.raises(NotFound):
            portal.redeem(token)


@pytest.mark.parametrize("tenant, ttl, error", [
    ("acme", 10, InvalidArgument), ("acme", 24 * 3600 + 1, InvalidArgument), ("", 60, InvalidArgument),
    ("nobody", 60, NotFound)])
def test_a_portal_link_is_refused_for_a_bad_ttl_or_tenant(tenant: str, ttl: int, error: type) -> None:
    portal, _ = _portal([T0])
    with pytest.raises(error):
        portal.create_link(tenant, ttl, "admin")


def test_an_unknown_or_malformed_token_opens_nothing() -> None:
    portal, _ = _portal([T0])
    for token in ("wpl_unknown", "not-a-token", "wpl_" + "a" * 200):
        with pytest.raises(NotFound):
            portal.redeem(token)


def _d(status: DeliveryStatus, http: int | None, created: int) -> DeliverySummary:
    return DeliverySummary("dlv", "evt", "acme", "ep", "t", status, 1, http, created, None)


@pytest.mark.parametrize("last_hour, classes, ratio", [
    ([], {}, None),
    ([_d(DeliveryStatus.SUCCEEDED, 200, T0), _d(DeliveryStatus.FAILED, 404, T0),
      _d(DeliveryStatus.PENDING, 503, T0), _d(DeliveryStatus.PENDING, None, T0)],
     {"2xx": 1, "4xx": 1, "5xx": 1, "no answer": 1}, 0.5),
    ([_d(DeliveryStatus.EXPIRED, 302, T0)], {"3xx": 1}, 0.0),
    # Never sent (schema pin): no answer to classify, nothing finished.
    ([_d(DeliveryStatus.SKIPPED, None, T0), _d(DeliveryStatus.SUCCEEDED, 200, T0)], {"2xx": 1}, 1.0),
])
def test_the_health_strip_summary(last_hour, classes, ratio) -> None:  # type: ignore[no-untyped-def]
    by_class, success = summarise(last_hour)
    assert {c: n for c, n in by_class.items() if n} == classes
    assert success == ratio


class _Reports:
    def __init__(self, rows: list[EndpointReport], more: bool = False) -> None:
        self.rows, self.more = rows, more

    def for_endpoints(self, endpoint_ids: Sequence[str]) -> list[EndpointReport]:
        return [r for r in self.rows if r.endpoint_id in endpoint_ids]

    def scan(self, limit: int) -> tuple[list[EndpointReport], bool]:
        return self.rows[:limit], self.more


def test_a_tenant_sees_only_its_own_endpoints_reports() -> None:
    rows = [EndpointReport("ep_a", "acme", 2, T0, CircuitState.OPEN, T0 + 1, T0 - 3000),
            # another tenant's row under an id the caller passed: never counted
            EndpointReport("ep_x", "other", 9, T0, CircuitState.OPEN, T0 + 1, T0 - 90_000)]
    service = EndpointHealthService(_Reports(rows), lambda: T0)
    h = service.tenant(Principal("acme", "key_1", read_only=True), ["ep_a", "ep_x"])
    assert (h.pending, h.open_breakers, h.oldest_new_age_ms) == (2, ("ep_a",), 3000)
    assert h.breakers == {"ep_a": "open", "ep_x": "idle"}


def test_the_operator_view_lists_tenants_holding_deliveries_or_with_a_breaker_open() -> None:
    rows = [EndpointReport("ep_1", "acme", 0, T0, CircuitState.OPEN, T0 + 1),
            EndpointReport("ep_2", "beta", 3, T0, CircuitState.CLOSED, None, T0 - 10),
            EndpointReport("ep_3", "idle", 0, T0, CircuitState.CLOSED)]
    tenants, capped = EndpointHealthService(_Reports(rows, more=True), lambda: T0).by_tenant()
    assert sorted(tenants) == ["acme", "beta"] and capped
    assert tenants["acme"].open_breakers == ("ep_1",) and tenants["beta"].pending == 3


# -- portal sessions in the path (control_plane.console.portal says why) ---------------------------


class _Endpoints:
    def __init__(self) -> None:
        self.listed_for: list[str] = []

    def list(self, principal: Principal, page_size: int, cursor: str) -> Page[object]:
        self.listed_for.append(principal.tenant_id)
        return Page((), "")


async def _get(codec: SessionCodec, endpoints: _Endpoints, method: str, path: str,
               **kw: object) -> tuple[int, str, str]:
    services = SimpleNamespace(now_ms=lambda: T0, endpoints=endpoints, random_bytes=lambda n: b"r" * n,
                               health=EndpointHealthService(_Reports([]), lambda: T0))
    app = build_app(Console(services, codec, secure_cookies=False))  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as client:
        response = await client.request(method, path, allow_redirects=False, **kw)
        return response.status, response.headers.get("Set-Cookie", ""), await response.text()


@pytest.mark.parametrize("session, status", [
    (_session(kind=Kind.PORTAL), 200),
    (_session(kind=Kind.PORTAL, expires_at_ms=T0), 401),  # expired
    (_session(kind=Kind.TENANT), 401),  # an API key's session never travels in a URL
    (_session(kind=Kind.ADMIN, tenant_id=""), 401),
])
def test_only_a_live_portal_session_is_accepted_in_the_path_and_no_cookie_is_set(session: Session,
                                                                               status: int) -> None:
    codec, endpoints = SessionCodec(KEY), _Endpoints()
    path = f"/s/{codec.encode(session)}/endpoints"
    got, cookie, html = asyncio.run(_get(codec, endpoints, "GET", path))
    assert (got, cookie) == (status, "")
    assert endpoints.listed_for == (["acme"] if status == 200 else [])
    if status == 200:  # the view's own links keep the session's prefix
        assert f'href="/s/{codec.encode(session)}/deliveries"' in html


def test_a_post_under_a_portal_path_needs_its_sessions_csrf_token() -> None:
    codec, endpoints = SessionCodec(KEY), _Endpoints()
    portal, other = _session(kind=Kind.PORTAL), _session(kind=Kind.PORTAL, sid="s2")
    path = f"/s/{codec.encode(portal)}/endpoints/ep_1/disable"
    for token in ("", codec.csrf_token(other)):
        status, _, _ = asyncio.run(_get(codec, endpoints, "POST", path, data={"csrf_token": token}))
        assert status == 403
