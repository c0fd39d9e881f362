"""The web console: the tenant view, the operator view and the embeddable tenant portal.

Served by the control-plane process (control_plane.server) on 127.0.0.1:control_plane.console_port
over the same service objects as the gRPC API. `wire` is what server.build calls; `serve` starts
the HTTP side (main, and tests with port 0).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import grpc
from cassandra.cluster import Session

from control_plane.auth import Authenticator
from control_plane.catalog.service import CatalogStore
from control_plane.console import portal_api
from control_plane.console.app import ConsoleServer, build_app
from control_plane.console.context import Console, ConsoleServices
from control_plane.console.portal import CassandraPortalStore, PortalService
from control_plane.console.sessions import SessionCodec
from control_plane.endpoints.health import CassandraEndpointHealth, EndpointHealthService
from control_plane.endpoints.service import EndpointService
from control_plane.history.account import TenantAccountService
from control_plane.history.deliveries import DeliveryService
from control_plane.history.ordering import OrderingService
from control_plane.history.reconcile import Reconciler
from control_plane.store import CassandraStore
from core.settings import Settings

SERVICE_NAME = portal_api.SERVICE_NAME


def console_url(settings: Settings) -> str:
    cp = settings.control_plane
    return cp.console_url or f"http://{cp.host}:{cp.console_port}"


def wire(settings: Settings, session: Session, server: grpc.Server, store: CassandraStore, auth: Authenticator,
         endpoints: EndpointService, deliveries: DeliveryService, ordering: OrderingService,
         reconciler: Reconciler, now_ms: Callable[[], int], account: TenantAccountService | None = None,
         catalog_store: CatalogStore | None = None) -> ConsoleServices:
    """The console's services, and the Portal gRPC service registered on ``server``."""
    portal = PortalService(CassandraPortalStore(session), store, now_ms, os.urandom, console_url(settings))
    portal_api.add_to_server(portal_api.PortalServicer(auth, portal), server)
    prometheus = settings.control_plane.prometheus_url.rstrip("/")
    links = {"Prometheus health page": f"{prometheus}/consoles/webhooks.html",
             "Prometheus alerts": f"{prometheus}/alerts",
             "Flink dashboard": f"http://{settings.flink.rest_address}:{settings.flink.rest_port}"}
    return ConsoleServices(auth=auth, store=store, endpoints=endpoints, deliveries=deliveries, ordering=ordering,
                           portal=portal, reconciler=reconciler,
                           health=EndpointHealthService(CassandraEndpointHealth(session), now_ms), now_ms=now_ms,
                           links=links, prometheus_url=prometheus, account=account, catalog=catalog_store)


def serve(settings: Settings, services: ConsoleServices, port: int | None = None) -> ConsoleServer:
    cp = settings.control_plane
    console = Console(services, SessionCodec(settings.master_keyring().current),
                      secure_cookies=console_url(settings).startswith("https://"),
                      frame_ancestors=tuple(cp.console_frame_ancestors))
    server = ConsoleServer(build_app(console), cp.host, cp.console_port if port is None else port)
    server.start()
    return server
