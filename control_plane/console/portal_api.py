"""The Portal gRPC service (proto/webhooks/v1/portal.proto): its generated modules and servicer.

Like the other servicers, it only authenticates, converts and maps errors (servicer.mapped).
"""

from __future__ import annotations

from typing import Any

import grpc

from control_plane.auth import ADMIN_PRINCIPAL, Authenticator
from control_plane.console.portal import PortalService
from control_plane.rpc.servicer import mapped, ts
from protogen.webhooks.v1 import portal_pb2 as portal_pb
from protogen.webhooks.v1 import portal_pb2_grpc as portal_rpc

SERVICE_NAME = portal_pb.DESCRIPTOR.services_by_name["Portal"].full_name


class PortalServicer(portal_rpc.PortalServicer):
    def __init__(self, auth: Authenticator, portal: PortalService) -> None:
        self._auth = auth
        self._portal = portal

    @mapped
    def CreatePortalLink(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._auth.admin(context.invocation_metadata())
        issued = self._portal.create_link(request.tenant_id, request.ttl_seconds, ADMIN_PRINCIPAL)
        return portal_pb.CreatePortalLinkResponse(url=issued.url, link_id=issued.link.link_id,
                                                  expires_at=ts(issued.link.expires_at_ms))


def add_to_server(servicer: PortalServicer, server: grpc.Server) -> None:
    portal_rpc.add_PortalServicer_to_server(servicer, server)


__all__ = ["SERVICE_NAME", "PortalServicer", "add_to_server", "portal_pb", "portal_rpc"]
