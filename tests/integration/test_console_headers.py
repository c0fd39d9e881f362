"""Custom headers in the web console, in the real headless Chromium of tests/integration/test_console.py
on the real stack: set on the create form, shown on the endpoint page with the secret value never
shown, sent with a test event the receiver gets, replaced with the endpoint page's form keeping the
secret, and a reserved name refused with the rule named."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.test_console import _login, _page, _shot
from tests.support.helpers import new_tenant

pytestmark = pytest.mark.integration


def test_custom_headers_set_shown_sent_and_replaced_in_the_console(  # type: ignore[no-untyped-def]
        console, browser, grpc_channel, settings, receiver, delivery_job):
    run = uuid.uuid4().hex[:12]
    secret, tag, tag2 = f"sk_console_{run}", f"tag-{run}", f"tag2-{run}"
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    page = _page(browser)
    _login(page, console, api_key)

    path = f"/console-headers/{tenant_id}"
    page.goto(f"{console}/endpoints")
    page.fill("#create-endpoint input[name=url]", f"{receiver.base_url}{path}")
    page.fill("#create-endpoint input[name=event_types]", "console.*")
    page.fill("#create-endpoint textarea[name=headers]", f"X-Tenant-Tag: {tag}")
    page.fill("#create-endpoint textarea[name=secret_headers]", f"Authorization: Bearer {secret}")
    page.click("#create-endpoint button")
    endpoint_id = page.inner_text("#endpoint-link").strip()
    assert secret not in page.content()

    page.goto(f"{console}/endpoints/{endpoint_id}")
    shown = page.inner_text("#custom-headers")
    assert f"X-Tenant-Tag: {tag}" in shown and "Authorization: secret (never shown)" in shown
    assert secret not in page.content()
    _shot(page, "endpoint-headers")

    page.click("#send-test")
    [ping] = receiver.wait_for(path, 1, timeout=60)
    assert ping.headers["X-Tenant-Tag"] == tag and ping.headers["Authorization"] == f"Bearer {secret}"

    # The form comes filled with the plain headers and the secret one's name only: saving keeps it.
    page.goto(f"{console}/endpoints/{endpoint_id}")
    assert page.input_value("#headers textarea[name=secret_headers]").strip() == "Authorization:"
    page.fill("#headers textarea[name=headers]", f"X-Tenant-Tag: {tag2}")
    page.click("#headers button")
    assert "custom headers saved" in page.inner_text("#flash")
    assert f"X-Tenant-Tag: {tag2}" in page.inner_text("#custom-headers")
    page.click("#send-test")
    latest = receiver.wait_for(path, 2, timeout=60)[-1]
    assert latest.headers["X-Tenant-Tag"] == tag2 and latest.headers["Authorization"] == f"Bearer {secret}"

    page.goto(f"{console}/endpoints/{endpoint_id}")
    page.fill("#headers textarea[name=headers]", "Host: evil.example.com")
    with page.expect_navigation() as nav:
        page.click("#headers button")
    assert nav.value is not None and nav.value.status == 400
    assert "'Host' is reserved" in page.inner_text("body")
    page.goto(f"{console}/endpoints/{endpoint_id}")
    assert f"X-Tenant-Tag: {tag2}" in page.inner_text("#custom-headers")  # nothing changed
    assert secret not in page.content()
