"""The web console in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright)
on the real stack: this session's in-process control plane serves it (port 0), its own delivery
job sends to the session's recording receiver, and events enter through the session's outbox.

The tour: log in with a tenant key, create an endpoint, publish events through the outbox, find
them in the log, replay one with a reason (the receiver gets a second verified request and the
log shows the new attempt marked manual), rotate the secret (both signatures verify during the
overlap), and open a one-time portal link (once only). Security: another tenant's delivery id
answers 404, a POST without the CSRF token is refused, a receiver's `<script>` body renders as
text and runs nothing, a portal session cannot reach the operator view. Embedding: the portal
works in an iframe of a page on another site and on another port of the same site (its session
in the path, no cookie), where a cookie session shows only the login page. Health: an endpoint
whose receiver answers 503 shows its breaker open in the health strip and in the operator view
(the job's per-endpoint report: needs a TaskManager running this checkout's operators).
Screenshots of the main pages land in .run/console/.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from playwright.sync_api import Browser, Page

from control_plane.console import serve
from control_plane.console.portal_api import portal_pb, portal_rpc
from control_plane.rpc.api import pb, rpc
from core.records import delivery_id_for
from core.settings import REPO_ROOT
from outbox.producer import write_event
from tests.support.behaviours import status
from tests.support.console_browser import SHOTS
from tests.support.faults import wait_all_reached
from tests.support.helpers import auth, eventually, new_tenant
from tests.support.receiver import verify_signature

pytestmark = pytest.mark.integration

HOSTILE = b"<script>window.__pwned = 1; alert('pwned')</script><img src=x onerror=\"window.__pwned = 2\">"




def _page(browser: Browser) -> Page:
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(15_000)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.dialogs = dialogs  # type: ignore[attr-defined]
    return page


def _login(page: Page, console: str, credential: str) -> None:
    page.goto(f"{console}/login")
    page.fill("input[name=credential]", credential)
    page.click("form[action='/login'] button")


def _create_endpoint(page: Page, console: str, url: str, event_types: str) -> tuple[str, str]:
    page.goto(f"{console}/endpoints")
    page.fill("#create-endpoint input[name=url]", url)
    page.fill("#create-endpoint input[name=event_types]", event_types)
    page.click("#create-endpoint button")
    secret = page.inner_text("#signing-secret").strip()
    return page.inner_text("#endpoint-link").strip(), secret


def _shot(page: Page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _here(url: str, console: str) -> str:
    """A portal link made for the configured console address, pointed at this test's console."""
    return f"{console}/portal/{url.split('/portal/', 1)[1]}"


def _until_text(page: Page, url: str, selector: str, text: str, timeout: float = 60) -> None:
    """Reload ``url`` until ``selector`` shows ``text`` (history rows are written by the job)."""
    def shown() -> bool | None:
        page.goto(url)
        # Not text_content(selector): that waits for a row the page does not have yet.
        return text in " ".join(page.locator(selector).all_text_contents()) or None
    eventually(shown, timeout=timeout, interval=1, what=f"{text!r} in {selector} of {url}")


def test_tenant_tour_replay_rotate_and_portal(console, browser, relay, grpc_channel, settings, receiver,  # type: ignore[no-untyped-def]
                                              control_plane):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    page = _page(browser)
    _login(page, console, api_key)
    assert page.url.endswith("/endpoints") and tenant_id in page.inner_text("header")

    path = f"/console/{tenant_id}"
    endpoint_id, secret = _create_endpoint(page, console, f"{receiver.base_url}{path}", "console.*")
    assert secret.startswith("whsec_")
    _shot(page, "endpoint-created")

    # Events the way an application emits them: rows in the outbox, in one transaction.
    with relay.connect() as conn:
        events = [write_event(conn, tenant_id, "console.invoice_paid", {"n": i}) for i in range(3)]
    deliveries = [delivery_id_for(e, endpoint_id) for e in events]
    wait_all_reached(receiver, set(deliveries), timeout=90)

    log_url = f"{console}/deliveries?endpoint={endpoint_id}"
    for d in deliveries:
        _until_text(page, log_url, f"tr[data-delivery='{d}']", "succeeded")
    _shot(page, "delivery-log")

    # Replay one with a reason: a second request, same webhook-id, verified; marked manual.
    target = deliveries[0]
    page.goto(f"{console}/deliveries/{target}")
    page.fill("#replay input[name=reason]", "receiver fixed")
    page.click("#replay button")
    assert "queued" in page.inner_text("#flash")
    second = eventually(lambda: [r for r in receiver.requests(path) if r.webhook_id == target][1:] or None,
                        timeout=60, what="the replay at the receiver")[0]
    assert verify_signature(second, [secret]) == [secret]
    _until_text(page, f"{console}/deliveries/{target}", "#attempts", "manual")
    assert page.locator("#attempts tr.is-manual").count() == 1
    assert "receiver fixed" in page.inner_text("#replays")
    _shot(page, "delivery-detail")
    _until_text(page, log_url, f"tr[data-delivery='{target}']", "manual")

    # Rotate with an overlap: both secrets verify the next request.
    page.goto(f"{console}/endpoints/{endpoint_id}")
    page.fill("#rotate input[name=overlap_s]", "3600")
    page.click("#rotate button")
    new_secret = page.inner_text("#signing-secret").strip()
    assert new_secret.startswith("whsec_") and new_secret != secret
    assert page.locator("#live-keys tbody tr").count() == 2 and "overlap" in page.inner_text("#live-keys")
    _shot(page, "rotated")
    page.goto(f"{console}/endpoints/{endpoint_id}")
    _shot(page, "endpoint")
    before = len(receiver.requests(path))
    page.click("#send-test")
    ping = eventually(lambda: receiver.requests(path)[before:] or None, timeout=60, what="the test event")[0]
    assert verify_signature(ping, [secret, new_secret]) == [secret, new_secret]

    # The portal: a one-time link from the CLI, scoped to this tenant.
    admin_token = settings.control_plane.admin_token.get_secret_value()
    out = subprocess.run([str(REPO_ROOT / ".venv/bin/webhookctl"), "--target", control_plane, "--json", "portal",
                          "link", "--tenant", tenant_id, "--ttl", "15m"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "WEBHOOKCTL_ADMIN_TOKEN": admin_token})
    assert out.returncode == 0, out.stderr
    url = _here(json.loads(out.stdout)["url"], console)
    portal = _page(browser)
    portal.goto(url)
    portal.wait_for_url(f"{console}/s/*/endpoints")
    assert endpoint_id in portal.inner_text("#endpoints") and "(portal)" in portal.inner_text("header")
    assert portal.context.cookies() == []  # the portal's session is in its URLs, not in a cookie
    _shot(portal, "portal")
    again = _page(browser)
    response = again.goto(url)
    assert response is not None and response.status == 404 and "not valid" in again.inner_text("h1")


def test_security(console, browser, grpc_channel, settings, receiver, delivery_job):  # type: ignore[no-untyped-def]
    tenant_a, key_a = new_tenant(grpc_channel, settings)
    tenant_b, key_b = new_tenant(grpc_channel, settings)
    path = f"/console-hostile/{tenant_a}"
    receiver.set_behaviour(path, status(200, HOSTILE))
    stub = rpc.ControlPlaneStub(grpc_channel)
    ep = stub.CreateEndpoint(pb.CreateEndpointRequest(url=f"{receiver.base_url}{path}", event_types=["x.*"]),
                             metadata=auth(key_a)).endpoint.endpoint_id
    sent = stub.SendTestEvent(pb.GetEndpointRequest(endpoint_id=ep), metadata=auth(key_a))
    receiver.wait_for(path, 1, timeout=60)

    # A hostile response body is shown as text, and nothing in it runs.
    page = _page(browser)
    _login(page, console, key_a)
    _until_text(page, f"{console}/deliveries/{sent.delivery_id}", "#attempts", "<script>")
    assert page.evaluate("window.__pwned") is None and not page.dialogs  # type: ignore[attr-defined]
    assert page.locator("#attempts script, #attempts img").count() == 0
    _shot(page, "hostile-response")

    # A POST without the CSRF token is refused, and changes nothing.
    refused = page.request.post(f"{console}/endpoints/{ep}/disable", form={"x": "1"}, max_redirects=0)
    assert refused.status == 403
    got = stub.GetEndpoint(pb.GetEndpointRequest(endpoint_id=ep), metadata=auth(key_a))
    assert got.status == pb.ENDPOINT_STATUS_ACTIVE

    # Another tenant's delivery (and endpoint) by id: 404, as if it did not exist.
    other = _page(browser)
    _login(other, console, key_b)
    for url in (f"{console}/deliveries/{sent.delivery_id}", f"{console}/endpoints/{ep}"):
        response = other.goto(url)
        assert response is not None and response.status == 404, url
    assert sent.delivery_id not in other.content()

    # A portal session cannot reach the operator view.
    admin_md = auth(settings.control_plane.admin_token.get_secret_value())
    link = portal_rpc.PortalStub(grpc_channel).CreatePortalLink(
        portal_pb.CreatePortalLinkRequest(tenant_id=tenant_b, ttl_seconds=60), metadata=admin_md)
    portal = _page(browser)
    portal.goto(_here(link.url, console))
    portal.wait_for_url(f"{console}/s/*/endpoints")
    response = portal.goto(f"{console}/operator")
    assert response is not None and response.status == 404
    # ... while the admin token does.
    admin = _page(browser)
    _login(admin, console, settings.control_plane.admin_token.get_secret_value())
    assert admin.url.endswith("/operator") and tenant_a in admin.inner_text("#tenants")
    _shot(admin, "operator")
    with pytest.raises(grpc.RpcError) as err:  # and only the admin may ask for a link
        portal_rpc.PortalStub(grpc_channel).CreatePortalLink(
            portal_pb.CreatePortalLinkRequest(tenant_id=tenant_b), metadata=auth(key_b))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


class _Embedding:
    """The SaaS's own page: an iframe of the console, served on ``host`` (another port)."""

    def __init__(self, host: str) -> None:
        self.frame_src = ""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                body = (f'<!doctype html><title>SaaS settings</title><h1>Your webhooks</h1>'
                        f'<iframe id="portal" src="{owner.frame_src}" width="1200" height="700"></iframe>').encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://{host}:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"], ids=["cross-site", "same-site-other-port"])
def test_the_portal_works_in_an_iframe_of_the_saas_page(host, browser, settings, control_plane_server,  # type: ignore[no-untyped-def]
                                                         grpc_channel, receiver):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    stub = rpc.ControlPlaneStub(grpc_channel)
    ep = stub.CreateEndpoint(pb.CreateEndpointRequest(url=f"{receiver.base_url}/embedded/{tenant_id}",
                                                      event_types=["x.*"]), metadata=auth(api_key)).endpoint.endpoint_id
    saas = _Embedding(host)
    cp = settings.control_plane.model_copy(update={"console_frame_ancestors": [saas.origin]})
    web = serve(settings.model_copy(update={"control_plane": cp}), control_plane_server.console, port=0)
    console = f"http://127.0.0.1:{web.port}"
    try:
        # A cookie session does not reach a frame on another site: the frame shows the login page.
        page = _page(browser)
        _login(page, console, api_key)
        saas.frame_src = f"{console}/endpoints"
        page.goto(saas.origin)
        frame = page.frame_locator("#portal")
        if host == "localhost":
            frame.locator("input[name=credential]").wait_for()
        else:
            frame.locator("#endpoints").wait_for()

        # The portal link, as the SaaS's backend hands it to the page, works in either.
        link = portal_rpc.PortalStub(grpc_channel).CreatePortalLink(
            portal_pb.CreatePortalLinkRequest(tenant_id=tenant_id, ttl_seconds=60),
            metadata=auth(settings.control_plane.admin_token.get_secret_value()))
        embedded = _page(browser)
        saas.frame_src = _here(link.url, console)
        embedded.goto(saas.origin)
        frame = embedded.frame_locator("#portal")
        frame.locator(f"#endpoints a:text('{ep}')").click()
        frame.locator("#endpoint-status").wait_for()
        # A form in the frame: posted with the session's CSRF token, no cookie involved.
        frame.locator(f"form[action$='/endpoints/{ep}/disable'] button").click()
        assert "endpoint disabled" in frame.locator("#flash").inner_text()
        got = stub.GetEndpoint(pb.GetEndpointRequest(endpoint_id=ep), metadata=auth(api_key))
        assert got.status == pb.ENDPOINT_STATUS_DISABLED
        assert embedded.context.cookies() == []
        _shot(embedded, f"portal-iframe-{host}")
    finally:
        web.stop()
        saas.stop()


def test_an_endpoint_answering_503_shows_its_breaker_open(console, browser, relay, grpc_channel, settings,  # type: ignore[no-untyped-def]
                                                           receiver):
    """Reads the job's per-endpoint report (endpoint_backlogs with the breaker columns): the
    TaskManager must run this checkout's operators/dispatcher.py."""
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    path = f"/console-503/{tenant_id}"
    receiver.set_behaviour(path, status(503))
    page = _page(browser)
    _login(page, console, api_key)
    endpoint_id, _ = _create_endpoint(page, console, f"{receiver.base_url}{path}", "console.*")
    with relay.connect() as conn:
        for i in range(2 * settings.dispatch.breaker_failure_threshold):
            write_event(conn, tenant_id, "console.order_failed", {"n": i})
    receiver.wait_for(path, settings.dispatch.breaker_failure_threshold, timeout=90)

    strip = f"#breakers .breaker[data-endpoint='{endpoint_id}']"
    _until_text(page, f"{console}/endpoints/{endpoint_id}", strip, f"{endpoint_id}: open", timeout=60)
    assert "breaker-open" in (page.get_attribute(strip, "class") or "")
    _shot(page, "breaker-open")

    admin = _page(browser)
    _login(admin, console, settings.control_plane.admin_token.get_secret_value())
    _until_text(admin, f"{console}/operator", f"#backlogs tr[data-tenant='{tenant_id}'] .open-breakers",
                endpoint_id, timeout=60)
    _shot(admin, "operator-breaker-open")
