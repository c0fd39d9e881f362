"""Schemathesis over the HTTP API's OpenAPI document, against the session's control plane on the
real stack: every route, examples, boundary ("coverage") and random inputs, valid and not, and
stateful sequences following the responses' links. Every check must hold (no 5xx, every answer as
documented: status, media type, schema, headers; schema-invalid input refused; requests without a
credential refused) but two left out on purpose: positive_data_acceptance, because the document
cannot say everything the services check (that a URL resolves to a public address, that a cursor's
signature verifies, that an event type is the tenant's); use_after_free, because a deleted
endpoint's versions stay readable by design (its audit trail: GET .../versions).

Bounded for `make test` (WEBHOOKS_API_FUZZ_EXAMPLES, default 10 per operation and phase); `make
api-fuzz` runs 500. The run's summary ("N generated, N passed") is printed and its JUnit report
written to .run/api-fuzz/. Afterwards, tenant isolation over what the run created: every id the
fuzzing tenant now owns answers another tenant 404 on every route that takes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from control_plane.httpapi import openapi_doc
from control_plane.httpapi import transcoding as http_transcoding
from core.settings import REPO_ROOT
from tests.support.helpers import new_tenant
from tests.unit.control_plane.httpapi.test_http_api import valid_body

pytestmark = pytest.mark.integration

REPORT = REPO_ROOT / ".run" / "api-fuzz"


def test_schemathesis_finds_nothing_and_tenants_stay_isolated(http_api_base, grpc_channel, settings,  # type: ignore[no-untyped-def]
                                                              receiver) -> None:
    cli = Path(sys.executable).parent / "schemathesis"
    assert cli.exists(), f"{cli} not found: make setup installs it from requirements.lock"
    _, key = new_tenant(grpc_channel, settings)
    _, other = new_tenant(grpc_channel, settings)
    examples = os.environ.get("WEBHOOKS_API_FUZZ_EXAMPLES", "10")
    REPORT.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [str(cli), "run", f"{http_api_base}{openapi_doc.DOCUMENT_PATH}", "--url", http_api_base,
         "-H", f"Authorization: Bearer {key}", "--max-examples", examples, "--seed", "1",
         "--checks", "all", "--exclude-checks", "positive_data_acceptance,use_after_free", "--request-timeout", "30",
         "--report", "junit", "--report-dir", str(REPORT), "--no-color"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=3600)
    summary = [line for line in run.stdout.splitlines() if " generated" in line or "passed" in line]
    print(f"\nschemathesis, {examples} examples per operation and phase: " + " | ".join(summary))
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]

    # The fuzzer's endpoints rarely pass the URL policy (a public HTTPS name that resolves): the
    # owner gets one the test's receiver serves, so isolation is checked on at least one.
    created = requests.post(f"{http_api_base}/v1/webhook-endpoints", timeout=30,
                            json={"url": f"{receiver.base_url}/http-fuzz", "event_types": ["http.*"]},
                            headers={"Authorization": f"Bearer {key}"})
    assert created.status_code == 201, created.text
    _isolated(http_api_base, key, other)


def _isolated(base: str, owner: str, other: str) -> None:
    mine = requests.get(f"{base}/v1/webhook-endpoints", params={"limit": 100}, timeout=30,
                        headers={"Authorization": f"Bearer {owner}"}).json()["endpoints"]
    assert mine, "the run created no endpoint: nothing to check isolation on"
    routes = [r for r in http_transcoding.routes(openapi_doc.services()) if r.path_fields == ("endpoint_id",)]
    for endpoint in mine[:10]:
        for route in routes:
            body: Any = valid_body(route.name, "dlv_x", int(time.time() * 1000))
            r = requests.request(route.verb, base + route.template.format(endpoint_id=endpoint["endpoint_id"]),
                                 json=body, headers={"Authorization": f"Bearer {other}"}, timeout=30)
            assert r.status_code == 404, (route.template, r.text)
