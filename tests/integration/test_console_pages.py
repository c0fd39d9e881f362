"""The console's catalog pages, an endpoint's figures page with its chart, and the account page,
in a real headless Chromium (the set-up of tests/integration/test_console.py) on the real stack.

A tenant with a catalog (order.paid 1, deprecated, and 2; order.noted 1) whose endpoints may
subscribe to order.paid only; one endpoint whose receiver answers 503 for the first events and
200 after (both classes in the chart). The pages show the catalog with its deprecation and
subscribability, the schema and example of each version, a chart with one bar group per hour
and the requests' classes, and the account of the window with every event placed. No page runs
a script (the CSP allows none; a hostile description renders as text). Screenshots land in
.run/console/.

NEEDS A TASKMANAGER THAT RUNS THIS CHECKOUT'S OPERATORS (fan-out's schema checks), as
tests/integration/test_catalog_fanout.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from playwright.sync_api import Browser, Page

from control_plane.rpc.api import pb, rpc
from control_plane.rpc.catalog_api import cpb, crpc
from core.records import delivery_id_for
from core.settings import Settings
from outbox.producer import write_event
from stack.outbox_relay import OutboxRelay
from tests.integration.test_catalog_fanout import GOOD, SCHEMA
from tests.support.behaviours import ok, status
from tests.support.console_browser import SHOTS
from tests.support.faults import wait_all_reached
from tests.support.helpers import auth, create_endpoints, eventually, new_tenant
from tests.support.receiver import Receiver

pytestmark = pytest.mark.integration

HOSTILE = "<script>window.__pwned = 1</script>"


class Tenant:
    def __init__(self, channel: grpc.Channel, settings: Settings, receiver: Receiver, relay: OutboxRelay) -> None:
        self.tenant_id, self.key = new_tenant(channel, settings)
        admin = auth(settings.control_plane.admin_token.get_secret_value())
        catalog = crpc.EventCatalogStub(channel)
        for name, versions in (("order.paid", ("1", "2")), ("order.noted", ("1",))):
            catalog.CreateEventType(cpb.CreateEventTypeRequest(
                tenant_id=self.tenant_id, name=name, enforcement="reject",
                description=HOSTILE if name == "order.noted" else "an order was paid"), metadata=admin)
            for version in versions:
                catalog.AddSchemaVersion(cpb.AddSchemaVersionRequest(
                    tenant_id=self.tenant_id, name=name, version=version, schema_json=json.dumps(SCHEMA),
                    examples_json=[json.dumps(GOOD)]), metadata=admin)
        sunset = Timestamp()
        sunset.FromMilliseconds(int(time.time() * 1000) + 30 * 86_400_000)
        catalog.DeprecateEventType(cpb.DeprecateEventTypeRequest(tenant_id=self.tenant_id, name="order.paid",
                                                                 version="1", sunset_at=sunset), metadata=admin)
        rpc.AdminStub(channel).SetTenantEventTypes(pb.SetTenantEventTypesRequest(
            tenant_id=self.tenant_id, allowed_event_types=["order.paid"]), metadata=admin)
        self.path = f"/ep/console-pages-{self.tenant_id}"
        receiver.set_behaviour(self.path, status(503))
        self.endpoint_id = create_endpoints(channel, self.key, [f"{receiver.base_url}{self.path}"],
                                            ["order.paid"])[0]
        time.sleep(2)  # the catalog reaches fan-out through the endpoints topic
        self.since_ms = int(time.time() * 1000) - 1000
        with relay.connect() as conn:
            self.failing = write_event(conn, self.tenant_id, "order.paid", GOOD, schema_version="2")
        first = delivery_id_for(self.failing, self.endpoint_id)
        wait_all_reached(receiver, {first}, timeout=120)  # at least one 503
        receiver.set_behaviour(self.path, ok())
        with relay.connect() as conn:
            self.events = [write_event(conn, self.tenant_id, "order.paid", GOOD, schema_version="2")
                           for _ in range(3)]
        ids = {delivery_id_for(e, self.endpoint_id) for e in self.events}
        wait_all_reached(receiver, ids, timeout=120)


@pytest.fixture(scope="module")
def tenant(grpc_channel: grpc.Channel, settings: Settings, receiver: Receiver, relay: OutboxRelay) -> Tenant:
    return Tenant(grpc_channel, settings, receiver, relay)


@pytest.fixture
def page(browser: Browser, console: str, tenant: Tenant) -> Iterator[Page]:
    p = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    p.set_default_timeout(15_000)
    p.goto(f"{console}/login")
    p.fill("input[name=credential]", tenant.key)
    p.click("form[action='/login'] button")
    yield p
    assert p.evaluate("window.__pwned === undefined"), "a script ran"
    p.context.close()


def test_the_catalog_pages_show_types_versions_deprecations_and_subscriptions(page: Page, console: str,
                                                                             tenant: Tenant) -> None:
    page.click("header nav >> text=Event types")
    assert page.url.endswith("/event-types")
    rows = {r.get_attribute("data-type"): r for r in page.locator("#event-types tr[data-type]").all()}
    assert set(rows) == {"order.paid", "order.noted"}
    assert rows["order.paid"].locator(".subscribable").inner_text() == "yes"
    assert rows["order.noted"].locator(".subscribable").inner_text() == "no"
    assert "1.0" in rows["order.paid"].locator("td").nth(4).inner_text()  # deprecated versions
    assert page.inner_text("#allowed") == "order.paid"
    page.screenshot(path=str(SHOTS / "event-types.png"), full_page=True)

    page.click("#event-types a >> text=order.paid")
    assert page.inner_text("#type-name") == "order.paid"
    assert "deprecated" in page.inner_text("#version-1\\.0 h2")
    assert json.loads(page.inner_text("#version-2\\.0 pre.schema >> nth=0")) == SCHEMA
    assert json.loads(page.inner_text("#version-2\\.0 pre.example")) == GOOD
    page.screenshot(path=str(SHOTS / "event-type.png"), full_page=True)

    page.goto(f"{console}/event-types/order.noted")
    assert HOSTILE in page.inner_text("dl.facts")  # shown as text, not run
    assert page.inner_text("#subscribable").startswith("no")


def test_the_endpoint_figures_page_draws_its_last_24_hours(page: Page, console: str, tenant: Tenant) -> None:
    page.goto(f"{console}/endpoints/{tenant.endpoint_id}")
    page.click("#figures-link")
    assert page.url.endswith(f"/endpoints/{tenant.endpoint_id}/figures")

    def drawn() -> bool | None:
        page.reload()
        return (page.locator("svg.chart rect.bar-5xx").count() > 0
                and page.locator("svg.chart rect.bar-2xx").count() > 0) or None
    eventually(drawn, timeout=60, interval=2, what="2xx and 5xx bars in the chart")
    assert page.locator("svg.chart g.bucket").count() == 24
    assert int(page.inner_text("#requests").split()[-1]) >= 4
    rate = page.inner_text("#success-rate")
    assert rate.endswith("%") and 0 < float(rate.split()[0]) < 100
    assert "p50" in page.inner_text("#latency") and "ms" in page.inner_text("#latency")
    assert page.locator("#breaker-transitions").inner_text()
    page.screenshot(path=str(SHOTS / "endpoint-figures.png"), full_page=True)


def test_the_account_page_places_every_event(page: Page, console: str, tenant: Tenant) -> None:
    page.click("header nav >> text=Account")
    assert "/account" in page.url

    def balanced() -> bool | None:
        page.goto(f"{console}/account?hours=1")
        row = page.locator('#account tr[data-type="order.paid"]')
        # The first event's delivery may still be retrying after its 503s: pending, and placed.
        return (row.count() == 1 and row.locator(".accepted").inner_text() == "4"
                and int(row.locator(".succeeded").inner_text()) + int(row.locator(".pending").inner_text()) == 4
                and page.inner_text("#balance") == "every event accounted for") or None
    eventually(balanced, timeout=90, interval=3, what="the window's four events placed")
    assert page.locator("#unaccounted").count() == 0
    page.screenshot(path=str(SHOTS / "account.png"), full_page=True)
