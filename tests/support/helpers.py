"""Small helpers shared by the integration tests: tenants, endpoints, events, polling."""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from confluent_kafka import Consumer, Producer

from control_plane.rpc.api import pb, rpc
from core.records import EventRecord
from core.settings import Settings
from operators.history_store import CassandraHistory
from operators.write_batcher import Completion

T = TypeVar("T")
K = TypeVar("K")


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def new_tenant(channel: grpc.Channel, settings: Settings, verify_endpoints: bool | None = None) -> tuple[str, str]:
    """A fresh tenant and an API key for it, made with the admin credential."""
    admin = rpc.AdminStub(channel)
    md = auth(settings.control_plane.admin_token.get_secret_value())
    tenant_id = f"ten_{uuid.uuid4().hex[:10]}"
    admin.CreateTenant(pb.CreateTenantRequest(tenant_id=tenant_id, name="test tenant",
                                              verify_endpoints=verify_endpoints), metadata=md)
    key = admin.CreateApiKey(pb.CreateApiKeyRequest(tenant_id=tenant_id, description="tests"), metadata=md)
    return tenant_id, key.api_key


def event(tenant_id: str, event_type: str, payload: bytes, target: str | None = None,
          traceparent: str | None = None) -> EventRecord:
    """A new event in the plain form; ``traceparent``: the W3C trace context it continues."""
    return EventRecord(
        event_id=f"evt_{uuid.uuid4().hex}", tenant_id=tenant_id, event_type=event_type,
        schema_version="2026-01-01", object_id="obj_1", object_version=1,
        occurred_at_ms=int(time.time() * 1000), payload=payload, target_endpoint_id=target, traceparent=traceparent)


# One long-lived idempotent producer per Kafka cluster, as an outbox relay keeps: a new one's
# first records reach consumers only after the broker's fetch wait (~500 ms,
# docs/performance-log.md), which every produce-then-wait of the suite would pay again.
_producers: dict[str, Producer] = {}
_producers_lock = threading.Lock()


def _producer(bootstrap_servers: str) -> Producer:
    with _producers_lock:
        p = _producers.get(bootstrap_servers)
        if p is None:
            p = _producers[bootstrap_servers] = Producer({"bootstrap.servers": bootstrap_servers,
                                                          "enable.idempotence": True})
        return p


def produce(settings: Settings, records: list[bytes], keys: list[str] | None = None,
            topic: str | None = None) -> None:
    bootstrap = settings.kafka.bootstrap_servers
    p = _producer(bootstrap)
    errors: list[Any] = []
    for i, value in enumerate(records):
        p.produce(topic or settings.kafka.events_topic, value=value, key=keys[i] if keys else None,
                  on_delivery=lambda err, _msg: errors.append(err) if err is not None else None)
    unsent = p.flush(30)
    if unsent or errors:
        # A fault test may have killed the broker under it (an idempotent producer's error can
        # be fatal): the next call starts a new producer.
        with _producers_lock:
            if _producers.get(bootstrap) is p:
                del _producers[bootstrap]
    assert unsent == 0 and not errors, f"Kafka did not acknowledge every record: {unsent} unsent, {errors[:3]}"


def read_dead_letters(settings: Settings, key_of: Callable[[bytes], K | None], n: int,
                      timeout: float = 90) -> dict[K, dict[str, Any]]:
    """Read the DLQ topic from its start until ``n`` letters are found whose original record
    ``key_of`` recognises (it returns the key to file the letter under, or None), or the timeout
    ends; returns what was found."""
    c = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": f"dlq-test-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([settings.kafka.dlq_topic])
    found: dict[K, dict[str, Any]] = {}
    deadline = time.time() + timeout
    try:
        while time.time() < deadline and len(found) < n:
            msg = c.poll(1.0)
            if msg is None or msg.error():
                continue
            letter = json.loads(msg.value())
            key = key_of(base64.b64decode(letter["original_base64"]))
            if key is not None:
                found[key] = letter
    finally:
        c.close()
    return found


def eventually(fn: Callable[[], T | None], timeout: float = 60, interval: float = 0.5, what: str = "") -> T:
    deadline = time.time() + timeout
    last: T | None = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or fn}; last value {last!r}")


def eventually_tolerant(fn: Callable[[], T | None], timeout: float = 60, interval: float = 0.5, what: str = "",
                        errors: tuple[type[BaseException], ...] = (Exception,)) -> T:
    """`eventually`, but an exception in ``errors`` (a Cassandra timeout, a Flink REST call while the
    JobManager re-deploys) counts as "not yet" instead of failing the test; the last one is reported."""
    deadline = time.time() + timeout
    last: T | None = None
    last_error: BaseException | None = None
    while time.time() < deadline:
        try:
            last = fn()
        except errors as e:
            last_error = e
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or fn}; last value {last!r}; "
                         f"last error {last_error!r}")


def reconcile(channel: grpc.Channel, settings: Settings, tenant_id: str, since_ms: int, repair: bool = False,
              overdue_after_s: int = 0) -> pb.ReconcileReport:
    """The admin Reconcile RPC over [since_ms, now) for one tenant."""
    from google.protobuf.timestamp_pb2 import Timestamp

    start, end = Timestamp(), Timestamp()
    start.FromMilliseconds(since_ms)
    end.FromMilliseconds(int(time.time() * 1000))
    return rpc.AdminStub(channel).Reconcile(
        pb.ReconcileRequest(start_time=start, end_time=end, tenant_id=tenant_id, repair=repair,
                            overdue_after_seconds=overdue_after_s),
        metadata=auth(settings.control_plane.admin_token.get_secret_value()), timeout=120)


def assert_reconciled(channel: grpc.Channel, settings: Settings, tenant_id: str, since_ms: int,
                      expected_deliveries: int, timeout: float = 60) -> pb.ReconcileReport:
    """Reconciliation of the tenant's window reports no gap, and every expected delivery succeeded
    (polled: a snapshot or status write may still be on its way after a recovery)."""
    last: list[pb.ReconcileReport] = []

    def clean() -> pb.ReconcileReport | None:
        r = reconcile(channel, settings, tenant_id, since_ms)
        last[:] = [r]
        c = r.counts
        return r if r.clean and c["deliveries_expected"] == c["succeeded"] == expected_deliveries else None

    try:
        return eventually(clean, timeout=timeout, interval=2, what="a clean reconciliation")
    except AssertionError:
        r = last[-1] if last else None
        detail = (dict(r.counts), [(g.kind, g.id, g.detail) for g in r.gaps][:10]) if r else None
        raise AssertionError(f"reconciliation not clean after {timeout}s: {detail}") from None


# The delivery's columns (static in delivery_history) and its attempt rows. Attempt queries
# restrict the clustering column so a partition with no attempt row returns nothing.
DELIVERY_CQL = ("SELECT delivery_id, event_id, tenant_id, endpoint_id, status, attempt_count, auto_retry_active,"
                " created_at, updated_at FROM delivery_history WHERE delivery_id=%s LIMIT 1")


def delivery_row(session: Any, delivery_id: str) -> Any:
    """The delivery (None when it has no creation cells)."""
    row = session.execute(DELIVERY_CQL, (delivery_id,)).one()
    return row if row is not None and row.event_id is not None else None


def deliveries_of(session: Any, event_id: str, endpoint_ids: list[str]) -> list[Any]:
    """The event's delivery rows among these endpoints. The delivery id is derived from (event,
    endpoint), so no index table is needed: the fan-out snapshot names the endpoints."""
    from core.records import delivery_id_for

    rows = (delivery_row(session, delivery_id_for(event_id, ep)) for ep in endpoint_ids)
    return [r for r in rows if r is not None]


def create_endpoints(channel: grpc.Channel, api_key: str, urls: list[str], event_types: list[str]) -> list[str]:
    """Endpoints created concurrently, ids in the order of ``urls``. The API answers a config change
    one config lease (control_plane.config_lease_ms) after Kafka confirmed it; one after another,
    hundreds would take minutes."""
    from concurrent.futures import ThreadPoolExecutor

    cp = rpc.ControlPlaneStub(channel)

    def create(url: str) -> str:
        r = cp.CreateEndpoint(pb.CreateEndpointRequest(url=url, event_types=event_types), metadata=auth(api_key))
        return str(r.endpoint.endpoint_id)

    with ThreadPoolExecutor(max_workers=12) as pool:
        return list(pool.map(create, urls))


def durable(h: CassandraHistory, *completions: Completion, timeout: float = 20) -> None:
    """Send the history store's open batch and wait for these writes to complete (the dispatcher
    polls the same way)."""
    h.flush()
    deadline = time.monotonic() + timeout
    for c in completions:
        while not c.done():
            assert time.monotonic() < deadline, "history write did not complete"
            time.sleep(0.005)
        c.result()


def account_and_report(channel: grpc.Channel, settings: Settings, tenant_id: str, since_ms: int,
                       api_key: str | None = None) -> tuple[Any, pb.ReconcileReport]:
    """The tenant's account (TenantAccount.GetAccount, with its own key: a read-only one is made
    when none is given) and the admin's reconciliation of the same window, [since_ms, now)."""
    from google.protobuf.timestamp_pb2 import Timestamp

    from protogen.webhooks.v1 import account_pb2, account_pb2_grpc

    md = auth(settings.control_plane.admin_token.get_secret_value())
    if api_key is None:
        api_key = rpc.AdminStub(channel).CreateApiKey(
            pb.CreateApiKeyRequest(tenant_id=tenant_id, description="account check", read_only=True),
            metadata=md).api_key
    start, end = Timestamp(), Timestamp()
    start.FromMilliseconds(since_ms)
    end.FromMilliseconds(int(time.time() * 1000))
    account = account_pb2_grpc.TenantAccountStub(channel).GetAccount(
        account_pb2.GetAccountRequest(start_time=start, end_time=end), metadata=auth(api_key), timeout=120)
    report = rpc.AdminStub(channel).Reconcile(
        pb.ReconcileRequest(start_time=start, end_time=end, tenant_id=tenant_id), metadata=md, timeout=120)
    return account, report


def account_mismatches(account: Any, report: pb.ReconcileReport) -> list[str]:
    """Where a tenant's account and reconciliation of the same window disagree (empty: they
    agree). An event the job dead-lettered after parsing has an empty snapshot or none:
    reconciliation counts it as without subscriber or not fanned out, the account by its reason."""
    c, t = report.counts, account.total
    dead = sum(t.dead_lettered.values())
    pending = c["pending_in_progress"] + c["pending_held"] + c["pending_orphaned"]
    pairs = {
        "accepted = events_on_topic": (t.accepted, c["events_on_topic"]),
        "fanned_out + no_subscriber + dead_lettered + not_accounted = events_on_topic":
            (t.fanned_out + t.no_subscriber + dead + t.not_accounted, c["events_on_topic"]),
        # A dead letter refused before fan-out (an id conflict, a target proof) leaves no snapshot:
        # reconciliation's gap, the account's dead letter. So the account lists at most its gaps.
        "not_accounted, at most the gaps event_not_fanned_out": (t.not_accounted,
                                                                 min(t.not_accounted, c["gap_event_not_fanned_out"])),
        "expected = deliveries_expected": (sum((t.deliveries.succeeded, t.deliveries.failed, t.deliveries.expired,
                                                t.deliveries.pending, t.deliveries.missing)),
                                           c["deliveries_expected"]),
        "succeeded": (t.deliveries.succeeded, c["succeeded"]),
        "failed": (t.deliveries.failed, c["failed"]),
        "expired": (t.deliveries.expired, c["expired"]),
        "pending = pending_*": (t.deliveries.pending, pending),
        "missing = gaps delivery_missing": (t.deliveries.missing, c["gap_delivery_missing"]),
        "listed = gaps of the kinds it lists": (len(account.unaccounted), t.not_accounted + c["gap_delivery_missing"]
                                                + c["gap_pending_orphaned"]),
    }
    return [f"{name}: account {a} != reconciliation {r}" for name, (a, r) in pairs.items() if a != r]
