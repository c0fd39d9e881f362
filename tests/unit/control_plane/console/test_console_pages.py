"""The console's catalog, figures and account pages through aiohttp's test server with fake
services (a portal session in the path: no cookie to set up), and their pure helpers. Every read
is the session's tenant's; the browser tests (tests/integration/test_console_pages.py) drive the
same pages on the real stack."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from control_plane.catalog.model import ACTIVE, DEPRECATED, EventTypeEntry, VersionEntry
from control_plane.console import account_pages, catalog_pages
from control_plane.console.app import Console, build_app
from control_plane.console.sessions import Kind, Session, SessionCodec
from control_plane.domain import Attempt, DeliveryDetail, DeliveryStatus, DeliverySummary, Page, Principal, Tenant
from control_plane.endpoints.health import EndpointHealthService
from control_plane.errors import InvalidArgument, NotFound
from core import account as acc
from core.event_schemas import SchemaVersion

KEY = b"k" * 32
T0 = 1_800_000_000_000
HOUR = 3_600_000
SESSION = Session(sid="s1", kind=Kind.PORTAL, expires_at_ms=T0 + HOUR, tenant_id="acme", key_id="portal_1")


def utc(year: int, month: int, day: int, hour: int, minute: int = 0) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


def entry(name: str, versions: tuple[tuple[str, str], ...] = (("1.0", ACTIVE),), status: str = ACTIVE,
          tenant: str = "acme") -> EventTypeEntry:
    return EventTypeEntry(
        tenant_id=tenant, name=name, description="d", group="billing", status=status, sunset_at_ms=None,
        enforcement="reject", created_at_ms=T0, updated_at_ms=T0, updated_by="key_1", revision=1,
        versions=tuple(VersionEntry(SchemaVersion.parse(v), {"type": "object", "title": "<b>x</b>"},
                                    ({"amount": 1},), T0, "key_1", s) for v, s in versions))


@dataclass
class FakeCatalog:
    types: dict[str, list[EventTypeEntry]]
    asked: list[str] = field(default_factory=list)

    def list_types(self, tenant_id: str, after: str, limit: int | None) -> list[EventTypeEntry]:
        self.asked.append(tenant_id)
        return self.types.get(tenant_id, [])

    def get_type(self, tenant_id: str, name: str) -> EventTypeEntry | None:
        self.asked.append(tenant_id)
        return next((t for t in self.types.get(tenant_id, []) if t.name == name), None)


@dataclass
class FakeStore:
    allowed: tuple[str, ...] | None = None

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        return Tenant(tenant_id, "Acme", T0, self.allowed)


class FakeReports:
    def for_endpoints(self, endpoint_ids: Any) -> list[Any]:
        return []

    def scan(self, limit: int) -> tuple[list[Any], bool]:
        return [], False


@dataclass
class FakeEndpoints:
    mine: tuple[str, ...] = ("ep_1",)

    def get(self, principal: Principal, endpoint_id: str) -> Any:
        if principal.tenant_id != "acme" or endpoint_id not in self.mine:
            raise NotFound(f"endpoint {endpoint_id} not found")
        return SimpleNamespace(endpoint_id=endpoint_id)

    def list(self, principal: Principal, size: int, cursor: str) -> Page[Any]:
        return Page((), "")


class FakeDeliveries:
    def list(self, principal: Principal, endpoint_id: str, statuses: Any, since: Any, until: Any, limit: int,
             cursor: str) -> Page[DeliverySummary]:
        assert principal.tenant_id == "acme"
        return Page((DeliverySummary("d1", "e1", "acme", endpoint_id, "x", DeliveryStatus.SUCCEEDED, 2, 200,
                                     T0 - HOUR, T0),), "")

    def get(self, principal: Principal, delivery_id: str) -> DeliveryDetail:
        summary = self.list(principal, "ep_1", [], None, None, 1, "").items[0]
        attempts = (Attempt(1, "a1", T0 - HOUR, T0 - HOUR, 503, 40, "retry", "http_5xx", False, 1, "u", (), "", ""),
                    Attempt(2, "a2", T0 - 10, T0, 200, 20, "succeeded", "", False, 1, "u", (), "", ""))
        return DeliveryDetail(summary, 1, False, None, None, "", attempts)


@dataclass
class FakeAccount:
    asked: list[tuple[str, int | None, int | None]] = field(default_factory=list)

    def account(self, principal: Principal, since: int | None, until: int | None) -> acc.Account:
        self.asked.append((principal.tenant_id, since, until))
        paid = acc.TypeAccount("invoice.paid", accepted=3, fanned_out=1, no_subscriber=1,
                               dead_lettered=Counter({"schema_invalid": 1}),
                               deliveries=Counter({"succeeded": 1, "pending": 1}),
                               skipped=Counter({"schema_major_not_accepted": 1}))
        return acc.Account("acme", since or 0, until or 0, [paid],
                           [acc.Unaccounted("evt_<9>", "invoice.paid", acc.DELIVERY_MISSING, "dlv_9", "no row")])


def services(catalog: FakeCatalog | None = None, account: FakeAccount | None = None,
             allowed: tuple[str, ...] | None = None) -> SimpleNamespace:
    return SimpleNamespace(now_ms=lambda: T0, random_bytes=lambda n: b"r" * n, store=FakeStore(allowed),
                           endpoints=FakeEndpoints(), deliveries=FakeDeliveries(), prometheus_url="",
                           health=EndpointHealthService(FakeReports(), lambda: T0),
                           catalog=catalog, account=account)


async def _get(svc: SimpleNamespace, path: str) -> tuple[int, str]:
    codec = SessionCodec(KEY)
    app = build_app(Console(svc, codec, secure_cookies=False))  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as client:
        response = await client.get(f"/s/{codec.encode(SESSION)}{path}", allow_redirects=False)
        return response.status, await response.text()


def get(svc: SimpleNamespace, path: str) -> tuple[int, str]:
    return asyncio.run(_get(svc, path))


# -- event types ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "allowed", "want"), [
    ("invoice.paid", None, True), ("invoice.paid", ("invoice.*",), True), ("invoice.paid", ("user.*",), False),
    ("invoice.paid", (), False), ("invoice.paid", ("*",), True), ("invoice.paid", ("invoice.paid",), True),
])
def test_subscribable_follows_the_tenants_allowed_types(name: str, allowed: tuple[str, ...] | None,
                                                        want: bool) -> None:
    assert catalog_pages.subscribable(name, allowed) is want


def test_rows_are_sorted_and_name_deprecated_versions() -> None:
    rows = catalog_pages.rows([entry("user.created"), entry("invoice.paid", (("1.0", DEPRECATED), ("2.0", ACTIVE)))],
                              ("invoice.*",))
    assert [(r.name, r.versions, r.deprecated_versions, r.subscribable) for r in rows] == [
        ("invoice.paid", ("1.0", "2.0"), ("1.0",), True), ("user.created", ("1.0",), (), False)]


def test_the_event_types_page_lists_only_the_sessions_tenants_catalog() -> None:
    catalog = FakeCatalog({"acme": [entry("invoice.paid")], "other": [entry("secret.thing", tenant="other")]})
    status, html = get(services(catalog, allowed=("invoice.*",)), "/event-types")
    assert status == 200
    assert 'data-type="invoice.paid"' in html and "secret.thing" not in html
    assert set(catalog.asked) == {"acme"}
    assert re.search(r'class="subscribable">yes<', html)
    assert 'id="allowed">invoice.*<' in html


def test_an_event_types_page_shows_its_schema_and_example_escaped() -> None:
    catalog = FakeCatalog({"acme": [entry("invoice.paid", (("1.0", DEPRECATED), ("1.1", ACTIVE)))]})
    status, html = get(services(catalog), "/event-types/invoice.paid")
    assert status == 200
    assert 'id="version-1.0"' in html and 'id="version-1.1"' in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html
    assert "&#34;amount&#34;: 1" in html or "&quot;amount&quot;: 1" in html


def test_another_tenants_type_answers_404() -> None:
    catalog = FakeCatalog({"other": [entry("secret.thing", tenant="other")]})
    status, html = get(services(catalog), "/event-types/secret.thing")
    assert status == 404
    assert catalog.asked == ["acme"]


# -- figures --------------------------------------------------------------------------------------


def test_the_figures_page_draws_one_bar_group_per_hour_and_its_numbers() -> None:
    status, html = get(services(), "/endpoints/ep_1/figures")
    assert status == 200
    svg = html[html.index("<svg"):html.index("</svg>")]
    assert svg.count('<g class="bucket">') == 24
    assert 'class="bar-5xx"' in svg and 'class="bar-2xx"' in svg
    assert re.search(r'id="requests">2<', html)
    assert re.search(r'id="success-rate">50.0 %<', html)
    assert "<script" not in html


def test_the_figures_of_another_tenants_endpoint_answer_404() -> None:
    status, _ = get(services(), "/endpoints/ep_not_mine/figures")
    assert status == 404


# -- account --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("query", "want"), [
    ({}, (T0 - HOUR, T0)), ({"hours": "6"}, (T0 - 6 * HOUR, T0)), ({"hours": "24"}, (T0 - 24 * HOUR, T0)),
    ({"since": "2027-01-15T08:00", "until": "2027-01-15T09:30"}, (utc(2027, 1, 15, 8), utc(2027, 1, 15, 9, 30))),
    ({"until": "2027-01-15T09:30"}, (utc(2027, 1, 15, 8, 30), utc(2027, 1, 15, 9, 30))),
    ({"since": "2027-01-15T08:00"}, (utc(2027, 1, 15, 8), T0)),
])
def test_the_account_window_from_the_query(query: dict[str, str], want: tuple[int, int]) -> None:
    assert account_pages.window(query, T0) == want


@pytest.mark.parametrize("query", [{"hours": "2"}, {"hours": "x"}, {"since": "yesterday"}])
def test_a_window_the_page_does_not_offer_is_refused(query: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument):
        account_pages.window(query, T0)


def test_the_account_page_shows_the_sessions_tenants_account_and_lists_the_unaccounted() -> None:
    account = FakeAccount()
    status, html = get(services(account=account), "/account?hours=6")
    assert status == 200
    assert account.asked == [("acme", T0 - 6 * HOUR, T0)]
    row = html[html.index('data-type="invoice.paid"'):]
    assert re.search(r'class="accepted">3<', row) and re.search(r'class="succeeded">1<', row)
    assert "schema_invalid 1" in html and "schema_major_not_accepted 1" in html
    assert 'id="balance">1 not accounted for' in html
    assert "evt_&lt;9&gt;" in html and 'href="/s/' in html and "/deliveries/dlv_9" in html


def test_a_bad_account_window_is_a_400_page() -> None:
    status, html = get(services(account=FakeAccount()), "/account?hours=5")
    assert status == 400 and "hours must be one of" in html


def test_pages_without_their_service_say_so() -> None:
    assert get(services(), "/account")[0] == 503
    assert get(services(), "/event-types")[0] == 503
