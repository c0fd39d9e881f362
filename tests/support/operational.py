"""A tenant with an operations endpoint (subscribed to ``webhooks.*``) on the session's
receiver, for the tests of operational events: its business endpoints, events sent for it, and
the operational events its operations endpoint received, each checked against its signature."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc

from control_plane.rpc.api import pb, rpc
from protogen.webhooks.v1 import operations_pb2 as opb
from protogen.webhooks.v1 import operations_pb2_grpc as orpc
from tests.support.helpers import auth, event, eventually, new_tenant, produce
from tests.support.receiver import Receiver, verify_signature


@dataclass
class Endpoint:
    endpoint_id: str
    path: str
    secret: str


class Tenant:
    """A tenant with an operations endpoint (``webhooks.*``) and business endpoints on the
    session's receiver."""

    def __init__(self, settings: Any, channel: grpc.Channel, receiver: Receiver, name: str,
                 ops_behaviour: str = "ok") -> None:
        self.settings, self.receiver = settings, receiver
        self.tenant_id, self.api_key = new_tenant(channel, settings)
        self.cp = rpc.ControlPlaneStub(channel)
        self.operations = orpc.OperationsStub(channel)
        self.name = name
        self.ops = self.endpoint("ops", ["webhooks.*"], ops_behaviour)

    def endpoint(self, name: str, event_types: list[str], behaviour: str) -> Endpoint:
        path = f"/ep/{self.tenant_id}/{self.name}-{name}"
        self.receiver.set_behaviour(path, behaviour)
        created = self.cp.CreateEndpoint(pb.CreateEndpointRequest(url=self.receiver.base_url + path,
                                                                  event_types=event_types), metadata=auth(self.api_key))
        return Endpoint(created.endpoint.endpoint_id, path, created.signing_secret)

    def send(self, n: int, event_type: str = "invoice.paid") -> list[str]:
        evs = [event(self.tenant_id, event_type, json.dumps({"n": i}).encode()) for i in range(n)]
        produce(self.settings, [e.to_json() for e in evs], keys=[e.event_id for e in evs])
        return [e.event_id for e in evs]

    def received(self, at: Endpoint | None = None) -> list[tuple[str, dict[str, Any]]]:
        """(webhook-id, body) of every request the operations endpoint (or ``at``) got, each
        verified with its signing secret (an unverified one fails the test)."""
        at = at or self.ops
        out = []
        for r in self.receiver.requests(at.path):
            assert verify_signature(r, [at.secret]), f"unverified request to {at.path}: {r.headers}"
            out.append((r.webhook_id or "", r.json()))
        return out

    def wait_event(self, type_name: str, about: str, timeout: float = 90, at: Endpoint | None = None,
                   **data: Any) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for _, body in self.received(at):
                if body["type"] == type_name and body["endpoint_id"] == about and all(
                        body["data"].get(k) == v for k, v in data.items()):
                    return body
            return None
        return eventually(found, timeout=timeout, what=f"{type_name} about {about} {data}")

    def status(self, endpoint: Endpoint) -> int:
        return int(self.cp.GetEndpoint(pb.GetEndpointRequest(endpoint_id=endpoint.endpoint_id),
                                       metadata=auth(self.api_key)).status)

    def set_auto_disable(self, window_s: int, warn_at: list[float], dry_run: bool = False) -> None:
        self.operations.SetAutoDisable(opb.SetAutoDisableRequest(window_seconds=window_s, warn_at=warn_at,
                                                                 dry_run=dry_run), metadata=auth(self.api_key))
