"""The HTTP API's OpenAPI 3.1 document, generated from the same protos and routes it serves.

Every route of control_plane.httpapi.transcoding becomes an operation (operationId = the RPC's name),
every message it reaches a schema of proto3 JSON as the API writes it: proto field names, enums by
name, 64-bit integers as decimal strings, timestamps as RFC 3339, no field but the proto's
(``additionalProperties: false``: the API refuses unknown ones). The brief's five routes carry
examples. The control plane serves it at ``/v1/openapi.json``;
``python -m control_plane.httpapi.openapi_doc --out FILE`` writes it (what the client generator reads).

The webhooks a tenant's receivers get are documented by the tenant's event catalog, exported as an
OpenAPI 3.1 document of ``webhooks`` by ``GET /v1/event-catalog/export?format=openapi``; this
document links to it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor

from control_plane.endpoints.service import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from control_plane.history.deliveries import MAX_DELIVERY_PAGE
from control_plane.history.ordering import DEFAULT_KEY_PAGE, MAX_KEY_PAGE
from control_plane.httpapi.idempotency import IDEMPOTENCY_KEY_FORM
from control_plane.httpapi.problems import PROBLEM_JSON, TYPES
from control_plane.httpapi.transcoding import ETAG_FORM, Route, integer_range, query_name, routes, short_enum_names
from control_plane.rpc.api import pb
from core import identifiers
from protogen.webhooks.v1 import catalog_pb2, portal_pb2

DOCUMENT_PATH = "/v1/openapi.json"
_TIMESTAMP = "google.protobuf.Timestamp"
_FIELD_MASK = "google.protobuf.FieldMask"
_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}
_INT32 = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_SINT32,
          FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32}

# What a path parameter holds (the services refuse anything else with 400).
_PATH_PATTERNS = {"endpoint_id": identifiers.ID, "delivery_id": identifiers.ID, "tenant_id": identifiers.TENANT_ID,
                  "name": identifiers.EVENT_TYPE}

# Page sizes: 0 (or absent) is the default; above the maximum is refused.
_LIMITS = {
    "webhooks.v1.ListEndpointsRequest.page_size": (DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE),
    "webhooks.v1.ListDeliveriesRequest.page_size": (DEFAULT_PAGE_SIZE, MAX_DELIVERY_PAGE),
    "webhooks.v1.ListBlockedKeysRequest.page_size": (DEFAULT_KEY_PAGE, MAX_KEY_PAGE),
    "webhooks.v1.ListEventTypesRequest.page_size": (DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE),
}

_EXAMPLE_ENDPOINT = {
    "endpoint_id": "ep_2hKq9Xc1", "url": "https://hooks.example.com:443/in", "description": "orders",
    "event_types": ["order.created"], "metadata": {}, "status": "ENDPOINT_STATUS_ACTIVE",
    "config_version": "1", "published_version": "1",
    "signing_keys": [{"version": 1, "created_at": "2026-01-05T10:00:00Z", "signature_scheme": "v1",
                      "public_key": ""}],
    "created_at": "2026-01-05T10:00:00Z", "updated_at": "2026-01-05T10:00:00Z", "payload_mode": "full",
    "payload_fields": [], "challenge_event_id": "", "ordering_key": "", "schema_majors": [], "headers": [],
}
# Request and response examples of the brief's five routes, by operation.
EXAMPLES: dict[str, tuple[dict[str, Any] | None, dict[str, Any]]] = {
    "CreateEndpoint": (
        {"url": "https://hooks.example.com/in", "description": "orders", "event_types": ["order.created"]},
        {"endpoint": _EXAMPLE_ENDPOINT, "signing_secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
         "public_key": ""}),
    "UpdateEndpoint": (
        {"description": "orders (eu)", "rate_limit_per_s": 20},
        {**_EXAMPLE_ENDPOINT, "description": "orders (eu)", "rate_limit_per_s": 20, "config_version": "2",
         "published_version": "2"}),
    "RotateSecret": (
        {"mode": "MODE_OVERLAP", "overlap_seconds": "86400"},
        {"endpoint": {**_EXAMPLE_ENDPOINT, "config_version": "3", "published_version": "3"},
         "signing_secret": "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD", "public_key": "", "new_key_version": 2,
         "live_keys": []}),
    "ListDeliveries": (
        None,
        {"deliveries": [{"delivery_id": "dl_8Zt1", "event_id": "evt_41", "endpoint_id": "ep_2hKq9Xc1",
                         "event_type": "order.created", "status": "DELIVERY_STATUS_FAILED", "attempt_count": 8,
                         "last_http_status": 500, "created_at": "2026-01-05T10:01:00Z",
                         "updated_at": "2026-01-05T13:01:00Z"}],
         "next_cursor": "", "tier": "hot"}),
    "ReplayDelivery": (
        {"reason": "receiver fixed"},
        {"delivery_id": "dl_8Zt1", "request_id": "2f0c6a1e-replay-1"}),
}


def services() -> tuple[ServiceDescriptor, ...]:
    """The services the HTTP API serves (the routes are those of their annotated methods)."""
    return (pb.DESCRIPTOR.services_by_name["ControlPlane"],
            catalog_pb2.DESCRIPTOR.services_by_name["EventCatalog"],
            portal_pb2.DESCRIPTOR.services_by_name["Portal"])


class _Schemas:
    def __init__(self) -> None:
        self.components: dict[str, Any] = {}

    def ref(self, message: Descriptor) -> dict[str, Any]:
        name = _component_name(message)
        if name not in self.components:
            self.components[name] = {}  # placeholder: recursive messages
            self.components[name] = self.message(message)
        return {"$ref": f"#/components/schemas/{name}"}

    def message(self, message: Descriptor, leave_out: Sequence[str] = ()) -> dict[str, Any]:
        props = {f.name: self.field(f) for f in message.fields if f.name not in leave_out}
        return {"type": "object", "properties": props, "additionalProperties": False}

    def field(self, f: FieldDescriptor) -> dict[str, Any]:
        if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            return {"type": "object", "additionalProperties": self.single(f.message_type.fields_by_name["value"])}
        if f.label == FieldDescriptor.LABEL_REPEATED:
            return {"type": "array", "items": self.single(f)}
        return self.single(f)

    def single(self, f: FieldDescriptor) -> dict[str, Any]:
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            return scalar(f) if f.message_type.full_name in (_TIMESTAMP, _FIELD_MASK) else self.ref(f.message_type)
        return scalar(f)


def _component_name(message: Descriptor) -> str:
    return str(message.full_name).removeprefix("webhooks.v1.")


def scalar(f: FieldDescriptor) -> dict[str, Any]:
    """The JSON Schema of one value of a non-message field (or a timestamp, a field mask)."""
    if f.type == FieldDescriptor.TYPE_MESSAGE:
        if f.message_type.full_name == _TIMESTAMP:
            return {"type": "string", "format": "date-time"}
        return {"type": "string", "description": "comma-separated field paths"}
    if f.type == FieldDescriptor.TYPE_ENUM:
        return {"type": "string", "enum": [v.name for v in f.enum_type.values]}
    if f.type in _INT64:
        return {"type": "string", "pattern": "^-?[0-9]{1,19}$", "description": "a 64-bit integer, in decimal"}
    if f.type in _INT32:
        return {"type": "integer", "format": "int32"}
    if f.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return {"type": "number"}
    if f.type == FieldDescriptor.TYPE_BOOL:
        return {"type": "boolean"}
    if f.type == FieldDescriptor.TYPE_BYTES:
        return {"type": "string", "contentEncoding": "base64"}
    return {"type": "string"}


def _query_schema(route: Route, f: FieldDescriptor) -> dict[str, Any]:
    one = scalar(f)
    if f.type == FieldDescriptor.TYPE_ENUM:
        # The query takes the short names too (?status=failed); the document offers those.
        one = {"type": "string", "enum": short_enum_names(f)}
    limit = _LIMITS.get(str(f.full_name))
    if limit is not None:
        one = {"type": "integer", "minimum": 0, "maximum": limit[1],
               "description": f"page size, at most {limit[1]}; 0 or absent: {limit[0]}"}
    elif f.type in _INT64 or f.type in _INT32:
        low, high = integer_range(f)
        one = {"type": "integer", "minimum": low, "maximum": high}
    return {"type": "array", "items": one} if f.label == FieldDescriptor.LABEL_REPEATED else one


def _operation(route: Route, table: Sequence[Route], schemas: _Schemas) -> dict[str, Any]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True,
         "schema": {"type": "string", "pattern": f"^{_PATH_PATTERNS[name].pattern}$"}}
        for name in route.path_fields]
    for f in route.query_fields():
        params.append({"name": query_name(f), "in": "query", "required": False, "schema": _query_schema(route, f),
                       **({"style": "form", "explode": True} if f.label == FieldDescriptor.LABEL_REPEATED else {})})
    if route.verb in ("POST", "PATCH"):
        params.append({"name": "Idempotency-Key", "in": "header", "required": False,
                       "description": "the same key and request answer the first response again; "
                                      "the same key with another request is refused (422)",
                       "schema": {"type": "string", "pattern": f"^{IDEMPOTENCY_KEY_FORM.pattern}$"}})
    if route.takes_if_match():
        params.append({"name": "If-Match", "in": "header", "required": False,
                       "description": "the ETag of the endpoint as read: the change applies only to that "
                                      "config version (412 stale-version otherwise)",
                       "schema": {"type": "string", "pattern": ETAG_FORM.pattern}})
    request_example, response_example = EXAMPLES.get(route.name, (None, None))
    op: dict[str, Any] = {
        "operationId": route.name,
        "tags": [str(route.method.containing_service.name)],
        "summary": f"{route.method.containing_service.name}.{route.name} over HTTP",
        "parameters": params,
    }
    if route.body:
        if route.body == "*":
            body_schema = (schemas.message(route.request, route.path_fields) if route.path_fields
                           else schemas.ref(route.request))
        else:
            body_schema = schemas.ref(route.request.fields_by_name[route.body].message_type)
        content: dict[str, Any] = {"schema": body_schema}
        if request_example is not None:
            content["example"] = request_example
        op["requestBody"] = {"required": False, "content": {"application/json": content}}
    ok: dict[str, Any] = {"schema": schemas.ref(route.response)}
    if response_example is not None:
        ok["example"] = response_example
    success: dict[str, Any] = {"description": "the RPC's response (for a stream: its last message)",
                               "content": {"application/json": ok}}
    if route.response.full_name == "webhooks.v1.Endpoint":
        success["headers"] = {"ETag": {"description": "the endpoint's config_version, quoted",
                                       "schema": {"type": "string"}}}
    links = _links(route, table)
    if links:
        success["links"] = links
    status = "201" if route.verb == "POST" and route.name.startswith("Create") else "200"
    problem = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    op["responses"] = {status: success, "default": {"description": "an error (RFC 9457)", "content": problem}}
    if route.name == "ExportCatalog":
        op["description"] = ("The tenant's event catalog as receivers' documentation: format=openapi is an "
                             "OpenAPI 3.1 document whose `webhooks` are the tenant's event types, in "
                             "document_json.")
    return op


def _pointer_to(message: Descriptor, name: str) -> str | None:
    """Where a response holds an id of ``name``: the field itself, in a message field, or in the
    first element of a repeated one (``/deliveries/0/delivery_id``)."""
    if name in message.fields_by_name:
        return f"/{name}"
    for f in message.fields:
        if f.type != FieldDescriptor.TYPE_MESSAGE or f.message_type.GetOptions().map_entry:
            continue
        if name in f.message_type.fields_by_name and f.name != name:
            first = "/0" if f.label == FieldDescriptor.LABEL_REPEATED else ""
            return f"/{f.name}{first}/{name}"
    return None


def _links(route: Route, table: Sequence[Route]) -> dict[str, Any]:
    """OpenAPI links from this operation's answer to the operations that take an id it holds
    (a created endpoint's id to its routes; a listed delivery's to the delivery's)."""
    links: dict[str, Any] = {}
    for target in table:
        # Within one service: names alone are not enough across them (a header's name is no event type's).
        if target is route or len(target.path_fields) != 1 or target.service != route.service:
            continue
        name = target.path_fields[0]
        pointer = _pointer_to(route.response, name)
        if pointer is not None:
            links[target.name] = {"operationId": target.name, "parameters": {name: f"$response.body#{pointer}"}}
    return links


_PROBLEM = {
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "enum": [t.uri for t in TYPES.values()]},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
    },
}


def document(table: Sequence[Route], server_url: str = "") -> dict[str, Any]:
    schemas = _Schemas()
    paths: dict[str, dict[str, Any]] = {}
    for route in table:
        paths.setdefault(route.template, {})[route.verb.lower()] = _operation(route, table, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Webhooks control plane",
            "version": "v1",
            "description": (
                "The control plane's gRPC services over HTTP+JSON. Authorization: Bearer <api key> "
                "(the admin token for portal links). Errors are application/problem+json. The webhooks "
                "receivers get are documented by the tenant's event catalog: GET /v1/event-catalog/export"
                "?format=openapi answers an OpenAPI 3.1 document of them."),
        },
        "externalDocs": {"description": "The tenant's webhooks (event catalog export, OpenAPI 3.1)",
                         "url": "/v1/event-catalog/export?format=openapi"},
        "servers": [{"url": server_url or "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a tenant API key (whk_...), or the admin token"}},
            "schemas": {**dict(sorted(schemas.components.items())), "Problem": _PROBLEM},
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the HTTP API's OpenAPI 3.1 document.")
    parser.add_argument("--out", type=Path, help="file to write (default: stdout)")
    parser.add_argument("--server", default="", help="the API's base URL, e.g. http://127.0.0.1:8088")
    args = parser.parse_args(argv)
    text = json.dumps(document(routes(services()), args.server), indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
