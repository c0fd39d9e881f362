"""gRPC servicer of the TenantAccount service (proto/webhooks/v1/account.proto): the caller's
tenant from its API key, proto -> domain -> proto, nothing else (control_plane.history.account
reads, core.account adds up)."""

from __future__ import annotations

from typing import Any

import grpc

from control_plane.auth import Authenticator
from control_plane.history.account import TenantAccountService
from control_plane.rpc.servicer import mapped, ms_of, ts
from core import account as acc
from protogen.webhooks.v1 import account_pb2 as apb
from protogen.webhooks.v1 import account_pb2_grpc as arpc

SERVICE_NAME = apb.DESCRIPTOR.services_by_name["TenantAccount"].full_name


def type_pb(t: acc.TypeAccount) -> Any:
    d = t.deliveries
    return apb.EventTypeAccount(
        event_type=t.event_type, accepted=t.accepted, fanned_out=t.fanned_out, no_subscriber=t.no_subscriber,
        dead_lettered=dict(t.dead_lettered), not_accounted=t.not_accounted,
        deliveries=apb.DeliveryCounts(succeeded=d["succeeded"], failed=d["failed"], expired=d["expired"],
                                      pending=d["pending"], missing=d["missing"]),
        skipped=dict(t.skipped), balanced=t.events_balance)


def account_pb(a: acc.Account) -> Any:
    return apb.Account(
        tenant_id=a.tenant_id, start_time=ts(a.since_ms), end_time=ts(a.until_ms),
        event_types=[type_pb(t) for t in a.types], total=type_pb(a.total),
        unaccounted=[apb.UnaccountedItem(event_id=u.event_id, event_type=u.event_type, kind=u.kind,
                                         delivery_id=u.delivery_id, detail=u.detail) for u in a.unaccounted],
        balanced=a.balanced)


class TenantAccountServicer(arpc.TenantAccountServicer):  # type: ignore[misc]
    def __init__(self, auth: Authenticator, service: TenantAccountService) -> None:
        self._auth = auth
        self._service = service

    @mapped
    def GetAccount(self, request: Any, context: grpc.ServicerContext) -> Any:
        principal = self._auth.tenant(context.invocation_metadata())
        return account_pb(self._service.account(principal, ms_of(request, "start_time"), ms_of(request, "end_time")))


def add_to_server(servicer: TenantAccountServicer, server: grpc.Server) -> None:
    arpc.add_TenantAccountServicer_to_server(servicer, server)
