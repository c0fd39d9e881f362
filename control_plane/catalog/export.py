"""A tenant's catalog as documentation receivers can read: OpenAPI 3.1 and AsyncAPI 3.0.

Pure functions of the catalog. Every *active* type and every active version of it is described:
the payload's JSON Schema (2020-12, OpenAPI 3.1's own dialect), an example, and what every
request carries -- the Standard Webhooks headers and the signature scheme (README, receiver's
guide). Deprecated types and versions are left out: receivers should not start relying on them.

Each payload schema is embedded with an ``$id`` of its own (``urn:webhooks:TENANT:TYPE:VERSION``)
so that references inside it (``#/$defs/...``) resolve within the schema, not against the
enclosing document.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from control_plane.catalog.model import EventTypeEntry, VersionEntry
from core.event_schemas import DRAFT_2020_12

SIGNATURE_SCHEME = (
    "Standard Webhooks. The signature covers `{webhook-id}.{webhook-timestamp}.{raw body}`. "
    "`webhook-signature` holds one space-separated `v1,<base64>` (HMAC-SHA256 under the endpoint's "
    "whsec_ secret) or `v1a,<base64>` (ed25519, verified with the endpoint's whpk_ public key) per "
    "live key. Verify the raw bytes before parsing them and reject a `webhook-timestamp` more than "
    "5 minutes away; dedupe on `webhook-id` (delivery is at least once)."
)

# (name, required, description) of every request's headers.
HEADERS: tuple[tuple[str, bool, str], ...] = (
    ("webhook-id", True, "The delivery id (dlv_...), stable across retries and replays: dedupe on it."),
    ("webhook-timestamp", True, "This attempt's time, unix seconds."),
    ("webhook-signature", True, "Space-separated signatures, `v1,<base64>` (HMAC-SHA256) or `v1a,<base64>` (ed25519)."),
    ("webhook-signature-version", False, "The schemes that signed, in signature order."),
    ("webhook-key-versions", False, "The endpoint key versions that signed, in signature order."),
    ("webhook-event-type", True, "The event type."),
    ("webhook-event-id", True, "The business event's id."),
    ("webhook-schema-version", True, "The schema version of the payload (MAJOR.MINOR)."),
    ("webhook-occurred-at", True, "When the business fact happened (RFC 3339)."),
    ("webhook-object-id", False, "The business object, when the event names one."),
    ("webhook-object-version", False, "The business object's version, when the event names one."),
    ("webhook-attempt", True, "The attempt number (1 = first)."),
)

_KEY = re.compile(r"[^A-Za-z0-9_.-]")


def _active(types: Iterable[EventTypeEntry]) -> list[tuple[EventTypeEntry, VersionEntry]]:
    return [(t, v) for t in sorted(types, key=lambda t: t.name) if t.status == "active"
            for v in t.versions if v.status == "active"]


def payload_schema(tenant_id: str, t: EventTypeEntry, v: VersionEntry) -> dict[str, Any]:
    doc = {k: val for k, val in v.schema.items() if k != "$schema"}
    return {"$id": f"urn:webhooks:{tenant_id}:{t.name}:{v.version}", **doc}


def _key(*parts: str) -> str:
    return _KEY.sub("_", "_".join(parts))


def _header_schema(name: str, t: EventTypeEntry, v: VersionEntry) -> dict[str, Any]:
    if name == "webhook-event-type":
        return {"type": "string", "const": t.name}
    if name == "webhook-schema-version":
        return {"type": "string", "enum": sorted({str(v.version), f"{v.version.major}"} if v.version.minor == 0
                                                 else {str(v.version)})}
    if name in ("webhook-timestamp", "webhook-attempt", "webhook-object-version"):
        return {"type": "string", "pattern": "^[0-9]+$"}
    return {"type": "string"}


def _description(t: EventTypeEntry, v: VersionEntry) -> str:
    return f"{t.description or t.name} (schema version {v.version}).\n\nSignature: {SIGNATURE_SCHEME}"


def openapi(tenant_id: str, types: Iterable[EventTypeEntry]) -> dict[str, Any]:
    types = list(types)
    webhooks: dict[str, Any] = {}
    for t, v in _active(types):
        parameters = [{"name": name, "in": "header", "required": required, "description": text,
                       "schema": _header_schema(name, t, v)} for name, required, text in HEADERS]
        webhooks[f"{t.name}.v{v.version}"] = {"post": {
            "operationId": _key(t.name, "v" + str(v.version)),
            "summary": f"{t.name} {v.version}",
            "description": _description(t, v),
            "tags": [t.group] if t.group else [],
            "parameters": parameters,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": payload_schema(tenant_id, t, v),
                "examples": {f"example{i + 1}": {"value": ex} for i, ex in enumerate(v.examples)},
            }}},
            "responses": {
                "2XX": {"description": "Received. Any 2xx ends the delivery as succeeded."},
                "410": {"description": "Gone: the endpoint is disabled and receives nothing more."},
                "default": {"description": "408, 429 (Retry-After honoured) and 5xx are retried with backoff "
                                           "for up to 24 h; other 4xx fail the delivery."},
            },
        }}
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": DRAFT_2020_12,
        "info": {"title": f"Webhooks of {tenant_id}", "version": _doc_version(types),
                 "description": "Every event type and schema version this tenant sends. " + SIGNATURE_SCHEME},
        "webhooks": webhooks,
    }


def asyncapi(tenant_id: str, types: Iterable[EventTypeEntry]) -> dict[str, Any]:
    types = list(types)
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for t, v in _active(types):
        channel = _key(t.name)
        message = _key(t.name, "v" + str(v.version))
        messages[message] = {
            "name": f"{t.name}.v{v.version}",
            "title": f"{t.name} {v.version}",
            "summary": t.description or t.name,
            "description": _description(t, v),
            "contentType": "application/json",
            "headers": {"type": "object", "required": [n for n, req, _ in HEADERS if req],
                        "properties": {n: {**_header_schema(n, t, v), "description": text}
                                       for n, _, text in HEADERS}},
            "payload": {"schemaFormat": "application/schema+json;version=2020-12",
                        "schema": payload_schema(tenant_id, t, v)},
            "examples": [{"name": f"example{i + 1}", "payload": ex} for i, ex in enumerate(v.examples)],
            **({"tags": [{"name": t.group}]} if t.group else {}),
        }
        ch = channels.setdefault(channel, {"address": t.name, "title": t.name,
                                           "description": t.description or t.name, "messages": {}})
        ch["messages"][message] = {"$ref": f"#/components/messages/{message}"}
    for channel, ch in channels.items():
        operations[_key("receive", channel)] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": f"Your endpoint receives {ch['address']} as an HTTPS POST",
            "messages": [{"$ref": f"#/channels/{channel}/messages/{m}"} for m in ch["messages"]],
        }
    return {
        "asyncapi": "3.0.0",
        "info": {"title": f"Webhooks of {tenant_id}", "version": _doc_version(types),
                 "description": "Every event type and schema version this tenant sends, as HTTPS POSTs to "
                                "your endpoint. " + SIGNATURE_SCHEME},
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def _doc_version(types: Iterable[EventTypeEntry]) -> str:
    """Changes whenever the catalog does: the sum of the types' revisions."""
    return f"catalog-{sum(t.revision for t in types)}"

