"""Build and run the control-plane gRPC server.

`python -m control_plane.server` serves on settings.control_plane.host:port with health and
reflection, runs the republisher and config-clock loops, and stops gracefully on SIGTERM/SIGINT
(in-flight calls get a grace period, then the loops stop and the producer flushes). The same
services answer over HTTP+JSON on http_port (control_plane.httpapi.server) and as the web console on
console_port.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc
from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, Session
from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from control_plane import console, faults, metrics, traced_calls
from control_plane.admin import AdminService
from control_plane.archive.store import ArchiveStore
from control_plane.auth import Authenticator
from control_plane.catalog.service import FilterCheck, stored_records
from control_plane.catalog.store import CassandraCatalogStore
from control_plane.cursor import Cursors
from control_plane.endpoints.operational_events import OperationalEvents
from control_plane.endpoints.operational_store import CassandraOperationalStore
from control_plane.endpoints.schema_pins import SchemaPins
from control_plane.endpoints.service import Deps, EndpointService
from control_plane.endpoints.signals import SignalConsumer
from control_plane.errors import Unavailable
from control_plane.history.account import KafkaDeadLetters, TenantAccountService
from control_plane.history.deliveries import DeliveryDeps, DeliveryService
from control_plane.history.ordering import OrderingDeps, OrderingService
from control_plane.history.reconcile import Reconciler
from control_plane.history.replay_windows import CatalogReplayWindows
from control_plane.history.tiered import TieredHistory
from control_plane.httpapi import server as http_api
from control_plane.httpapi.idempotency import MemoryIdempotency
from control_plane.publishing.catalog import CatalogPublication
from control_plane.publishing.catalog_records import CatalogPublisher
from control_plane.publishing.configs import ConfigPublication
from control_plane.publishing.publisher import KafkaPublisher, Publisher, PublishError
from control_plane.rpc.account_servicer import SERVICE_NAME as ACCOUNT_SERVICE
from control_plane.rpc.account_servicer import TenantAccountServicer
from control_plane.rpc.account_servicer import add_to_server as add_account
from control_plane.rpc.api import pb, rpc
from control_plane.rpc.catalog_servicer import SERVICE_NAME as CATALOG_SERVICE
from control_plane.rpc.catalog_servicer import add_to_server as add_catalog
from control_plane.rpc.operations_servicer import SERVICE_NAME as OPERATIONS_SERVICE
from control_plane.rpc.operations_servicer import add_to_server as add_operations
from control_plane.rpc.servicer import AdminServicer, ControlPlaneServicer
from control_plane.store import CassandraStore
from control_plane.validation import DestinationValidator, Resolver, system_resolver
from core import target_proof
from core.egress import EgressPolicy
from core.secrets import redact
from core.settings import Settings, load_settings_or_exit
from tracing import tracer

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    pb.DESCRIPTOR.services_by_name["ControlPlane"].full_name,
    pb.DESCRIPTOR.services_by_name["Admin"].full_name,
    console.SERVICE_NAME,
    CATALOG_SERVICE,
    ACCOUNT_SERVICE,
    OPERATIONS_SERVICE,
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Loop:
    """Runs ``step`` every ``interval_s`` on a daemon thread; a failing step is logged, not fatal."""

    def __init__(self, name: str, interval_s: float, step: Callable[[], object], first_at_start: bool = False) -> None:
        self._interval_s = interval_s
        self._first_at_start = first_at_start
        self._step = step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        wait = 0.0 if self._first_at_start else self._interval_s
        quiet_until = 0.0
        while not self._stop.wait(wait):
            wait = self._interval_s
            try:
                self._step()
                metrics.loop_step(self._thread.name, ok=True)
                quiet_until = 0.0
            except (PublishError, Unavailable) as exc:  # expected while Kafka/Cassandra is down
                metrics.loop_step(self._thread.name, ok=False)
                # The clock ticks several times a second: one line per 10 s of an outage is enough.
                if time.monotonic() >= quiet_until:
                    log.warning("%s: %s; next tick retries", self._thread.name, exc)
                    quiet_until = time.monotonic() + 10.0
            except Exception:  # noqa: BLE001 -- the next tick retries; the loop must not die
                metrics.loop_step(self._thread.name, ok=False)
                log.exception("%s step failed", self._thread.name)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@dataclass
class ControlPlaneServer:
    server: grpc.Server
    port: int
    publication: ConfigPublication
    publisher: Publisher
    loops: tuple[Loop, ...]
    health: health.HealthServicer
    signals: SignalConsumer
    console: console.ConsoleServices  # the same services, for the web console (control_plane.console)
    http: http_api.HttpApi  # the same handlers, over HTTP+JSON (control_plane.httpapi.server)

    def start(self) -> None:
        self.server.start()
        for loop in self.loops:
            loop.start()
        for name in ("", *SERVICE_NAMES):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("control plane serving on port %d", self.port)

    def stop(self, grace_s: float = 10.0) -> None:
        # Report NOT_SERVING first so load balancers drain, then let in-flight calls finish.
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()
        for loop in self.loops:
            loop.stop()
        self.signals.close()
        self.publisher.close()


def build(
    settings: Settings,
    session: Session,
    *,
    publisher: Publisher | None = None,
    resolver: Resolver = system_resolver,
    port: int | None = None,
) -> ControlPlaneServer:
    """Wire everything; tests pass their own session, a failing publisher, port 0."""
    cp = settings.control_plane
    policy = EgressPolicy.from_settings(settings.egress)
    if policy.dev_allow_cidrs:
        log.warning("egress dev_allow_cidrs is set (%s): development only", settings.egress.dev_allow_cidrs)
    store = CassandraStore(session, consistency=settings.cassandra.consistency)
    keyring = settings.master_keyring()  # read once (a key file is read from disk)
    publisher = publisher or KafkaPublisher(settings.kafka)
    publication = ConfigPublication(store, publisher, now_ms, lease_ms=cp.config_lease_ms,
                                    hold_scan_interval_ms=cp.hold_scan_interval_ms)
    catalog_store = CassandraCatalogStore(session, settings.cassandra.consistency)
    # One for the catalog's service and the endpoints' pins: its republisher loop sends what either left behind.
    catalog_publication = CatalogPublication(
        catalog_store, stored_records(catalog_store, store, now_ms),
        CatalogPublisher(settings.kafka, cp.config_lease_ms).publish_records, now_ms)
    endpoints = EndpointService(
        Deps(
            store=store,
            publication=publication,
            publisher=publisher,
            destination=DestinationValidator(policy, resolver),
            master_key=keyring,
            now_ms=now_ms,
            random_bytes=os.urandom,
            default_overlap_s=cp.secret_rotation_overlap_s,
            fault=faults.killer(cp.kill_at),
            history=store,
            challenge_ttl_s=cp.challenge_ttl_s,
            check_filters=FilterCheck(catalog_store),
            schema_pins=SchemaPins(catalog_store, catalog_publication, now_ms),
        )
    )
    cursors = Cursors.from_keyring(keyring)
    history = TieredHistory(store, session, ArchiveStore.from_settings(settings.archive), settings.archive.hot_ttl_s)
    deliveries = DeliveryService(
        DeliveryDeps(endpoints=store, history=history, publisher=publisher, now_ms=now_ms,
                     random_bytes=os.urandom, cursors=cursors, rehydrate=history.rehydrate,
                     replay_windows=CatalogReplayWindows(catalog_store).for_tenant)
    )
    ordering = OrderingService(
        OrderingDeps(endpoints=store, history=store, keys=store, publisher=publisher, now_ms=now_ms,
                     random_bytes=os.urandom, cursors=cursors)
    )
    auth = Authenticator(store, cp.admin_token.get_secret_value())

    # None with tracing off: no span, no SDK (control_plane.traced_calls).
    calls_tracer = tracer(settings.tracing, settings.tracing.control_plane_service_name)
    interceptors: list[grpc.ServerInterceptor] = [metrics.RpcMetrics()]
    if calls_tracer is not None:
        interceptors.append(traced_calls.RpcTracing(calls_tracer))
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="grpc"),
                              interceptors=interceptors)
    # Every servicer is added through the registry, which keeps their handlers for the HTTP API.
    registry = http_api.MethodRegistry(grpc_server)
    server = registry.as_server()
    rpc.add_ControlPlaneServicer_to_server(
        ControlPlaneServicer(auth, endpoints, deliveries, ordering, now_ms), server
    )
    reconciler = Reconciler(settings, session, store, publisher, now_ms)
    rpc.add_AdminServicer_to_server(
        AdminServicer(auth, AdminService(store, now_ms, os.urandom, settings.mode == "production"), reconciler,
                      endpoints), server)
    add_catalog(server, auth, catalog_store, store, cursors, catalog_publication, now_ms)  # the event-type catalog
    # A tenant's account of its events (reconciliation's reads, for its tenant only).
    account = TenantAccountService(reconciler, endpoints, deliveries, KafkaDeadLetters(settings))
    add_account(TenantAccountServicer(auth, account), server)
    # Operational events and auto-disable (control_plane.endpoints.operational_events).
    operational = OperationalEvents(CassandraOperationalStore(session, settings.cassandra.consistency), store,
                                    publisher, now_ms, target_proof.target_key(keyring.current), history=store)
    operational.bind(endpoints.auto_disable, endpoints.disable_gone)
    endpoints.listen(operational)
    add_operations(server, auth, operational)
    console_services = console.wire(settings, session, server, store, auth, endpoints, deliveries, ordering,
                                    reconciler, now_ms, account=account, catalog_store=catalog_store)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"{cp.host}:{cp.port if port is None else port}"
    if cp.tls_cert_file is not None and cp.tls_key_file is not None:
        creds = grpc.ssl_server_credentials([(cp.tls_key_file.read_bytes(), cp.tls_cert_file.read_bytes())])
        bound = server.add_secure_port(address, creds)
    else:
        # Settings refuse this in production mode; in dev it must not go unnoticed either.
        log.warning("THE gRPC API IS PLAINTEXT on %s (mode=%s): API keys and signing secrets cross the "
                    "network in clear; set control_plane.tls_cert_file and tls_key_file", address, settings.mode)
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise RuntimeError(f"could not bind {cp.host}:{cp.port}")
    signals = SignalConsumer(settings.kafka, endpoints, on_signal=operational.on_signal)
    loops = (
        # First pass at once: the clock does not tick until it has held every lagging row.
        Loop("republisher", cp.republish_interval_s, publication.republish_pending, first_at_start=True),
        # Catalog changes whose publish failed or whose process died (control_plane.publishing.catalog).
        # A loop of its own: one store failing must not stop the other's pass.
        Loop("catalog-republisher", cp.republish_interval_s, catalog_publication.republish_pending,
             first_at_start=True),
        # Leased ticks (control_plane.publishing.configs): a few per lease keep fan-out from holding.
        Loop("config-clock", cp.config_clock_interval_ms / 1000, publication.publish_clock),
        # The dispatcher's signals: a 410 Gone becomes an audited disable; each signal its
        # operational event (control_plane.endpoints.operational_events).
        Loop("endpoint-signals", 0.2, signals.poll_once),
        # The events of people's changes that Kafka did not confirm (published late, never lost);
        # auto-disable: warnings at the tenant's shares of its window, the disable at its end.
        Loop("auto-disable", cp.auto_disable_interval_s, operational.sweep),
        *([Loop("reconciler", cp.reconcile_interval_s, lambda: _reconcile_and_export(reconciler))]
          if cp.reconcile_interval_s else []),
    )
    idempotency = MemoryIdempotency(cp.idempotency_ttl_s, cp.idempotency_max_entries, time.monotonic)
    http = http_api.wire(registry, idempotency, tracer=calls_tracer)
    return ControlPlaneServer(grpc_server, bound, publication, publisher, loops, health_servicer, signals,
                              console_services, http)


def _reconcile_and_export(reconciler: Reconciler) -> None:
    reconciler.periodic()
    if reconciler.last_report is not None:
        metrics.reconciled(reconciler.last_report.gap_counts())


def connect_cassandra(settings: Settings) -> tuple[Cluster, Session]:
    c = settings.cassandra
    profile = ExecutionProfile(
        load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=c.local_dc),
        consistency_level=ConsistencyLevel.name_to_value[c.consistency],
        serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL)
    cluster = Cluster(
        contact_points=c.contact_points,
        port=c.port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        protocol_version=5,
        sockopts=c.sockopts,
        # serve again within seconds of Cassandra's return (the default backs off to 600 s)
        reconnection_policy=ExponentialReconnectionPolicy(0.5, c.reconnect_max_delay_s, max_attempts=None),
    )
    return cluster, cluster.connect(c.keyspace)


class RedactingFilter(logging.Filter):
    """Last line of defence: no log record leaves the process with a whsec_ secret in it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        return True


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    settings = load_settings_or_exit("control-plane")
    cluster, session = connect_cassandra(settings)
    server = build(settings, session)
    if settings.control_plane.metrics_port:
        metrics.serve(settings.control_plane.host, settings.control_plane.metrics_port)
    stopped = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    web = console.serve(settings, server.console) if settings.control_plane.console_port else None
    cp = settings.control_plane
    api = http_api.serve(server.http, cp.host, cp.http_port) if cp.http_port else None
    stopped.wait()
    if api is not None:
        api.stop()
    if web is not None:
        web.stop()
    server.stop()
    cluster.shutdown()


if __name__ == "__main__":
    main()
