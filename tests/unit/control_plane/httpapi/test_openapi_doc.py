"""The HTTP API's OpenAPI 3.1 document: valid against the OpenAPI 3.1 meta-schema, one operation per
route read from the protos, its examples valid against their own schemas, and the API's answers
(over the real servicers on in-memory stores) valid against the document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError
from referencing import Registry, Resource

from control_plane.domain import DeliveryStatus
from control_plane.httpapi import openapi_doc
from control_plane.httpapi import transcoding as http_transcoding
from tests.unit.control_plane.endpoints.test_control_plane_service import World, add_delivery, w  # noqa: F401 (fixture)
from tests.unit.control_plane.httpapi.test_http_api import NEW, Api, E, _principal, api  # noqa: F401 (fixture)

DOC = openapi_doc.document(http_transcoding.routes(openapi_doc.services()))


def check_against_document(schema: dict[str, Any], value: Any) -> None:
    registry: Registry = Registry().with_resource("urn:doc", Resource.from_contents(
        {"$schema": "https://json-schema.org/draft/2020-12/schema", **DOC}))
    resolved = json.loads(json.dumps(schema).replace('"#/components', '"urn:doc#/components'))
    jsonschema.Draft202012Validator(resolved, registry=registry).validate(value)


def test_the_document_is_valid_openapi_3_1() -> None:
    assert DOC["openapi"] == "3.1.0"
    validate(DOC)  # the OpenAPI 3.1 meta-schema (openapi-spec-validator picks it by the version)


def test_the_validator_does_refuse_a_broken_document() -> None:
    broken = json.loads(json.dumps(DOC))
    broken["paths"]["/v1/webhook-endpoints"]["post"]["responses"] = "none"
    with pytest.raises(OpenAPIValidationError):
        validate(broken)


def test_one_operation_per_route_named_by_its_rpc() -> None:
    table = http_transcoding.routes(openapi_doc.services())
    ops = {(verb.upper(), path): op["operationId"] for path, item in DOC["paths"].items() for verb, op in item.items()}
    assert ops == {(r.verb, r.template): r.name for r in table}
    listing = DOC["paths"]["/v1/webhook-deliveries"]["get"]["parameters"]
    assert {p["name"] for p in listing} >= {"endpoint_id", "status", "cursor", "limit"}
    limit = next(p for p in listing if p["name"] == "limit")["schema"]
    assert (limit["minimum"], limit["maximum"]) == (0, 200)
    patch = DOC["paths"]["/v1/webhook-endpoints/{endpoint_id}"]["patch"]
    assert {p["name"] for p in patch["parameters"]} >= {"If-Match", "Idempotency-Key"}


def test_the_examples_are_valid_against_their_schemas() -> None:
    seen = 0
    for item in DOC["paths"].values():
        for op in item.values():
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
            if "example" in body:
                check_against_document(body["schema"], body["example"])
                seen += 1
            for response in op["responses"].values():
                content = response.get("content", {}).get("application/json", {})
                if "example" in content:
                    check_against_document(content["schema"], content["example"])
                    seen += 1
    assert seen == 9  # the five routes of the brief; ListDeliveries has no body


def test_answers_link_to_the_operations_that_take_the_ids_they_hold() -> None:
    created = DOC["paths"]["/v1/webhook-endpoints"]["post"]["responses"]["201"]["links"]
    assert created["GetEndpoint"] == {"operationId": "GetEndpoint",
                                      "parameters": {"endpoint_id": "$response.body#/endpoint/endpoint_id"}}
    listed = DOC["paths"]["/v1/webhook-deliveries"]["get"]["responses"]["200"]["links"]
    assert listed["ReplayDelivery"]["parameters"] == {"delivery_id": "$response.body#/deliveries/0/delivery_id"}
    endpoint = DOC["paths"]["/v1/webhook-endpoints/{endpoint_id}"]["get"]["responses"]["200"]["links"]
    assert "AddSchemaVersion" not in endpoint  # a header's name is no event type's: links stay in one service


def test_the_document_links_the_catalogs_webhooks_export() -> None:
    assert DOC["externalDocs"]["url"] == "/v1/event-catalog/export?format=openapi"
    assert "/v1/event-catalog/export" in DOC["paths"]


def response_schema(verb: str, template: str, status: int) -> dict[str, Any]:
    op = DOC["paths"][template][verb.lower()]
    response = op["responses"].get(str(status)) or op["responses"]["default"]
    return dict(next(iter(response["content"].values()))["schema"])


def test_the_apis_answers_match_the_document(api: Api) -> None:  # noqa: F811
    answers: list[tuple[str, str, int, Any]] = []

    def call(verb: str, template: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, answer, _ = api.call(verb, path, body, **kw)
        answers.append((verb, template, status, answer))
        return answer

    endpoint = call("POST", E, E, NEW)["endpoint"]
    one = f"{E}/{{endpoint_id}}"
    path = f"{E}/{endpoint['endpoint_id']}"
    call("GET", one, path)
    call("PATCH", one, path, {"rate_limit_per_s": 2.5, "metadata": {"team": "x"}})
    call("POST", one + "/rotate-secret", path + "/rotate-secret", {"mode": "MODE_REVOKE_IMMEDIATELY"})
    call("GET", E, E)
    call("GET", one + "/versions", path + "/versions")
    did = add_delivery(api.w, api.w.endpoints.get(_principal(api), endpoint["endpoint_id"]), 1, DeliveryStatus.FAILED)
    call("GET", "/v1/webhook-deliveries", "/v1/webhook-deliveries", query=[("endpoint_id", endpoint["endpoint_id"])])
    call("GET", "/v1/webhook-deliveries/{delivery_id}", f"/v1/webhook-deliveries/{did}")
    call("POST", "/v1/webhook-deliveries/{delivery_id}/replay", f"/v1/webhook-deliveries/{did}/replay",
         {"reason": "fixed"})
    call("POST", one + "/recover", path + "/recover", {"reason": "fixed"})
    call("GET", one, f"{E}/ep_missing")
    call("POST", one + "/disable", path + "/disable")
    call("DELETE", one, path)
    assert [s for *_, s, _ in answers].count(404) == 1
    for verb, template, status, answer in answers:
        check_against_document(response_schema(verb, template, status), answer)


def test_the_command_writes_the_document(tmp_path: Path) -> None:
    out = tmp_path / "openapi.json"
    assert openapi_doc.main(["--out", str(out), "--server", "http://127.0.0.1:8088"]) == 0
    written = json.loads(out.read_text())
    assert written["servers"] == [{"url": "http://127.0.0.1:8088"}] and written["paths"] == DOC["paths"]
