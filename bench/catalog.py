"""The bench's event-type catalog (``python -m bench.run --catalog``): every bench tenant catalogues
the bench's event type before the load, so fan-out validates every bench event against its schema
and the end-to-end figures include that check.

The schema is bench.schema_validation's, the one the ``schema_check:`` line measures per event:
the end-to-end run then pays for exactly the check whose cost that line states, so an A/B of
``--catalog`` against the default can be held against it. The example sent with the version is
the run's own payload: the API refuses a version whose example fails its schema, so a payload the
schema does not describe stops the run at set-up instead of dead-lettering every event.

The catalog goes through the real EventCatalog API with the admin token naming the tenant, as an
operator would. The API answers a change one config lease after Kafka confirmed its records, and
fan-out holds events until the endpoints topic's clock has passed them, so an event produced after
the call returns is checked against the catalog. Before the load the run still sends each tenant
one probe off the schema and waits for its ``schema_invalid`` dead letter: a TaskManager running
Python modules loaded before fan-out had the catalog check would deliver every event unchecked,
and an A/B would then compare two runs that both validate nothing.
"""

from __future__ import annotations

import json
from typing import Any

import grpc

from bench import schema_validation
from control_plane.rpc.catalog_api import cpb, crpc
from core.event_schemas import SchemaVersion
from core.schema_check import SCHEMA_INVALID

# The schema version catalogued and carried by bench events with --catalog. "1" is also what
# outbox.producer.write_event stamps by default, so the outbox phases need no other change.
EVENT_VERSION = "1"
# Refused at fan-out rather than let through counted: a bench event failing its schema then never
# arrives and the phase reports it missing, instead of a run that looks fine.
ENFORCEMENT = "reject"


def catalog_requests(tenant_id: str, event_type: str, body: bytes) -> tuple[Any, Any]:
    """The two calls that catalogue ``event_type`` for ``tenant_id``: the type, then its version
    with the bench's schema and ``body`` as its example."""
    create = cpb.CreateEventTypeRequest(tenant_id=tenant_id, name=event_type,
                                        description="bench events (bench.raw_http.make_body)",
                                        enforcement=ENFORCEMENT)
    version = cpb.AddSchemaVersionRequest(tenant_id=tenant_id, name=event_type, version=EVENT_VERSION,
                                          schema_json=json.dumps(schema_validation.SCHEMA),
                                          examples_json=[body.decode()])
    return create, version


def catalogue(channel: grpc.Channel, admin_token: str, tenant_id: str, event_type: str, body: bytes) -> None:
    """Catalogue the bench's event type for one tenant; returns once fan-out will check its events."""
    stub = crpc.EventCatalogStub(channel)
    md = [("authorization", f"Bearer {admin_token}")]
    create, version = catalog_requests(tenant_id, event_type, body)
    stub.CreateEventType(create, metadata=md)
    stub.AddSchemaVersion(version, metadata=md)


def off_schema(body: bytes) -> bytes:
    """The probe's payload: the bench's with a ``type`` the schema refuses."""
    probe = body.replace(b'"type":"bench.raw_http"', b'"type":"bench.probe"')
    if probe == body:
        raise ValueError("not a bench payload (bench.raw_http.make_body)")
    return probe


def refused_event_id(letter: bytes) -> str | None:
    """The event id of a dead letter fan-out wrote for a payload failing its schema, else None."""
    d = json.loads(letter)
    extra = d.get("extra") or {}
    return extra.get("event_id") if d.get("reason") == SCHEMA_INVALID else None


def catalog_line(enabled: bool, event_type: str) -> str:
    """The report's line saying whether this run's figures include fan-out's schema check."""
    if not enabled:
        return "catalog: off (bench tenants have no catalog: fan-out validates no event; see schema_check)"
    return (f"catalog: on ({event_type} {SchemaVersion.parse(EVENT_VERSION)} catalogued for every bench tenant, "
            f"enforcement {ENFORCEMENT}: fan-out validates every bench event; see schema_check)")
