"""The HTTP+JSON API on the real stack: the session's in-process control plane serves it (port 0)
over Cassandra and Kafka, its own delivery job sends to the session's recording receiver, and
events enter through the session's outbox. The brief's five routes answer as the OpenAPI document
says (each answer validated against it); Idempotency-Key replays and conflicts; a PATCH with a
stale If-Match is refused and changes nothing; errors are problem+json; another tenant's ids
answer 404 on every route that takes one.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import requests

from core.records import delivery_id_for
from outbox.producer import write_event
from tests.support.faults import wait_all_reached
from tests.support.helpers import eventually, new_tenant
from tests.unit.control_plane.httpapi.test_http_api import valid_body
from tests.unit.control_plane.httpapi.test_openapi_doc import check_against_document, response_schema

pytestmark = pytest.mark.integration

E = "/v1/webhook-endpoints"
D = "/v1/webhook-deliveries"


class Http:
    def __init__(self, base: str, key: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"

    def call(self, verb: str, template: str, path: str | None = None, body: Any = None, *,
             check: bool = True, **kw: Any) -> requests.Response:
        r = self.session.request(verb, self.base + (path or template), json=body, timeout=30, **kw)
        if check:  # every answer as the document says
            assert r.headers["Content-Type"].split(";")[0] == (
                "application/json" if r.status_code < 400 else "application/problem+json"), r.text
            check_against_document(response_schema(verb, template, r.status_code), r.json())
        return r


def _tenant(grpc_channel: Any, settings: Any, http_api_base: str) -> tuple[str, Http]:
    tenant_id, key = new_tenant(grpc_channel, settings)
    return tenant_id, Http(http_api_base, key)


def test_the_briefs_five_routes_answer_as_documented(http_api_base, grpc_channel, settings, receiver,  # type: ignore[no-untyped-def]
                                                    relay, delivery_job) -> None:
    tenant_id, http = _tenant(grpc_channel, settings, http_api_base)
    path = f"/http-api/{tenant_id}"
    created = http.call("POST", E, body={"url": f"{receiver.base_url}{path}", "event_types": ["http.*"],
                                         "description": "over HTTP"},
                        headers={"Idempotency-Key": uuid.uuid4().hex})
    assert created.status_code == 201, created.text
    endpoint = created.json()["endpoint"]
    one = f"{E}/{endpoint['endpoint_id']}"

    with relay.connect() as conn:
        event_id = write_event(conn, tenant_id, "http.invoice_paid", {"n": 1})
    delivery_id = delivery_id_for(event_id, endpoint["endpoint_id"])
    wait_all_reached(receiver, {delivery_id}, timeout=90)

    def listed() -> list[Any] | None:
        r = http.call("GET", D, params={"endpoint_id": endpoint["endpoint_id"], "status": "succeeded",
                                        "limit": 10})
        assert r.status_code == 200, r.text
        return [d for d in r.json()["deliveries"] if d["delivery_id"] == delivery_id] or None

    assert eventually(listed, timeout=30, what="the delivery listed succeeded")[0]["event_id"] == event_id

    replayed = http.call("POST", f"{D}/{{delivery_id}}/replay", f"{D}/{delivery_id}/replay",
                         {"reason": "receiver fixed"}, headers={"Idempotency-Key": "replay-" + uuid.uuid4().hex})
    assert replayed.status_code == 200 and replayed.json()["delivery_id"] == delivery_id, replayed.text
    eventually(lambda: [r for r in receiver.requests(path) if r.webhook_id == delivery_id][1:] or None,
               timeout=60, what="the replayed attempt")

    etag = http.call("GET", f"{E}/{{endpoint_id}}", one).headers["ETag"]
    patched = http.call("PATCH", f"{E}/{{endpoint_id}}", one, {"description": "changed over HTTP"},
                        headers={"If-Match": etag})
    assert patched.status_code == 200 and patched.json()["description"] == "changed over HTTP", patched.text
    assert patched.headers["ETag"] == f'"{int(etag.strip(chr(34))) + 1}"'

    rotated = http.call("POST", f"{E}/{{endpoint_id}}/rotate-secret", f"{one}/rotate-secret", {})
    assert rotated.status_code == 200 and rotated.json()["new_key_version"] == 2, rotated.text
    assert rotated.json()["signing_secret"].startswith("whsec_")


def test_an_idempotency_key_replays_the_first_answer_and_refuses_another_request(  # type: ignore[no-untyped-def]
        http_api_base, grpc_channel, settings, receiver) -> None:
    _, http = _tenant(grpc_channel, settings, http_api_base)
    body = {"url": f"{receiver.base_url}/http-idem", "event_types": ["http.*"]}
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = http.call("POST", E, body=body, headers=key)
    again = http.call("POST", E, body=body, headers=key)
    assert first.status_code == again.status_code == 201 and first.json() == again.json()
    assert again.headers["Idempotency-Replayed"] == "true"
    other = http.call("POST", E, body={**body, "description": "another"}, headers=key)
    assert other.status_code == 422 and other.json()["type"] == "/v1/problems/idempotency-key-reused", other.text
    assert len(http.call("GET", E).json()["endpoints"]) == 1


def test_a_patch_with_a_stale_if_match_is_refused_and_changes_nothing(  # type: ignore[no-untyped-def]
        http_api_base, grpc_channel, settings, receiver) -> None:
    _, http = _tenant(grpc_channel, settings, http_api_base)
    endpoint = http.call("POST", E, body={"url": f"{receiver.base_url}/http-etag", "event_types": ["http.*"]}
                         ).json()["endpoint"]
    one = f"{E}/{endpoint['endpoint_id']}"
    stale = http.call("GET", f"{E}/{{endpoint_id}}", one).headers["ETag"]
    assert http.call("PATCH", f"{E}/{{endpoint_id}}", one, {"description": "first"},
                     headers={"If-Match": stale}).status_code == 200
    lost = http.call("PATCH", f"{E}/{{endpoint_id}}", one, {"description": "lost update"},
                     headers={"If-Match": stale})
    assert lost.status_code == 412 and lost.json()["type"] == "/v1/problems/stale-version", lost.text
    assert http.call("GET", f"{E}/{{endpoint_id}}", one).json()["description"] == "first"


def test_errors_are_problem_json(http_api_base, grpc_channel, settings, receiver) -> None:  # type: ignore[no-untyped-def]
    _, http = _tenant(grpc_channel, settings, http_api_base)
    missing = http.call("GET", f"{E}/{{endpoint_id}}", f"{E}/ep_missing")
    assert missing.status_code == 404 and missing.json()["type"] == "/v1/problems/not-found"
    bad = http.call("POST", E, body={"url": "ftp://nowhere", "event_types": ["x"]})
    assert bad.status_code == 400 and bad.json()["type"] == "/v1/problems/invalid-argument"
    assert "url" in bad.json()["detail"]
    anonymous = requests.get(http_api_base + E, timeout=30)
    assert anonymous.status_code == 401 and anonymous.json()["type"] == "/v1/problems/unauthenticated"
    endpoint = http.call("POST", E, body={"url": f"{receiver.base_url}/http-problems", "event_types": ["x"]})
    assert endpoint.status_code == 201, endpoint.text
    forged = http.call("GET", D, params={"endpoint_id": endpoint.json()["endpoint"]["endpoint_id"],
                                         "cursor": "forged.AAAA"})
    assert forged.status_code == 400 and "cursor" in forged.json()["detail"]


def test_another_tenants_ids_answer_404(http_api_base, grpc_channel, settings, receiver, relay,  # type: ignore[no-untyped-def]
                                        delivery_job) -> None:
    tenant_id, alice = _tenant(grpc_channel, settings, http_api_base)
    _, bob = _tenant(grpc_channel, settings, http_api_base)
    path = f"/http-isolation/{tenant_id}"
    endpoint = alice.call("POST", E, body={"url": f"{receiver.base_url}{path}", "event_types": ["http.*"]}
                          ).json()["endpoint"]
    with relay.connect() as conn:
        event_id = write_event(conn, tenant_id, "http.isolated", {"n": 1})
    delivery_id = delivery_id_for(event_id, endpoint["endpoint_id"])
    wait_all_reached(receiver, {delivery_id}, timeout=90)
    ids = {"endpoint_id": endpoint["endpoint_id"], "delivery_id": delivery_id}
    from control_plane.httpapi import openapi_doc
    from control_plane.httpapi import transcoding as http_transcoding

    tried = 0
    for route in http_transcoding.routes(openapi_doc.services()):
        if not set(route.path_fields) <= ids.keys() or not route.path_fields:
            continue
        path_ = route.template.format(**ids)
        r = bob.call(route.verb, route.template, path_, valid_body(route.name, delivery_id, int(time.time() * 1000)))
        assert (r.status_code, r.json()["type"]) == (404, "/v1/problems/not-found"), (route.template, r.text)
        tried += 1
    assert tried >= 15
    listing = bob.call("GET", D, params={"endpoint_id": endpoint["endpoint_id"]})
    assert listing.status_code == 404, listing.text
    assert alice.call("GET", f"{E}/{{endpoint_id}}", f"{E}/{endpoint['endpoint_id']}").status_code == 200
