"""gRPC servicer of the EventCatalog service: credentials, proto <-> domain, nothing else."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc

from control_plane.auth import Authenticator
from control_plane.catalog.service import (
    UPDATABLE,
    Caller,
    CatalogDeps,
    CatalogService,
    CatalogSettings,
    CatalogStore,
    EventTypeEntry,
    TenantsAndEndpoints,
    VersionEntry,
    caller_for,
)
from control_plane.catalog.store import CassandraCatalogStore
from control_plane.cursor import Cursors
from control_plane.errors import PermissionDenied
from control_plane.publishing.catalog import CatalogPublication
from control_plane.rpc.catalog_api import cpb, crpc
from control_plane.rpc.servicer import mapped, ms_of, ts
from control_plane.store import CassandraStore

SERVICE_NAME = cpb.DESCRIPTOR.services_by_name["EventCatalog"].full_name


def version_pb(v: VersionEntry, with_schema: bool) -> Any:
    return cpb.CatalogSchemaVersion(
        version=str(v.version), schema_json=json.dumps(v.schema, sort_keys=True) if with_schema else "",
        examples_json=[json.dumps(e, sort_keys=True) for e in v.examples] if with_schema else [],
        created_at=ts(v.created_at_ms), created_by=v.created_by, status=v.status, sunset_at=ts(v.sunset_at_ms))


def type_pb(e: EventTypeEntry, with_schemas: bool = True) -> Any:
    return cpb.CatalogEventType(
        tenant_id=e.tenant_id, name=e.name, description=e.description, group=e.group, status=e.status,
        sunset_at=ts(e.sunset_at_ms), enforcement=e.enforcement, created_at=ts(e.created_at_ms),
        updated_at=ts(e.updated_at_ms), updated_by=e.updated_by,
        versions=[version_pb(v, with_schemas) for v in e.versions], replay_window=e.replay_window)


def settings_pb(s: CatalogSettings) -> Any:
    return cpb.CatalogSettings(
        tenant_id=s.tenant_id, unknown_types=s.unknown_types, is_default=s.is_default,
        replay_rules=[cpb.ReplayRule(pattern=r.pattern, replay_window=r.window, updated_at=ts(r.updated_at_ms),
                                     updated_by=r.updated_by) for r in s.replay_rules])


class CatalogServicer(crpc.EventCatalogServicer):  # type: ignore[misc]
    def __init__(self, auth: Authenticator, service: CatalogService, catalog: CatalogStore,
                 tenants: TenantsAndEndpoints) -> None:
        self._auth = auth
        self._service = service
        self._catalog = catalog
        self._tenants = tenants

    def _caller(self, context: grpc.ServicerContext, tenant_id: str, write: bool = False) -> Caller:
        md = context.invocation_metadata()
        try:
            principal = self._auth.tenant(md)
        except PermissionDenied:  # the admin token: it may act on any tenant it names
            self._auth.admin(md)
            principal = None
        return caller_for(principal, tenant_id, self._catalog, self._tenants, write)

    @mapped
    def CreateEventType(self, request: Any, context: grpc.ServicerContext) -> Any:
        caller = self._caller(context, request.tenant_id, write=True)
        return type_pb(self._service.create_type(caller, request.name, request.description, request.group,
                                                 request.enforcement))

    @mapped
    def UpdateEventType(self, request: Any, context: grpc.ServicerContext) -> Any:
        caller = self._caller(context, request.tenant_id, write=True)
        values = {f: getattr(request, f) for f in request.update_fields if f in UPDATABLE}
        if len(values) != len(request.update_fields):
            values["?"] = ""  # let the service name the accepted fields
        return type_pb(self._service.update_type(caller, request.name, values))

    @mapped
    def AddSchemaVersion(self, request: Any, context: grpc.ServicerContext) -> Any:
        caller = self._caller(context, request.tenant_id, write=True)
        return type_pb(self._service.add_version(caller, request.name, request.version, request.schema_json,
                                                 list(request.examples_json)))

    @mapped
    def DeprecateEventType(self, request: Any, context: grpc.ServicerContext) -> Any:
        caller = self._caller(context, request.tenant_id, write=True)
        done = self._service.deprecate(caller, request.name, request.version, ms_of(request, "sunset_at"))
        return cpb.DeprecateEventTypeResponse(
            event_type=type_pb(done.entry, with_schemas=False), scan_truncated=done.scan_truncated,
            recent_receivers=[cpb.RecentReceiver(endpoint_id=r.endpoint_id, last_delivery_at=ts(r.last_delivery_at_ms))
                              for r in done.receivers])

    @mapped
    def GetEventType(self, request: Any, context: grpc.ServicerContext) -> Any:
        return type_pb(self._service.get_type(self._caller(context, request.tenant_id), request.name))

    @mapped
    def ListEventTypes(self, request: Any, context: grpc.ServicerContext) -> Any:
        page = self._service.list_types(self._caller(context, request.tenant_id), request.page_size, request.cursor)
        return cpb.ListEventTypesResponse(event_types=[type_pb(e, with_schemas=False) for e in page.items],
                                          next_cursor=page.next_cursor)

    @mapped
    def GetCatalog(self, request: Any, context: grpc.ServicerContext) -> Any:
        types, settings = self._service.catalog(self._caller(context, request.tenant_id))
        return cpb.GetCatalogResponse(event_types=[type_pb(e) for e in types], settings=settings_pb(settings))

    @mapped
    def SetCatalogSettings(self, request: Any, context: grpc.ServicerContext) -> Any:
        caller = self._caller(context, request.tenant_id, write=True)
        return settings_pb(self._service.set_unknown_types(caller, request.unknown_types))

    @mapped
    def SetReplayRule(self, request: Any, context: grpc.ServicerContext) -> Any:
        caller = self._caller(context, request.tenant_id, write=True)
        return settings_pb(self._service.set_replay_rule(caller, request.pattern, request.replay_window))

    @mapped
    def ExportCatalog(self, request: Any, context: grpc.ServicerContext) -> Any:
        caller = self._caller(context, request.tenant_id)
        return cpb.ExportCatalogResponse(document_json=self._service.export(caller, request.format))

    @mapped
    def SetEndpointSchemaMajors(self, request: Any, context: grpc.ServicerContext) -> Any:
        principal = self._auth.tenant(context.invocation_metadata())
        pinned = self._service.set_schema_majors(principal, request.endpoint_id, list(request.schema_majors))
        return cpb.EndpointSchemaMajors(endpoint_id=request.endpoint_id, schema_majors=list(pinned))

    @mapped
    def SetCatalogWriter(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._auth.admin(context.invocation_metadata())
        self._service.set_writer(request.tenant_id, request.key_id, request.allowed)
        return cpb.SetCatalogWriterResponse()


def add_to_server(server: grpc.Server, auth: Authenticator, store: CassandraCatalogStore, tenants: CassandraStore,
                  cursors: Cursors, publication: CatalogPublication, now_ms: Callable[[], int]) -> None:
    """Wire the catalog into the control plane's server (control_plane/server.py calls this and
    runs ``publication``'s republisher loop)."""
    service = CatalogService(CatalogDeps(catalog=store, tenants=tenants, history=tenants, cursors=cursors,
                                         now_ms=now_ms, publication=publication))
    crpc.add_EventCatalogServicer_to_server(CatalogServicer(auth, service, store, tenants), server)
