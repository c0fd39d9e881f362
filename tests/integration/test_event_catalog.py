"""The event-type catalog over gRPC against the real Cassandra: an in-process control plane on a
keyspace of its own (like test_control_plane.py). Delivery history for the deprecation report
is written the way the job writes it (events + endpoint_deliveries), so no job is needed."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import grpc
import psycopg
import pytest
from cassandra.cluster import Session
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from jsonschema.validators import Draft202012Validator  # type: ignore[import-untyped]
from openapi_spec_validator import validate as validate_openapi
from psycopg import sql
from psycopg.conninfo import make_conninfo

from control_plane.catalog.store import CassandraCatalogStore
from control_plane.cli import endpoints as endpoints_cli
from control_plane.publishing.catalog import TYPE, Unpublished
from control_plane.rpc.api import pb, rpc
from control_plane.rpc.catalog_api import cpb, crpc
from control_plane.server import ControlPlaneServer, build
from core.history_buckets import bucket_of
from core.records import (
    CatalogSettingsRecord,
    CatalogTypeRecord,
    SchemaPinsRecord,
    catalog_settings_key,
    catalog_type_key,
    delivery_id_for,
    parse_endpoint_topic_value,
    schema_pins_key,
)
from core.settings import Settings
from outbox.catalog_client import GrpcCatalog
from outbox.migrate import apply_migrations, ensure_database
from outbox.producer import OutboxError, write_event
from outbox.schemas import SchemaGuard
from stack.isolation import keyspace_session
from tests.integration.test_control_plane import consume, wait_for
from tests.support.asyncapi import asyncapi_3_errors
from tests.support.helpers import auth

pytestmark = pytest.mark.integration

HOOK_URL = "https://127.0.0.1/hook"

V1 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"money": {"type": "object", "properties": {"amount": {"type": "integer"},
                                                         "currency": {"type": "string"}},
                        "required": ["amount", "currency"]}},
    "properties": {"id": {"type": "string"}, "total": {"$ref": "#/$defs/money"},
                   "status": {"type": "string", "enum": ["open", "paid"]}},
    "required": ["id", "total"],
}
EXAMPLE = {"id": "inv_1", "total": {"amount": 4200, "currency": "EUR"}, "status": "paid"}


@dataclass
class Stack:
    server: ControlPlaneServer
    channel: grpc.Channel
    settings: Settings
    session: Session

    @property
    def catalog(self) -> crpc.EventCatalogStub:
        return crpc.EventCatalogStub(self.channel)

    @property
    def admin(self) -> rpc.AdminStub:
        return rpc.AdminStub(self.channel)

    def admin_md(self) -> list[tuple[str, str]]:
        return auth(self.settings.control_plane.admin_token.get_secret_value())


@pytest.fixture(scope="module")
def stack(settings: Settings, kafka_bootstrap: str) -> Iterator[Stack]:
    cassandra = settings.cassandra.model_copy(update={"keyspace": settings.cassandra.keyspace + "_cat"})
    local = settings.model_copy(update={"cassandra": cassandra})
    with keyspace_session(local) as session:
        server = build(local, session, port=0)
        server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        grpc.channel_ready_future(channel).result(timeout=10)
        yield Stack(server, channel, local, session)
        channel.close()
        server.stop(grace_s=2)


@dataclass
class Tenant:
    tenant_id: str
    key: str
    key_id: str

    @property
    def md(self) -> list[tuple[str, str]]:
        return auth(self.key)


def new_tenant(stack: Stack, writer: bool = True, read_only: bool = False) -> Tenant:
    tenant_id = "cat-" + uuid.uuid4().hex[:12]
    stack.admin.CreateTenant(pb.CreateTenantRequest(tenant_id=tenant_id, name="it"), metadata=stack.admin_md())
    issued = stack.admin.CreateApiKey(pb.CreateApiKeyRequest(tenant_id=tenant_id, read_only=read_only),
                                      metadata=stack.admin_md())
    if writer:
        stack.catalog.SetCatalogWriter(cpb.SetCatalogWriterRequest(tenant_id=tenant_id, key_id=issued.key_id,
                                                                   allowed=True), metadata=stack.admin_md())
    return Tenant(tenant_id, issued.api_key, issued.key_id)


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def add_version(stack: Stack, t: Tenant, name: str, version: str, schema: dict[str, Any],
                examples: list[Any]) -> Any:
    return stack.catalog.AddSchemaVersion(cpb.AddSchemaVersionRequest(
        name=name, version=version, schema_json=json.dumps(schema), examples_json=[json.dumps(e) for e in examples]),
        metadata=t.md)


def create_type(stack: Stack, t: Tenant, name: str, **kw: str) -> Any:
    return stack.catalog.CreateEventType(cpb.CreateEventTypeRequest(name=name, **kw), metadata=t.md)


def test_types_and_versions_are_created_read_and_listed(stack: Stack) -> None:
    t = new_tenant(stack)
    created = create_type(stack, t, "invoice.paid", description="An invoice was paid", group="billing")
    assert (created.name, created.status, created.enforcement) == ("invoice.paid", "active", "reject")
    add_version(stack, t, "invoice.paid", "1", V1, [EXAMPLE])
    create_type(stack, t, "invoice.voided")

    got = stack.catalog.GetEventType(cpb.GetEventTypeRequest(name="invoice.paid"), metadata=t.md)
    assert [v.version for v in got.versions] == ["1.0"]
    assert json.loads(got.versions[0].schema_json) == V1
    assert [json.loads(e) for e in got.versions[0].examples_json] == [EXAMPLE]
    assert got.versions[0].created_by == t.key_id

    first = stack.catalog.ListEventTypes(cpb.ListEventTypesRequest(page_size=1), metadata=t.md)
    assert [e.name for e in first.event_types] == ["invoice.paid"] and first.next_cursor
    assert first.event_types[0].versions[0].schema_json == ""  # listings carry no documents
    second = stack.catalog.ListEventTypes(cpb.ListEventTypesRequest(page_size=1, cursor=first.next_cursor),
                                          metadata=t.md)
    assert [e.name for e in second.event_types] == ["invoice.voided"] and not second.next_cursor
    forged = first.next_cursor[:-2] + ("AA" if not first.next_cursor.endswith("AA") else "BB")
    assert rpc_error(lambda: stack.catalog.ListEventTypes(cpb.ListEventTypesRequest(cursor=forged), metadata=t.md)
                     ).code() == grpc.StatusCode.INVALID_ARGUMENT

    whole = stack.catalog.GetCatalog(cpb.GetCatalogRequest(), metadata=t.md)
    assert [e.name for e in whole.event_types] == ["invoice.paid", "invoice.voided"]
    assert json.loads(whole.event_types[0].versions[0].schema_json) == V1


def test_an_incompatible_version_within_a_major_is_refused_naming_the_pointer(stack: Stack) -> None:
    t = new_tenant(stack)
    create_type(stack, t, "invoice.paid")
    add_version(stack, t, "invoice.paid", "1.0", V1, [EXAMPLE])
    renamed = json.loads(json.dumps(V1))
    renamed["properties"]["state"] = renamed["properties"].pop("status")
    err = rpc_error(lambda: add_version(stack, t, "invoice.paid", "1.1", renamed, [EXAMPLE]))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "/properties/status" in err.details() and "2.0" in err.details()
    narrowed = json.loads(json.dumps(V1))
    narrowed["properties"]["status"]["enum"] = ["paid"]
    err = rpc_error(lambda: add_version(stack, t, "invoice.paid", "1.1", narrowed, [EXAMPLE]))
    assert "/properties/status/enum" in err.details()
    required = {**V1, "required": ["id", "total", "status"]}
    assert "/properties/status" in rpc_error(
        lambda: add_version(stack, t, "invoice.paid", "1.1", required, [EXAMPLE])).details()

    additive = json.loads(json.dumps(V1))
    additive["properties"]["status"]["enum"] = ["open", "paid", "void"]
    typed_note = json.loads(json.dumps(additive))
    typed_note["properties"]["note"] = {"type": "string"}  # V1 is open: a 1.0 event may carry "note": 5
    assert "/properties/note" in rpc_error(
        lambda: add_version(stack, t, "invoice.paid", "1.1", typed_note, [EXAMPLE])).details()
    additive["properties"]["note"] = {"description": "free text, any JSON value"}
    add_version(stack, t, "invoice.paid", "1.1", additive, [EXAMPLE])
    done = add_version(stack, t, "invoice.paid", "2.0", renamed, [{**EXAMPLE, "state": "open"}])
    assert [v.version for v in done.versions] == ["1.0", "1.1", "2.0"]
    # The same version again with the same document is a retry; with another one, refused.
    assert add_version(stack, t, "invoice.paid", "2.0", renamed, [{**EXAMPLE, "state": "open"}]).versions
    assert rpc_error(lambda: add_version(stack, t, "invoice.paid", "2", V1, [EXAMPLE])).code() \
        == grpc.StatusCode.FAILED_PRECONDITION


def test_documents_and_examples_are_checked(stack: Stack) -> None:
    t = new_tenant(stack)
    create_type(stack, t, "order.created")
    err = rpc_error(lambda: add_version(stack, t, "order.created", "1", V1, [{"id": "o", "total": {"amount": "x"}}]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "/total" in err.details()
    err = rpc_error(lambda: add_version(stack, t, "order.created", "1", {"type": "objekt"}, [{}]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "/type" in err.details()
    assert rpc_error(lambda: add_version(stack, t, "order.created", "1", V1, [])).code() \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_error(lambda: add_version(stack, t, "order.created", "v1", V1, [EXAMPLE])).code() \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_error(lambda: create_type(stack, t, "webhook.ping")).code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rpc_error(lambda: create_type(stack, t, "Order.Created")).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_writing_needs_the_catalog_permission_or_the_admin_token(stack: Stack) -> None:
    t = new_tenant(stack, writer=False)
    assert rpc_error(lambda: create_type(stack, t, "invoice.paid")).code() == grpc.StatusCode.PERMISSION_DENIED
    admin = stack.catalog.CreateEventType(cpb.CreateEventTypeRequest(tenant_id=t.tenant_id, name="invoice.paid"),
                                          metadata=stack.admin_md())
    assert admin.updated_by == "admin"
    assert rpc_error(lambda: stack.catalog.CreateEventType(cpb.CreateEventTypeRequest(name="invoice.x"),
                                                           metadata=stack.admin_md())).code() \
        == grpc.StatusCode.INVALID_ARGUMENT  # the admin must name the tenant
    # Reading needs only the tenant's key.
    assert stack.catalog.GetEventType(cpb.GetEventTypeRequest(name="invoice.paid"), metadata=t.md).name
    stack.catalog.SetCatalogWriter(cpb.SetCatalogWriterRequest(tenant_id=t.tenant_id, key_id=t.key_id, allowed=True),
                                   metadata=stack.admin_md())
    updated = stack.catalog.UpdateEventType(cpb.UpdateEventTypeRequest(
        name="invoice.paid", enforcement="warn", description="paid", update_fields=["enforcement", "description"]),
        metadata=t.md)
    assert (updated.enforcement, updated.description, updated.updated_by) == ("warn", "paid", t.key_id)
    # Only the admin grants; a granted key cannot grant.
    assert rpc_error(lambda: stack.catalog.SetCatalogWriter(cpb.SetCatalogWriterRequest(
        tenant_id=t.tenant_id, key_id=t.key_id, allowed=True), metadata=t.md)).code() \
        == grpc.StatusCode.PERMISSION_DENIED
    stack.catalog.SetCatalogWriter(cpb.SetCatalogWriterRequest(tenant_id=t.tenant_id, key_id=t.key_id,
                                                               allowed=False), metadata=stack.admin_md())
    assert rpc_error(lambda: create_type(stack, t, "invoice.sent")).code() == grpc.StatusCode.PERMISSION_DENIED


def test_another_tenants_key_gets_not_found(stack: Stack) -> None:
    a, b = new_tenant(stack), new_tenant(stack)
    create_type(stack, a, "invoice.paid")
    add_version(stack, a, "invoice.paid", "1", V1, [EXAMPLE])
    for request in (cpb.GetEventTypeRequest(name="invoice.paid"),
                    cpb.GetEventTypeRequest(tenant_id=a.tenant_id, name="invoice.paid")):
        assert rpc_error(lambda r=request: stack.catalog.GetEventType(r, metadata=b.md)).code() \
            == grpc.StatusCode.NOT_FOUND
    assert rpc_error(lambda: stack.catalog.GetCatalog(cpb.GetCatalogRequest(tenant_id=a.tenant_id), metadata=b.md)
                     ).code() == grpc.StatusCode.NOT_FOUND
    assert rpc_error(lambda: add_version(stack, b, "invoice.paid", "1.1", V1, [EXAMPLE])).code() \
        == grpc.StatusCode.NOT_FOUND
    assert list(stack.catalog.GetCatalog(cpb.GetCatalogRequest(), metadata=b.md).event_types) == []


def test_unknown_types_setting_defaults_by_tenant_age(stack: Stack) -> None:
    fresh = new_tenant(stack)
    settings = stack.catalog.GetCatalog(cpb.GetCatalogRequest(), metadata=fresh.md).settings
    assert (settings.unknown_types, settings.is_default) == ("reject", True)
    changed = stack.catalog.SetCatalogSettings(cpb.SetCatalogSettingsRequest(unknown_types="warn"), metadata=fresh.md)
    assert (changed.unknown_types, changed.is_default) == ("warn", False)
    # A tenant that existed before the catalog was introduced in this keyspace defaults to warn.
    old = new_tenant(stack)
    stack.session.execute("UPDATE tenants SET created_at = %s WHERE tenant_id = %s",
                          (datetime(2020, 1, 1, tzinfo=UTC), old.tenant_id))
    assert stack.catalog.GetCatalog(cpb.GetCatalogRequest(), metadata=old.md).settings.unknown_types == "warn"


def _stamp(ms: int) -> Timestamp:
    s = Timestamp()
    s.FromMilliseconds(ms)
    return s


def _received(stack: Stack, tenant_id: str, endpoint_id: str, event_type: str, schema_version: str,
              at_ms: int) -> None:
    """One delivery as the job records it: the event row and the endpoint's delivery index."""
    event_id = f"evt_{uuid.uuid4().hex}"
    did = delivery_id_for(event_id, endpoint_id)
    at = datetime.fromtimestamp(at_ms / 1000, tz=UTC)
    stack.session.execute(
        "INSERT INTO events (event_id, tenant_id, event_type, schema_version, occurred_at, ingested_at) "
        "VALUES (%s, %s, %s, %s, %s, %s)", (event_id, tenant_id, event_type, schema_version, at, at))
    stack.session.execute(
        "INSERT INTO endpoint_deliveries (tenant_id, endpoint_id, day, bucket, created_at, delivery_id, event_id, "
        "event_type, status, attempt_count, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'succeeded', 1, %s)",
        (tenant_id, endpoint_id, at.date(), bucket_of(did), at, did, event_id, event_type, at))


def test_deprecation_lists_the_endpoints_that_received_the_version_in_the_last_week(stack: Stack) -> None:
    t = new_tenant(stack)
    create_type(stack, t, "invoice.paid")
    add_version(stack, t, "invoice.paid", "1", V1, [EXAMPLE])
    add_version(stack, t, "invoice.paid", "2", V1, [EXAMPLE])
    create_type(stack, t, "order.created")
    api = rpc.ControlPlaneStub(stack.channel)
    ids = [api.CreateEndpoint(pb.CreateEndpointRequest(url=HOOK_URL, event_types=[f]), metadata=t.md)
           .endpoint.endpoint_id for f in ("invoice.*", "invoice.paid", "invoice.paid", "order.*")]
    now = int(time.time() * 1000)
    _received(stack, t.tenant_id, ids[0], "invoice.paid", "1", now - 2 * 24 * 3600 * 1000)   # v1 two days ago
    _received(stack, t.tenant_id, ids[0], "invoice.paid", "2.0", now - 60_000)
    _received(stack, t.tenant_id, ids[1], "invoice.paid", "2", now - 60_000)                  # v2 only
    _received(stack, t.tenant_id, ids[2], "invoice.paid", "1.0", now - 8 * 24 * 3600 * 1000)  # v1, 8 days ago
    _received(stack, t.tenant_id, ids[3], "order.created", "1", now - 60_000)

    sunset = now + 30 * 24 * 3600 * 1000
    done = stack.catalog.DeprecateEventType(cpb.DeprecateEventTypeRequest(
        name="invoice.paid", version="1", sunset_at=_stamp(sunset)), metadata=t.md)
    assert [(r.endpoint_id, r.last_delivery_at.ToMilliseconds() // 1000)
            for r in done.recent_receivers] == [(ids[0], (now - 2 * 24 * 3600 * 1000) // 1000)]
    assert not done.scan_truncated
    v1 = done.event_type.versions[0]
    assert (v1.version, v1.status, v1.sunset_at.ToMilliseconds()) == ("1.0", "deprecated", sunset)
    assert done.event_type.status == "active"

    whole = stack.catalog.DeprecateEventType(cpb.DeprecateEventTypeRequest(
        name="invoice.paid", sunset_at=_stamp(sunset)), metadata=t.md)
    assert sorted(r.endpoint_id for r in whole.recent_receivers) == sorted(ids[:2])
    assert whole.event_type.status == "deprecated"


def test_exports_validate_and_their_examples_match_their_schemas(stack: Stack) -> None:
    t = new_tenant(stack)
    create_type(stack, t, "invoice.paid", description="An invoice was paid", group="billing")
    add_version(stack, t, "invoice.paid", "1", V1, [EXAMPLE])
    v2 = {**V1, "required": ["id", "total", "status"]}
    add_version(stack, t, "invoice.paid", "2", v2, [EXAMPLE])
    create_type(stack, t, "invoice.old")
    add_version(stack, t, "invoice.old", "1", V1, [EXAMPLE])
    stack.catalog.DeprecateEventType(cpb.DeprecateEventTypeRequest(name="invoice.old", sunset_at=_stamp(0)),
                                     metadata=t.md)

    doc = json.loads(stack.catalog.ExportCatalog(cpb.ExportCatalogRequest(format="openapi"),
                                                 metadata=t.md).document_json)
    validate_openapi(doc)  # raises if the document is not valid OpenAPI 3.1
    # deprecated types left out; the platform's own operational events (webhooks.*) are listed too
    assert sorted(w for w in doc["webhooks"] if not w.startswith("webhooks.")) == [
        "invoice.paid.v1.0", "invoice.paid.v2.0"]
    assert "webhooks.endpoint.disabled.v1.0" in doc["webhooks"]
    post = doc["webhooks"]["invoice.paid.v2.0"]["post"]
    content = post["requestBody"]["content"]["application/json"]
    schema, example = content["schema"], content["examples"]["example1"]["value"]
    validator = Draft202012Validator(schema)
    assert validator.is_valid(example)  # the $ref into $defs resolves inside the embedded schema
    assert not validator.is_valid({**example, "total": {"amount": "x", "currency": "EUR"}})
    assert not validator.is_valid({"id": "inv_1", "total": {"amount": 1, "currency": "EUR"}})  # v2 needs status
    headers = {p["name"]: p for p in post["parameters"]}
    assert {"webhook-id", "webhook-timestamp", "webhook-signature"} <= {n for n, p in headers.items() if p["required"]}
    assert "{webhook-id}.{webhook-timestamp}" in post["description"]

    # AsyncAPI 3.0: valid under the official JSON Schema (fetched by make setup); beyond what a
    # schema can say, every reference resolves, every message is reachable from a receive
    # operation, and the example validates against the payload schema.
    api = json.loads(stack.catalog.ExportCatalog(cpb.ExportCatalogRequest(format="asyncapi"),
                                                 metadata=t.md).document_json)
    assert asyncapi_3_errors(api) == []
    assert api["asyncapi"] == "3.0.0" and {"title", "version"} <= set(api["info"])
    assert {c for c in api["channels"] if not c.startswith("webhooks.")} == {"invoice.paid"}
    assert api["channels"]["invoice.paid"]["address"] == "invoice.paid"
    for ref in _refs(api):
        assert _resolve(api, ref) is not None, ref
    [op] = [o for o in api["operations"].values() if o["channel"]["$ref"] == "#/channels/invoice.paid"]
    assert op["action"] == "receive" and len(op["messages"]) == 2
    message = api["components"]["messages"]["invoice.paid_v2.0"]
    assert message["payload"]["schemaFormat"] == "application/schema+json;version=2020-12"
    assert Draft202012Validator(message["payload"]["schema"]).is_valid(message["examples"][0]["payload"])
    assert "webhook-signature" in message["headers"]["required"]


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/") and "$defs" not in node["$ref"]:
            yield node["$ref"]
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def _resolve(doc: Any, ref: str) -> Any:
    node = doc
    for token in ref[2:].split("/"):
        node = node.get(token.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
    return node


def test_the_catalog_service_is_healthy_and_reflected(stack: Stack) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    status = health_pb2_grpc.HealthStub(stack.channel).Check(
        health_pb2.HealthCheckRequest(service="webhooks.v1.EventCatalog"), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING
    [answer] = list(reflection_pb2_grpc.ServerReflectionStub(stack.channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
    assert "webhooks.v1.EventCatalog" in {s.name for s in answer.list_services_response.service}


@pytest.fixture(scope="module")
def outbox_dsn(settings: Settings) -> Iterator[str]:
    """An outbox table in a database of its own (no replication slot: nothing streams it)."""
    name = f"it_catalog_{uuid.uuid4().hex[:8]}"
    dsn = make_conninfo(settings.outbox.dsn, dbname=name)
    ensure_database(dsn)
    with psycopg.connect(dsn) as conn:
        apply_migrations(conn)
    yield dsn
    with psycopg.connect(make_conninfo(dsn, dbname="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_the_producer_refuses_an_invalid_payload_before_commit(stack: Stack, outbox_dsn: str) -> None:
    t = new_tenant(stack)
    create_type(stack, t, "invoice.paid")
    add_version(stack, t, "invoice.paid", "1", V1, [EXAMPLE])
    source = GrpcCatalog(f"127.0.0.1:{stack.server.port}", t.key, insecure=True)
    schemas = SchemaGuard(source)
    try:
        with psycopg.connect(outbox_dsn) as conn:
            good = write_event(conn, t.tenant_id, "invoice.paid", EXAMPLE, schema_version="1", schemas=schemas)
            with pytest.raises(OutboxError, match="/total/amount"):
                write_event(conn, t.tenant_id, "invoice.paid", {**EXAMPLE, "total": {"amount": "x", "currency": "E"}},
                            schema_version="1", schemas=schemas)
            with pytest.raises(OutboxError, match="not in the catalog"):  # a new tenant rejects unknown types
                write_event(conn, t.tenant_id, "invoice.sent", EXAMPLE, schema_version="1", schemas=schemas)
            # A version added after the producer cached the catalog is usable by the next event
            # (misses refetch at most once a second, and the invoice.sent miss just did).
            time.sleep(1.1)
            add_version(stack, t, "invoice.paid", "2", {**V1, "required": ["id"]}, [{"id": "inv_2"}])
            newer = write_event(conn, t.tenant_id, "invoice.paid", {"id": "inv_2"}, schema_version="2",
                                schemas=schemas)
        with psycopg.connect(outbox_dsn) as conn:
            rows = conn.execute("SELECT event_id, schema_version FROM webhook_outbox WHERE tenant_id = %s "
                                "ORDER BY event_id", (t.tenant_id,)).fetchall()
    finally:
        source.close()
    assert rows == sorted([(good, "1"), (newer, "2")])


def test_catalog_changes_and_pins_reach_the_endpoints_topic(stack: Stack) -> None:
    t = new_tenant(stack)
    create_type(stack, t, "invoice.paid", enforcement="warn")
    add_version(stack, t, "invoice.paid", "1", V1, [EXAMPLE])
    topic = stack.settings.kafka.endpoints_topic

    def latest(key: str, count: int = 1) -> object:
        found = consume(stack, topic, lambda k, _v: k == key.encode(), count=count)  # type: ignore[arg-type]
        return parse_endpoint_topic_value(found[-1][1])

    kind = latest(catalog_type_key(t.tenant_id, "invoice.paid"), count=2)  # created, then the version
    assert isinstance(kind, CatalogTypeRecord)
    assert (kind.enforcement, list(kind.versions), kind.versions["1.0"]) == ("warn", ["1.0"], V1)
    settings = latest(catalog_settings_key(t.tenant_id))
    assert isinstance(settings, CatalogSettingsRecord) and settings.unknown_types == "reject"

    api = rpc.ControlPlaneStub(stack.channel)
    endpoint_id = api.CreateEndpoint(pb.CreateEndpointRequest(url=HOOK_URL, event_types=["invoice.*"]),
                                     metadata=t.md).endpoint.endpoint_id
    pinned = stack.catalog.SetEndpointSchemaMajors(cpb.SetEndpointSchemaMajorsRequest(
        endpoint_id=endpoint_id, schema_majors=[2, 2]), metadata=t.md)
    assert list(pinned.schema_majors) == [2]
    pins = latest(schema_pins_key(endpoint_id))
    assert isinstance(pins, SchemaPinsRecord) and (pins.tenant_id, pins.schema_majors) == (t.tenant_id, (2,))
    other = new_tenant(stack)
    assert rpc_error(lambda: stack.catalog.SetEndpointSchemaMajors(cpb.SetEndpointSchemaMajorsRequest(
        endpoint_id=endpoint_id, schema_majors=[1]), metadata=other.md)).code() == grpc.StatusCode.NOT_FOUND
    reader = new_tenant(stack, writer=False, read_only=True)
    assert rpc_error(lambda: stack.catalog.SetEndpointSchemaMajors(cpb.SetEndpointSchemaMajorsRequest(
        endpoint_id=endpoint_id, schema_majors=[1]), metadata=reader.md)).code() \
        == grpc.StatusCode.PERMISSION_DENIED


def test_a_subscription_filter_matching_no_catalogued_type_is_refused_with_close_names(stack: Stack) -> None:
    t = new_tenant(stack)
    api = rpc.ControlPlaneStub(stack.channel)
    # No catalog yet: any filter, as before the catalog.
    endpoint_id = api.CreateEndpoint(pb.CreateEndpointRequest(url=HOOK_URL, event_types=["invoice.payed"]),
                                     metadata=t.md).endpoint.endpoint_id
    create_type(stack, t, "invoice.paid")
    err = rpc_error(lambda: api.CreateEndpoint(pb.CreateEndpointRequest(url=HOOK_URL, event_types=["invoice.payed"]),
                                               metadata=t.md))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "close: invoice.paid" in err.details()
    update = pb.UpdateEndpointRequest(endpoint_id=endpoint_id, endpoint=pb.Endpoint(event_types=["invoices.*"]),
                                      update_mask=FieldMask(paths=["event_types"]))
    err = rpc_error(lambda: api.UpdateEndpoint(update, metadata=t.md))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "invoice.*" in err.details()
    for filters in (["invoice.paid"], ["invoice.*"], ["*"]):
        assert api.CreateEndpoint(pb.CreateEndpointRequest(url=HOOK_URL, event_types=filters), metadata=t.md).endpoint


def test_an_endpoint_is_pinned_on_create_and_update_and_get_shows_it(stack: Stack) -> None:
    t = new_tenant(stack, writer=False)  # pins need a read-write key, not catalog writing
    api = rpc.ControlPlaneStub(stack.channel)
    topic = stack.settings.kafka.endpoints_topic

    def published(endpoint_id: str, count: int) -> tuple[int, ...]:
        found = consume(stack, topic, lambda k, _v: k == schema_pins_key(endpoint_id).encode(),  # type: ignore[arg-type]
                        count=count)
        record = parse_endpoint_topic_value(found[-1][1])
        assert isinstance(record, SchemaPinsRecord) and record.tenant_id == t.tenant_id
        return record.schema_majors

    def update(endpoint_id: str, majors: list[int], key: Tenant = t) -> Any:
        return api.UpdateEndpoint(pb.UpdateEndpointRequest(
            endpoint_id=endpoint_id, endpoint=pb.Endpoint(schema_majors=majors),
            update_mask=FieldMask(paths=["schema_majors"])), metadata=key.md)

    created = api.CreateEndpoint(pb.CreateEndpointRequest(url=HOOK_URL, event_types=["invoice.*"],
                                                          schema_majors=[3, 2, 2]), metadata=t.md).endpoint
    endpoint_id = created.endpoint_id
    assert list(created.schema_majors) == [2, 3] and published(endpoint_id, 1) == (2, 3)
    got = api.GetEndpoint(pb.GetEndpointRequest(endpoint_id=endpoint_id), metadata=t.md)
    assert list(got.schema_majors) == [2, 3] and "schema majors:  2, 3" in endpoints_cli.endpoint_detail(got)

    updated = update(endpoint_id, [1])
    assert list(updated.schema_majors) == [1] and updated.config_version == created.config_version
    assert published(endpoint_id, 2) == (1,)
    # The catalog's pin and the endpoint's are one: either one's change shows in the other.
    stack.catalog.SetEndpointSchemaMajors(cpb.SetEndpointSchemaMajorsRequest(endpoint_id=endpoint_id,
                                                                             schema_majors=[4]), metadata=t.md)
    assert list(api.GetEndpoint(pb.GetEndpointRequest(endpoint_id=endpoint_id), metadata=t.md).schema_majors) == [4]
    plain = api.CreateEndpoint(pb.CreateEndpointRequest(url=HOOK_URL, event_types=["*"]), metadata=t.md).endpoint
    listed = api.ListEndpoints(pb.ListEndpointsRequest(), metadata=t.md).endpoints
    assert {e.endpoint_id: list(e.schema_majors) for e in listed} == {endpoint_id: [4], plain.endpoint_id: []}
    assert list(update(endpoint_id, []).schema_majors) == [] and published(endpoint_id, 4) == ()

    err = rpc_error(lambda: api.CreateEndpoint(pb.CreateEndpointRequest(url=HOOK_URL, event_types=["*"],
                                                                        schema_majors=[0]), metadata=t.md))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "schema_majors" in err.details()
    assert len(api.ListEndpoints(pb.ListEndpointsRequest(), metadata=t.md).endpoints) == 2  # nothing created
    assert rpc_error(lambda: update(endpoint_id, [2], new_tenant(stack))).code() == grpc.StatusCode.NOT_FOUND
    issued = stack.admin.CreateApiKey(pb.CreateApiKeyRequest(tenant_id=t.tenant_id, read_only=True),
                                      metadata=stack.admin_md())
    reader = Tenant(t.tenant_id, issued.api_key, issued.key_id)
    assert rpc_error(lambda: update(endpoint_id, [2], reader)).code() == grpc.StatusCode.PERMISSION_DENIED
    assert list(api.GetEndpoint(pb.GetEndpointRequest(endpoint_id=endpoint_id), metadata=t.md).schema_majors) == []


def test_catalog_records_carry_the_stored_revisions_and_a_change_left_unpublished_is_sent(stack: Stack) -> None:
    t = new_tenant(stack)
    store = CassandraCatalogStore(stack.session)
    topic = stack.settings.kafka.endpoints_topic

    def last(key: str, count: int) -> Any:
        found = consume(stack, topic, lambda k, _v: k == key.encode(), count=count)  # type: ignore[arg-type]
        return parse_endpoint_topic_value(found[-1][1])

    create_type(stack, t, "invoice.paid")
    add_version(stack, t, "invoice.paid", "1", V1, [EXAMPLE])
    stack.catalog.SetCatalogSettings(cpb.SetCatalogSettingsRequest(unknown_types="warn"), metadata=t.md)
    # Settings went out with the create and the version (the default, revision 0), then as set:
    # the row's write time is the revision.
    settings = last(catalog_settings_key(t.tenant_id), count=3)
    assert (settings.unknown_types, settings.revision) == store.read_unknown_types(t.tenant_id)
    assert settings.revision > 0
    api = rpc.ControlPlaneStub(stack.channel)
    endpoint_id = api.CreateEndpoint(pb.CreateEndpointRequest(url=HOOK_URL, event_types=["invoice.*"]),
                                     metadata=t.md).endpoint.endpoint_id
    for majors in ([2], [3]):
        stack.catalog.SetEndpointSchemaMajors(cpb.SetEndpointSchemaMajorsRequest(
            endpoint_id=endpoint_id, schema_majors=majors), metadata=t.md)
    pins = last(schema_pins_key(endpoint_id), count=2)
    assert (pins.schema_majors, pins.revision) == store.read_schema_pins(t.tenant_id, endpoint_id)
    # Published changes leave no outbox row.
    assert [i for i in store.list_unpublished() if i.tenant_id == t.tenant_id] == []

    # A change stored whose publish never happened (the process died): its outbox row, older than
    # a request can be in flight, is what the republisher loop sends it from.
    entry = store.get_type(t.tenant_id, "invoice.paid")
    assert entry is not None and entry.revision == 2
    store.put_unpublished(Unpublished(t.tenant_id, TYPE, "invoice.paid", "it-" + uuid.uuid4().hex,
                                      int(time.time() * 1000) - 60_000))
    assert store.replace_type(replace(entry, description="stored, never published", revision=3), 2)
    consume(stack, topic, lambda k, v: k == catalog_type_key(t.tenant_id, "invoice.paid").encode()  # type: ignore[arg-type]
            and json.loads(v)["revision"] == 3)
    wait_for(lambda: [i for i in store.list_unpublished() if i.tenant_id == t.tenant_id] == [])
