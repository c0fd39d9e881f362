"""The web console on a free port and a headless Debian Chromium, for the console's browser tests
(tests/integration/test_console*.py): fixtures of one plugin, so each module gets its own
console and browser without importing another test module for them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, sync_playwright

from control_plane.console import serve
from core.settings import REPO_ROOT

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = REPO_ROOT / ".run" / "console"


@pytest.fixture(scope="module")
def console(settings, control_plane_server) -> Iterator[str]:  # type: ignore[no-untyped-def]
    web = serve(settings, control_plane_server.console, port=0)
    yield f"http://127.0.0.1:{web.port}"
    web.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        yield b
        b.close()
