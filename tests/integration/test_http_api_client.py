"""The tour through the Python client generated from the HTTP API's OpenAPI document (make setup
generates it into build/http-client; control_plane.httpapi.client_gen), on the real stack: a tenant's
API key, an endpoint created, an event published through the outbox, the deliveries listed, one
replayed; the receiver gets both attempts. No client code is written by hand: the calls below are
the generated modules'."""

from __future__ import annotations

import importlib
import sys
import uuid
from typing import Any

import pytest

from core.records import delivery_id_for
from outbox.producer import write_event
from tests.support.faults import wait_all_reached
from tests.support.helpers import eventually, new_tenant

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def generated() -> Any:
    """The generated package (regenerated first if the document changed)."""
    from control_plane.httpapi import client_gen as http_client_gen

    http_client_gen.generate()
    sys.path.insert(0, str(http_client_gen.OUT))  # build/http-client: the generated package's parent
    try:
        yield importlib.import_module(http_client_gen.PACKAGE)
    finally:
        sys.path.remove(str(http_client_gen.OUT))


def test_the_tour_through_the_generated_client(generated, http_api_base, grpc_channel, settings, receiver,  # type: ignore[no-untyped-def]
                                              relay, delivery_job) -> None:
    api = importlib.import_module(f"{generated.__name__}.api.control_plane")
    models = importlib.import_module(f"{generated.__name__}.models")
    for name in ("create_endpoint", "list_deliveries", "replay_delivery", "get_delivery"):
        importlib.import_module(f"{api.__name__}.{name}")

    tenant_id, key = new_tenant(grpc_channel, settings)  # the tenant's API key (the admin's gRPC call)
    client = generated.AuthenticatedClient(base_url=http_api_base, token=key, raise_on_unexpected_status=True)
    path = f"/http-client/{tenant_id}"

    created = api.create_endpoint.sync(client=client, idempotency_key=uuid.uuid4().hex,
                                       body=models.CreateEndpointRequest(url=f"{receiver.base_url}{path}",
                                                                         event_types=["client.*"]))
    assert isinstance(created, models.CreateEndpointResponse), created
    endpoint_id = created.endpoint.endpoint_id
    assert created.signing_secret.startswith("whsec_")

    with relay.connect() as conn:
        event_id = write_event(conn, tenant_id, "client.invoice_paid", {"id": "inv_1", "amount": 4200})
    delivery_id = delivery_id_for(event_id, endpoint_id)
    wait_all_reached(receiver, {delivery_id}, timeout=90)

    def listed() -> Any:
        page = api.list_deliveries.sync(client=client, endpoint_id=endpoint_id,
                                        status=[models.ListDeliveriesStatusItem.SUCCEEDED], limit=10)
        assert isinstance(page, models.ListDeliveriesResponse), page
        return [d for d in page.deliveries if d.delivery_id == delivery_id] or None

    assert eventually(listed, timeout=30, what="the delivery listed")[0].event_id == event_id

    replayed = api.replay_delivery.sync(delivery_id, client=client, idempotency_key=uuid.uuid4().hex,
                                        body=models.ReplayDeliveryBody(reason="receiver fixed"))
    assert isinstance(replayed, models.ReplayDeliveryResponse) and replayed.delivery_id == delivery_id, replayed
    eventually(lambda: [r for r in receiver.requests(path) if r.webhook_id == delivery_id][1:] or None,
               timeout=60, what="the replayed attempt")

    detail = api.get_delivery.sync(delivery_id, client=client)
    assert isinstance(detail, models.DeliveryDetail), detail
    assert [r.reason for r in detail.replays] == ["receiver fixed"]

    missing = api.get_delivery.sync("dlv_missing", client=client)
    assert isinstance(missing, models.Problem) and missing.status == 404
