"""gRPC servicer of the Operations service (proto/webhooks/v1/operations.proto): the tenant's
auto-disable setting and the operational event types. Credentials, proto <-> domain, nothing else;
the rules are in control_plane.endpoints.operational_events and core.operational_events."""

from __future__ import annotations

import json
from typing import Any

import grpc

from control_plane.auth import Authenticator
from control_plane.endpoints.operational_events import OperationalEvents
from control_plane.endpoints.operational_store import StoredPolicy
from control_plane.rpc.servicer import mapped, ts
from core import operational_events as ops
from protogen.webhooks.v1 import operations_pb2 as opb
from protogen.webhooks.v1 import operations_pb2_grpc as orpc

SERVICE_NAME = opb.DESCRIPTOR.services_by_name["Operations"].full_name


def auto_disable_pb(s: StoredPolicy) -> Any:
    p = s.policy
    return opb.AutoDisable(off=not p.enabled, window_seconds=p.window_s, warn_at=list(p.warn_at), dry_run=p.dry_run,
                           is_default=s.updated_at_ms is None, updated_at=ts(s.updated_at_ms), updated_by=s.updated_by)


def types_pb() -> Any:
    return opb.ListOperationalEventTypesResponse(types=[
        opb.OperationalEventType(name=t.name, description=t.description, schema_version=t.version,
                                 schema_json=json.dumps(t.schema, sort_keys=True),
                                 example_json=json.dumps(ops.example(t.name), sort_keys=True))
        for t in sorted(ops.CATALOG.values(), key=lambda t: t.name)])


class OperationsServicer(orpc.OperationsServicer):  # type: ignore[misc]
    def __init__(self, auth: Authenticator, operational: OperationalEvents) -> None:
        self._auth = auth
        self._ops = operational

    @mapped
    def GetAutoDisable(self, request: Any, context: grpc.ServicerContext) -> Any:
        return auto_disable_pb(self._ops.auto_disable_setting(self._auth.tenant(context.invocation_metadata())))

    @mapped
    def SetAutoDisable(self, request: Any, context: grpc.ServicerContext) -> Any:
        principal = self._auth.tenant(context.invocation_metadata())
        return auto_disable_pb(self._ops.set_auto_disable(principal, request.off, request.window_seconds,
                                                          tuple(request.warn_at), request.dry_run))

    @mapped
    def ListOperationalEventTypes(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._auth.tenant(context.invocation_metadata())
        return types_pb()


def add_to_server(server: grpc.Server, auth: Authenticator, operational: OperationalEvents) -> None:
    orpc.add_OperationsServicer_to_server(OperationsServicer(auth, operational), server)
