"""The control plane against the real stack: gRPC server in process on a free 127.0.0.1 port,
real Cassandra (this session's keyspace) and real Kafka (this session's topics from conftest).

Every test makes its own tenant. Endpoint URLs are IP literals on loopback (allowed by the
session's development egress allowance) or refused before any resolution, so validation never
causes traffic beyond 127.0.0.1. Delivery history rows are written here the way the Flink job
writes them, so these tests do not need the job running.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
import pytest
from cassandra.cluster import Session
from confluent_kafka import Consumer
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import SecretStr

from control_plane.publishing.publisher import KafkaPublisher, PublishError
from control_plane.rpc.api import pb, rpc
from control_plane.server import ControlPlaneServer, build
from core.history_buckets import bucket_of
from core.ingest import parse_event
from core.records import (
    CLOCK_KEY,
    ConfigClock,
    EndpointConfig,
    EndpointStatus,
    ReplayRequest,
    delivery_id_for,
    parse_endpoint_topic_value,
)
from core.settings import Settings
from stack.isolation import keyspace_session

pytestmark = pytest.mark.integration

DAY_MS = 24 * 3600 * 1000
HOOK_URL = "https://127.0.0.1/hook"  # loopback IP literal: no DNS, allowed by dev_allow_cidrs


class SwitchablePublisher(KafkaPublisher):
    """The real publisher, whose config publishes can be made to fail (broker outage)."""

    fail_configs = False

    def publish_config(self, config: EndpointConfig) -> None:
        if self.fail_configs:
            raise PublishError("injected: endpoints topic unavailable")
        super().publish_config(config)


@dataclass
class Stack:
    server: ControlPlaneServer
    publisher: SwitchablePublisher
    channel: grpc.Channel
    settings: Settings
    session: Session

    @property
    def api(self) -> rpc.ControlPlaneStub:
        return rpc.ControlPlaneStub(self.channel)

    @property
    def admin(self) -> rpc.AdminStub:
        return rpc.AdminStub(self.channel)

    def admin_md(self) -> list[tuple[str, str]]:
        token = self.settings.control_plane.admin_token.get_secret_value()
        return [("authorization", f"Bearer {token}")]


@pytest.fixture(scope="module")
def stack(settings: Settings, kafka_bootstrap: str) -> Iterator[Stack]:
    # A keyspace of its own: a control plane reconciles every endpoint row of its keyspace, so
    # the session's control plane would otherwise republish what these tests make fail to publish.
    cassandra = settings.cassandra.model_copy(update={"keyspace": settings.cassandra.keyspace + "_cp"})
    # Fast loops so the republisher's catch-up is observable within a test.
    cp = settings.control_plane.model_copy(update={"republish_interval_s": 0.3})
    local = settings.model_copy(update={"control_plane": cp, "cassandra": cassandra})
    with keyspace_session(local) as session:
        publisher = SwitchablePublisher(local.kafka, delivery_timeout_s=10)
        server = build(local, session, publisher=publisher, port=0)
        server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        grpc.channel_ready_future(channel).result(timeout=10)
        yield Stack(server, publisher, channel, local, session)
        channel.close()
        server.stop(grace_s=2)


@dataclass
class TenantCtx:
    tenant_id: str
    key: str
    key_id: str

    @property
    def md(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.key}")]


def new_tenant(stack: Stack, read_only: bool = False) -> TenantCtx:
    tenant_id = "it-" + uuid.uuid4().hex[:12]
    stack.admin.CreateTenant(pb.CreateTenantRequest(tenant_id=tenant_id, name="it"),
                             metadata=stack.admin_md())
    issued = stack.admin.CreateApiKey(
        pb.CreateApiKeyRequest(tenant_id=tenant_id, description="it", read_only=read_only),
        metadata=stack.admin_md(),
    )
    return TenantCtx(tenant_id, issued.api_key, issued.key_id)


def add_key(stack: Stack, tenant: TenantCtx, read_only: bool) -> TenantCtx:
    issued = stack.admin.CreateApiKey(
        pb.CreateApiKeyRequest(tenant_id=tenant.tenant_id, read_only=read_only), metadata=stack.admin_md()
    )
    return TenantCtx(tenant.tenant_id, issued.api_key, issued.key_id)


def create_endpoint(stack: Stack, t: TenantCtx, **fields: object) -> pb.CreateEndpointResponse:
    request = pb.CreateEndpointRequest(
        url=HOOK_URL, description="it", event_types=["invoice.*"], metadata={"k": "v"}
    )
    for name, value in fields.items():
        setattr(request, name, value) if not isinstance(value, list) else getattr(request, name).extend(value)
    return stack.api.CreateEndpoint(request, metadata=t.md)


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        result = call()
        if isinstance(result, Iterator):  # a stream fails when read
            list(result)
    return info.value.code()  # type: ignore[attr-defined,no-any-return]


def ref(endpoint_id: str) -> pb.GetEndpointRequest:
    return pb.GetEndpointRequest(endpoint_id=endpoint_id)


def stamp(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


def now_ms() -> int:
    return int(time.time() * 1000)


def consume(stack: Stack, topic: str, match: Callable[[bytes | None, bytes], bool], count: int = 1,
            timeout_s: float = 30) -> list[tuple[bytes | None, bytes]]:
    """Read the topic from the start until ``count`` records match."""
    consumer = Consumer({
        "bootstrap.servers": stack.settings.kafka.bootstrap_servers,
        "group.id": "it-cp-" + uuid.uuid4().hex,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    found: list[tuple[bytes | None, bytes]] = []
    deadline = time.time() + timeout_s
    try:
        while len(found) < count and time.time() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            if match(msg.key(), msg.value()):
                found.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    assert len(found) >= count, f"only {len(found)} of {count} matching records on {topic}"
    return found


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def write_delivery(stack: Stack, tenant_id: str, endpoint_id: str, n: int, status: str | None,
                   created_ms: int, attempts: int = 1, legacy: bool = False) -> str:
    """Delivery rows as the Flink job's dispatcher writes them (001_history.cql, and the bucketed
    endpoint index of 008; ``legacy``: the unbucketed one it wrote before)."""
    event_id = f"evt_it_{uuid.uuid4().hex[:8]}_{n}"
    did = delivery_id_for(event_id, endpoint_id)
    created = datetime.fromtimestamp(created_ms / 1000, tz=UTC)
    s = stack.session
    s.execute(
        "INSERT INTO deliveries (delivery_id, event_id, tenant_id, endpoint_id, "
        "endpoint_config_version, event_type, created_at, expires_at, status, attempt_count, "
        "last_http_status, last_error_class, auto_retry_active, updated_at) "
        "VALUES (%s, %s, %s, %s, 1, 'invoice.paid', %s, %s, %s, %s, 503, 'http_5xx', %s, %s)",
        (did, event_id, tenant_id, endpoint_id, created,
         datetime.fromtimestamp((created_ms + DAY_MS) / 1000, tz=UTC), status, attempts,
         status is None, created),
    )
    if legacy:
        s.execute(
            "INSERT INTO deliveries_by_endpoint (tenant_id, endpoint_id, day, created_at, delivery_id, "
            "event_id, event_type, status, attempt_count, last_http_status, updated_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, 'invoice.paid', %s, %s, 503, %s)",
            (tenant_id, endpoint_id, created.date(), created, did, event_id, status, attempts, created),
        )
    else:
        s.execute(
            "INSERT INTO endpoint_deliveries (tenant_id, endpoint_id, day, bucket, created_at, delivery_id, "
            "event_id, event_type, status, attempt_count, last_http_status, updated_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, 'invoice.paid', %s, %s, 503, %s)",
            (tenant_id, endpoint_id, created.date(), bucket_of(did), created, did, event_id, status, attempts,
             created),
        )
    for number in range(1, attempts + 1):
        s.execute(
            "INSERT INTO attempts (delivery_id, attempt_number, attempt_id, endpoint_id, "
            "endpoint_config_version, url, started_at, finished_at, http_status, latency_ms, "
            "outcome, error_class, signing_key_versions, manual) "
            "VALUES (%s, %s, %s, %s, 1, %s, %s, %s, 503, 12, 'retry', 'http_5xx', [1], false)",
            (did, number, f"{did}-{number}", endpoint_id, HOOK_URL, created, created),
        )
    return did


# -- health, reflection, admin ---------------------------------------------------------------


def test_health_and_reflection_are_served(stack: Stack) -> None:
    health = health_pb2_grpc.HealthStub(stack.channel)
    for service in ("", "webhooks.v1.ControlPlane", "webhooks.v1.Admin"):
        status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(stack.channel)
    [answer] = list(reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5))
    names = {s.name for s in answer.list_services_response.service}
    assert {"webhooks.v1.ControlPlane", "webhooks.v1.Admin", "grpc.health.v1.Health"} <= names


def test_admin_calls_and_their_errors(stack: Stack) -> None:
    t = new_tenant(stack)
    admin, md = stack.admin, stack.admin_md()
    assert code_of(lambda: admin.CreateTenant(pb.CreateTenantRequest(tenant_id=t.tenant_id), metadata=md)) \
        == grpc.StatusCode.ALREADY_EXISTS
    assert code_of(lambda: admin.CreateTenant(pb.CreateTenantRequest(tenant_id="Bad Id!"), metadata=md)) \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: admin.CreateTenant(pb.CreateTenantRequest(name="x"))) \
        == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: admin.CreateTenant(pb.CreateTenantRequest(name="x"), metadata=t.md)) \
        == grpc.StatusCode.PERMISSION_DENIED
    assert code_of(lambda: admin.CreateApiKey(pb.CreateApiKeyRequest(tenant_id="it-missing-tenant"),
                                              metadata=md)) == grpc.StatusCode.NOT_FOUND
    # The admin credential is not a tenant credential.
    assert code_of(lambda: stack.api.ListEndpoints(pb.ListEndpointsRequest(), metadata=md)) \
        == grpc.StatusCode.PERMISSION_DENIED
    # Keys are stored hashed; a revoked key stops working at once.
    row = stack.session.execute("SELECT key_id FROM api_keys WHERE key_hash = %s",
                                (hashlib.sha256(t.key.encode()).hexdigest(),)).one()
    assert row is not None and row[0] == t.key_id
    stack.api.ListEndpoints(pb.ListEndpointsRequest(), metadata=t.md)
    admin.RevokeApiKey(pb.RevokeApiKeyRequest(tenant_id=t.tenant_id, key_id=t.key_id), metadata=md)
    assert code_of(lambda: stack.api.ListEndpoints(pb.ListEndpointsRequest(), metadata=t.md)) \
        == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(lambda: admin.RevokeApiKey(pb.RevokeApiKeyRequest(tenant_id="it-other", key_id=t.key_id),
                                              metadata=md)) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: stack.api.ListEndpoints(pb.ListEndpointsRequest(),
                                                   metadata=[("authorization", "Bearer whk_nope")])) \
        == grpc.StatusCode.UNAUTHENTICATED


# -- endpoints -------------------------------------------------------------------------------


def test_endpoint_lifecycle_is_stored_versioned_and_published(stack: Stack) -> None:
    t = new_tenant(stack)
    created = create_endpoint(stack, t, request_id="create-1", max_in_flight=4)
    e = created.endpoint
    assert created.signing_secret.startswith("whsec_")
    assert (e.config_version, e.published_version, e.max_in_flight) == (1, 1, 4)
    assert e.url == "https://127.0.0.1:443/hook"
    # Idempotent create: the same endpoint, the secret never again (shown once); a different body
    # under the same id is refused.
    again = create_endpoint(stack, t, request_id="create-1", max_in_flight=4)
    assert (again.endpoint.endpoint_id, again.signing_secret) == (e.endpoint_id, "")
    assert code_of(lambda: create_endpoint(stack, t, request_id="create-1", description="other")) \
        == grpc.StatusCode.ALREADY_EXISTS
    # At rest: ciphertext only.
    row = stack.session.execute(
        "SELECT signing_keys, published_version FROM endpoints WHERE tenant_id = %s AND endpoint_id = %s",
        (t.tenant_id, e.endpoint_id)).one()
    assert created.signing_secret not in row[0] and created.signing_secret[6:] not in row[0]
    assert row[1] == 1

    got = stack.api.GetEndpoint(ref(e.endpoint_id), metadata=t.md)
    assert got.endpoint_id == e.endpoint_id and got.metadata["k"] == "v"
    more = [create_endpoint(stack, t).endpoint.endpoint_id for _ in range(2)]
    page1 = stack.api.ListEndpoints(pb.ListEndpointsRequest(page_size=2), metadata=t.md)
    page2 = stack.api.ListEndpoints(pb.ListEndpointsRequest(page_size=2, cursor=page1.next_cursor),
                                    metadata=t.md)
    listed = [x.endpoint_id for x in [*page1.endpoints, *page2.endpoints]]
    assert sorted(listed) == sorted([e.endpoint_id, *more]) and page2.next_cursor == ""

    updated = stack.api.UpdateEndpoint(pb.UpdateEndpointRequest(
        endpoint_id=e.endpoint_id,
        endpoint=pb.Endpoint(url="https://127.0.0.1/v2", description="ignored", event_types=["order.*"]),
        update_mask=FieldMask(paths=["url", "event_types"])), metadata=t.md)
    assert (updated.config_version, updated.url, list(updated.event_types), updated.description) == (
        2, "https://127.0.0.1:443/v2", ["order.*"], "it")
    cleared = stack.api.UpdateEndpoint(pb.UpdateEndpointRequest(
        endpoint_id=e.endpoint_id, endpoint=pb.Endpoint(),
        update_mask=FieldMask(paths=["max_in_flight"])), metadata=t.md)
    assert cleared.config_version == 3 and not cleared.HasField("max_in_flight")
    disabled = stack.api.DisableEndpoint(ref(e.endpoint_id), metadata=t.md)
    assert (disabled.status, disabled.config_version) == (pb.ENDPOINT_STATUS_DISABLED, 4)
    enabled = stack.api.EnableEndpoint(ref(e.endpoint_id), metadata=t.md)
    assert (enabled.status, enabled.config_version) == (pb.ENDPOINT_STATUS_ACTIVE, 5)

    versions = stack.api.ListEndpointVersions(ref(e.endpoint_id), metadata=t.md).versions
    assert [v.config_version for v in versions] == [5, 4, 3, 2, 1]
    assert versions[3].change == "update event_types,url" and versions[4].url == "https://127.0.0.1:443/hook"
    assert all(v.changed_by == t.key_id for v in versions)

    deleted = stack.api.DeleteEndpoint(ref(e.endpoint_id), metadata=t.md)
    assert deleted.config_version == 6
    assert code_of(lambda: stack.api.GetEndpoint(ref(e.endpoint_id), metadata=t.md)) \
        == grpc.StatusCode.NOT_FOUND

    # The job sees every version on the compacted topic, the last one being the deletion.
    records = consume(stack, stack.settings.kafka.endpoints_topic,
                      lambda k, _v: k == e.endpoint_id.encode(), count=6)
    configs = [parse_endpoint_topic_value(v) for _k, v in records]
    assert [c.config_version for c in configs if isinstance(c, EndpointConfig)][-1] == 6
    last = configs[-1]
    assert isinstance(last, EndpointConfig) and last.status is EndpointStatus.DELETED
    assert all(created.signing_secret.encode() not in v for _k, v in records)


def test_secret_rotation_overlap_and_immediate_revocation(stack: Stack) -> None:
    t = new_tenant(stack)
    e = create_endpoint(stack, t).endpoint
    before = now_ms()
    rotated = stack.api.RotateSecret(pb.RotateSecretRequest(
        endpoint_id=e.endpoint_id, mode=pb.RotateSecretRequest.MODE_OVERLAP), metadata=t.md)
    assert rotated.new_key_version == 2 and rotated.signing_secret.startswith("whsec_")
    assert [k.version for k in rotated.live_keys] == [2, 1]
    old_end = rotated.live_keys[1].not_after.ToMilliseconds()
    assert before + DAY_MS - 5_000 <= old_end <= now_ms() + DAY_MS  # default 24 h overlap
    assert not rotated.live_keys[0].HasField("not_after")
    revoked = stack.api.RotateSecret(pb.RotateSecretRequest(
        endpoint_id=e.endpoint_id, mode=pb.RotateSecretRequest.MODE_REVOKE_IMMEDIATELY), metadata=t.md)
    assert [k.version for k in revoked.live_keys] == [3]
    assert [k.version for k in revoked.endpoint.signing_keys] == [3]
    [(_k, value)] = consume(
        stack, stack.settings.kafka.endpoints_topic,
        lambda k, v: k == e.endpoint_id.encode() and b'"config_version":3' in v)
    config = parse_endpoint_topic_value(value)
    assert isinstance(config, EndpointConfig) and [k.version for k in config.signing_keys] == [3]
    assert code_of(lambda: stack.api.RotateSecret(pb.RotateSecretRequest(
        endpoint_id=e.endpoint_id, overlap_seconds=10 ** 9), metadata=t.md)) \
        == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"url": "http://127.0.0.1/hook"}, "scheme"),
        ({"url": "https://10.20.30.40/hook"}, "private"),
        ({"url": "https://169.254.169.254/latest"}, "cloud_metadata"),
        ({"url": "https://localhost/hook"}, "blocked_hostname"),
        ({"url": "https://127.0.0.1:22/hook"}, "port"),
        ({"event_types": ["Not A Type"]}, "event_types"),
        ({"rate_limit_per_s": -1.0}, "rate_limit_per_s"),
    ],
)
def test_create_rejects_bad_input_with_an_actionable_message(
    stack: Stack, fields: dict, fragment: str
) -> None:
    t = new_tenant(stack)
    request = pb.CreateEndpointRequest(url=HOOK_URL, event_types=["invoice.paid"])
    for name, value in fields.items():
        if isinstance(value, list):
            del request.event_types[:]
            request.event_types.extend(value)
        else:
            setattr(request, name, value)
    with pytest.raises(grpc.RpcError) as info:
        stack.api.CreateEndpoint(request, metadata=t.md)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert fragment in info.value.details()  # type: ignore[attr-defined]
    assert "Traceback" not in info.value.details()  # type: ignore[attr-defined]
    assert stack.api.ListEndpoints(pb.ListEndpointsRequest(), metadata=t.md).endpoints == []


def test_other_errors_map_to_their_status_codes(stack: Stack) -> None:
    t = new_tenant(stack)
    reader = add_key(stack, t, read_only=True)
    e = create_endpoint(stack, t).endpoint
    api = stack.api
    assert code_of(lambda: api.UpdateEndpoint(pb.UpdateEndpointRequest(
        endpoint_id=e.endpoint_id, update_mask=FieldMask(paths=["status"])), metadata=t.md)) \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: api.ListEndpoints(pb.ListEndpointsRequest(cursor="zz"), metadata=t.md)) \
        == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: api.GetEndpoint(ref("ep_does_not_exist"), metadata=t.md)) \
        == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: api.DeleteEndpoint(ref(e.endpoint_id), metadata=reader.md)) \
        == grpc.StatusCode.PERMISSION_DENIED
    assert api.GetEndpoint(ref(e.endpoint_id), metadata=reader.md).endpoint_id == e.endpoint_id
    api.DisableEndpoint(ref(e.endpoint_id), metadata=t.md)
    assert code_of(lambda: api.SendTestEvent(ref(e.endpoint_id), metadata=t.md)) \
        == grpc.StatusCode.FAILED_PRECONDITION
    assert code_of(lambda: api.GetEndpoint(ref(e.endpoint_id))) == grpc.StatusCode.UNAUTHENTICATED


def test_send_test_event_publishes_a_ping_for_that_endpoint_only(stack: Stack) -> None:
    t = new_tenant(stack)
    e = create_endpoint(stack, t).endpoint
    sent = stack.api.SendTestEvent(ref(e.endpoint_id), metadata=t.md)
    assert sent.delivery_id == delivery_id_for(sent.event_id, e.endpoint_id)
    [(_key, value)] = consume(stack, stack.settings.kafka.events_topic,
                              lambda k, _v: k == sent.event_id.encode())
    # Parsed the way the job parses it: fan-out sends it to target_endpoint_id only.
    event = parse_event(value, stack.settings.ingest.max_payload_bytes)
    assert (event.event_type, event.tenant_id, event.target_endpoint_id) == (
        "webhook.ping", t.tenant_id, e.endpoint_id)
    assert json.loads(event.payload)["endpoint_id"] == e.endpoint_id


# -- deliveries ------------------------------------------------------------------------------


def test_list_and_get_deliveries(stack: Stack) -> None:
    t = new_tenant(stack)
    e = create_endpoint(stack, t).endpoint
    now = now_ms()
    failed = [write_delivery(stack, t.tenant_id, e.endpoint_id, n, "failed", now - n * 1000, attempts=2)
              for n in range(1, 4)]
    write_delivery(stack, t.tenant_id, e.endpoint_id, 9, "succeeded", now - 9000)
    pending = write_delivery(stack, t.tenant_id, e.endpoint_id, 10, None, now - 10_000)
    yesterday = write_delivery(stack, t.tenant_id, e.endpoint_id, 11, "failed", now - DAY_MS - 5000)

    def page(cursor: str = "", **kw: object) -> pb.ListDeliveriesResponse:
        return stack.api.ListDeliveries(pb.ListDeliveriesRequest(
            endpoint_id=e.endpoint_id, cursor=cursor, **kw), metadata=t.md)  # type: ignore[arg-type]

    everything = page(page_size=50)
    assert [d.delivery_id for d in everything.deliveries][:3] == failed
    assert len(everything.deliveries) == 6 and everything.next_cursor == ""  # spans two day partitions
    assert everything.deliveries[-1].delivery_id == yesterday
    first = page(page_size=2, statuses=[pb.DELIVERY_STATUS_FAILED])
    rest = page(first.next_cursor, page_size=2, statuses=[pb.DELIVERY_STATUS_FAILED])
    assert [d.delivery_id for d in [*first.deliveries, *rest.deliveries]] == [*failed, yesterday]
    recent = page(start_time=stamp(now - 60_000), statuses=[pb.DELIVERY_STATUS_PENDING])
    assert [d.delivery_id for d in recent.deliveries] == [pending]
    assert code_of(lambda: page(first.next_cursor, page_size=2)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: page(start_time=stamp(now), end_time=stamp(now - 1))) \
        == grpc.StatusCode.INVALID_ARGUMENT

    detail = stack.api.GetDelivery(pb.GetDeliveryRequest(delivery_id=failed[0]), metadata=t.md)
    assert detail.delivery.status == pb.DELIVERY_STATUS_FAILED and detail.endpoint_config_version == 1
    assert not detail.auto_retry_active and [a.attempt_number for a in detail.attempts] == [1, 2]
    assert detail.attempts[0].http_status == 503 and not detail.attempts[0].manual
    assert stack.api.GetDelivery(pb.GetDeliveryRequest(delivery_id=pending), metadata=t.md).auto_retry_active
    assert code_of(lambda: stack.api.GetDelivery(pb.GetDeliveryRequest(delivery_id="dlv_nope"),
                                                 metadata=t.md)) == grpc.StatusCode.NOT_FOUND


def test_an_endpoints_history_spans_buckets_and_the_table_before_them(stack: Stack) -> None:
    """One endpoint's deliveries of a day live in 16 partitions (a hash of the
    delivery id); the listing merges them newest first and pages across them, and still reads the
    unbucketed table written before the upgrade -- a delivery made then and finished after has a
    row in each, listed once with the newer status."""
    from core.history_buckets import HISTORY_BUCKETS, bucket_of

    t = new_tenant(stack)
    e = create_endpoint(stack, t).endpoint
    now = now_ms()
    ids = [write_delivery(stack, t.tenant_id, e.endpoint_id, n, "failed", now - n * 1000) for n in range(1, 41)]
    assert len({bucket_of(d) for d in ids}) > HISTORY_BUCKETS // 2  # really spread
    old = write_delivery(stack, t.tenant_id, e.endpoint_id, 50, None, now - 50_000, legacy=True)
    created = datetime.fromtimestamp((now - 50_000) / 1000, tz=UTC)
    stack.session.execute(  # its final status, written after the upgrade: the bucketed table only
        "UPDATE endpoint_deliveries SET status='succeeded', attempt_count=2 WHERE tenant_id=%s AND endpoint_id=%s"
        " AND day=%s AND bucket=%s AND created_at=%s AND delivery_id=%s",
        (t.tenant_id, e.endpoint_id, created.date(), bucket_of(old), created, old))
    seen, cursor = [], ""
    while True:
        r = stack.api.ListDeliveries(pb.ListDeliveriesRequest(endpoint_id=e.endpoint_id, page_size=7, cursor=cursor),
                                     metadata=t.md)
        seen += list(r.deliveries)
        if not (cursor := r.next_cursor):
            break
    assert [d.delivery_id for d in seen] == [*ids, old]  # newest first, each once
    merged = seen[-1]
    assert (merged.status, merged.attempt_count, merged.event_type) == (pb.DELIVERY_STATUS_SUCCEEDED, 2, "invoice.paid")


def test_replay_publishes_a_replay_request_on_the_same_delivery(stack: Stack) -> None:
    t = new_tenant(stack)
    e = create_endpoint(stack, t).endpoint
    did = write_delivery(stack, t.tenant_id, e.endpoint_id, 1, "failed", now_ms() - 1000)
    replayed = stack.api.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=did, request_id="rq-1"),
                                        metadata=t.md)
    assert (replayed.delivery_id, replayed.request_id) == (did, "rq-1")
    [(key, value)] = consume(stack, stack.settings.kafka.replays_topic, lambda k, _v: k == did.encode())
    request = ReplayRequest.from_json(value)
    assert (request.delivery_id, request.tenant_id, request.endpoint_id, request.requested_by,
            request.request_id) == (did, t.tenant_id, e.endpoint_id, t.key_id, "rq-1")
    assert abs(request.requested_at_ms - now_ms()) < 60_000
    # Re-checked at replay time: a disabled endpoint, a read-only key, an expired delivery.
    old = write_delivery(stack, t.tenant_id, e.endpoint_id, 2, "failed", now_ms() - 31 * DAY_MS)
    assert code_of(lambda: stack.api.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=old),
                                                    metadata=t.md)) == grpc.StatusCode.FAILED_PRECONDITION
    reader = add_key(stack, t, read_only=True)
    assert code_of(lambda: stack.api.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=did),
                                                    metadata=reader.md)) == grpc.StatusCode.PERMISSION_DENIED
    stack.api.DisableEndpoint(ref(e.endpoint_id), metadata=t.md)
    assert code_of(lambda: stack.api.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=did),
                                                    metadata=t.md)) == grpc.StatusCode.FAILED_PRECONDITION


def test_replays_are_audited_in_cassandra_and_shown_with_the_delivery(stack: Stack) -> None:
    """On the real store: who (API key id), when, why; a retried request id
    audited once; a bad reason refused with INVALID_ARGUMENT and nothing written."""
    t = new_tenant(stack)
    e = create_endpoint(stack, t).endpoint
    did = write_delivery(stack, t.tenant_id, e.endpoint_id, 1, "failed", now_ms() - 1000)
    before = now_ms()
    for _ in range(2):  # the client retries its call
        stack.api.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=did, request_id="rq-audit",
                                                          reason="receiver fixed (INC-7)"), metadata=t.md)
    other = add_key(stack, t, read_only=False)
    second = stack.api.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=did), metadata=other.md)
    assert code_of(lambda: stack.api.ReplayDelivery(pb.ReplayDeliveryRequest(
        delivery_id=did, reason="x" * 501), metadata=t.md)) == grpc.StatusCode.INVALID_ARGUMENT
    detail = stack.api.GetDelivery(pb.GetDeliveryRequest(delivery_id=did), metadata=t.md)
    assert [(r.request_id, r.requested_by, r.reason) for r in detail.replays] == [
        ("rq-audit", t.key_id, "receiver fixed (INC-7)"), (second.request_id, other.key_id, "")]
    assert before - 1000 <= detail.replays[0].requested_at.ToMilliseconds() <= now_ms()


def test_bulk_recover_streams_progress_and_replays_each_failed_delivery(stack: Stack) -> None:
    t = new_tenant(stack)
    e = create_endpoint(stack, t).endpoint
    now = now_ms()
    failed = {write_delivery(stack, t.tenant_id, e.endpoint_id, n, "failed", now - n * 1000)
              for n in range(30)}
    failed.add(write_delivery(stack, t.tenant_id, e.endpoint_id, 99, "expired", now - 99_000))
    write_delivery(stack, t.tenant_id, e.endpoint_id, 100, "succeeded", now - 500)
    stream = stack.api.RecoverFailedDeliveries(pb.RecoverFailedDeliveriesRequest(
        endpoint_id=e.endpoint_id, start_time=stamp(now - 3_600_000), end_time=stamp(now + 1000)),
        metadata=t.md)
    progress = list(stream)
    assert progress[0].total == 31 and progress[0].replayed == 0
    assert [p.replayed for p in progress[1:-1]] == [25]  # a message every 25 replays
    assert (progress[-1].done, progress[-1].replayed, progress[-1].total) == (True, 31, 31)
    records = consume(stack, stack.settings.kafka.replays_topic,
                      lambda k, _v: k is not None and k.decode() in failed, count=31)
    assert {ReplayRequest.from_json(v).delivery_id for _k, v in records} == failed
    assert code_of(lambda: stack.api.RecoverFailedDeliveries(pb.RecoverFailedDeliveriesRequest(
        endpoint_id=e.endpoint_id), metadata=t.md)) == grpc.StatusCode.INVALID_ARGUMENT


# -- tenancy ---------------------------------------------------------------------------------


def test_another_tenant_gets_not_found_on_every_call(stack: Stack) -> None:
    alice, bob = new_tenant(stack), new_tenant(stack)
    e = create_endpoint(stack, alice).endpoint
    did = write_delivery(stack, alice.tenant_id, e.endpoint_id, 1, "failed", now_ms() - 1000)
    api, md, eid = stack.api, bob.md, e.endpoint_id
    calls: dict[str, Callable[[], object]] = {
        "get": lambda: api.GetEndpoint(ref(eid), metadata=md),
        "update": lambda: api.UpdateEndpoint(pb.UpdateEndpointRequest(
            endpoint_id=eid, endpoint=pb.Endpoint(description="x"),
            update_mask=FieldMask(paths=["description"])), metadata=md),
        "disable": lambda: api.DisableEndpoint(ref(eid), metadata=md),
        "enable": lambda: api.EnableEndpoint(ref(eid), metadata=md),
        "delete": lambda: api.DeleteEndpoint(ref(eid), metadata=md),
        "versions": lambda: api.ListEndpointVersions(ref(eid), metadata=md),
        "rotate": lambda: api.RotateSecret(pb.RotateSecretRequest(endpoint_id=eid), metadata=md),
        "ping": lambda: api.SendTestEvent(ref(eid), metadata=md),
        "list deliveries": lambda: api.ListDeliveries(pb.ListDeliveriesRequest(endpoint_id=eid), metadata=md),
        "get delivery": lambda: api.GetDelivery(pb.GetDeliveryRequest(delivery_id=did), metadata=md),
        "replay": lambda: api.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=did), metadata=md),
        "recover": lambda: api.RecoverFailedDeliveries(pb.RecoverFailedDeliveriesRequest(
            endpoint_id=eid, start_time=stamp(now_ms() - 60_000), end_time=stamp(now_ms())), metadata=md),
    }
    codes = {name: code_of(call) for name, call in calls.items()}
    assert codes == {name: grpc.StatusCode.NOT_FOUND for name in calls}
    assert api.ListEndpoints(pb.ListEndpointsRequest(), metadata=md).endpoints == []
    untouched = api.GetEndpoint(ref(eid), metadata=alice.md)
    assert (untouched.config_version, untouched.status) == (1, pb.ENDPOINT_STATUS_ACTIVE)


# -- dual write ------------------------------------------------------------------------------


def durable_holds(stack: Stack) -> set[tuple[str, str, int]]:
    rows = stack.session.execute("SELECT tenant_id, endpoint_id, version FROM config_holds WHERE bucket = 0")
    return {(r[0], r[1], r[2]) for r in rows}


def test_successful_publishes_leave_no_tombstones_where_every_clock_tick_reads(stack: Stack) -> None:
    """Every publish clears the endpoint's durable holds; almost always there are none. A blind
    range DELETE per publish filled the holds partition, read 20 times a second, with tombstones
    (24,264 on the local stack). Counted by Cassandra itself, in the scan's trace."""
    import re

    t = new_tenant(stack)
    for _ in range(5):
        e = create_endpoint(stack, t).endpoint
        assert e.published_version == e.config_version  # published: the clear ran
    scan = stack.session.execute("SELECT since FROM config_holds WHERE bucket = 0", trace=True)
    reads = [re.search(r"Read (\d+) live rows and (\d+) tombstone cells", ev.description)
             for ev in scan.get_query_trace().events]
    counts = [(int(m[1]), int(m[2])) for m in reads if m]
    assert counts, "the trace has no read summary to count"
    assert all(tombstones == 0 for _, tombstones in counts), counts


def test_publish_failure_is_reconciled_by_the_republisher_and_holds_the_clock(stack: Stack) -> None:
    t = new_tenant(stack)
    watermark = stack.server.publication.watermark
    stack.publisher.fail_configs = True
    try:
        e = create_endpoint(stack, t).endpoint
        created_at = now_ms()  # the change's hold began before this
        assert (e.config_version, e.published_version) == (1, 0)  # stored, Kafka not confirmed
        time.sleep(1.0)  # several republisher passes, all failing
        row = stack.session.execute(
            "SELECT config_version, published_version FROM endpoints "
            "WHERE tenant_id = %s AND endpoint_id = %s",
            (t.tenant_id, e.endpoint_id)).one()
        assert tuple(row) == (1, 0)
        # The config clock may not pass a stored-but-unpublished config: neither this process's
        # nor any other replica's, which reads the durable hold row.
        assert watermark.clock_value(now_ms()) < created_at
        assert (t.tenant_id, e.endpoint_id, 1) in durable_holds(stack)
    finally:
        stack.publisher.fail_configs = False
    wait_for(lambda: stack.api.GetEndpoint(ref(e.endpoint_id), metadata=t.md).published_version == 1)
    assert watermark.clock_value(now_ms()) >= created_at
    assert not any(h[:2] == (t.tenant_id, e.endpoint_id) for h in durable_holds(stack))

    topic = stack.settings.kafka.endpoints_topic
    [(_k, value)] = consume(stack, topic, lambda k, _v: k == e.endpoint_id.encode())
    config = parse_endpoint_topic_value(value)
    assert isinstance(config, EndpointConfig) and config.config_version == 1
    assert config.tenant_id == t.tenant_id and config.status is EndpointStatus.ACTIVE
    # The heartbeat runs on and moves past the change once it is published.
    consume(stack, topic, lambda k, v: k == CLOCK_KEY.encode()
            and isinstance(c := parse_endpoint_topic_value(v), ConfigClock)
            and c.published_at_ms > created_at)


def test_master_key_rotation_reseals_every_key_and_publishes_it(stack: Stack) -> None:
    """On the real store and topic: a control plane whose current master key is
    k2 (k1 retired) re-seals an endpoint's keys created under k1, through the admin RPC; the row
    in Cassandra and the config on the endpoints topic then carry k2 ciphertexts of the same
    secret, which a keyring holding only k2 opens: k1 can be retired."""
    import base64

    from core.secrets import Keyring, decrypt_secret, sealed_with

    t = new_tenant(stack)
    created = create_endpoint(stack, t)
    e = created.endpoint
    old_key = stack.settings.master_key.get_secret_value()
    new_key = base64.b64encode(bytes(range(7, 39))).decode()
    rotated_settings = stack.settings.model_copy(update={
        "master_key": SecretStr(new_key), "master_key_id": "k2", "retired_master_keys": {"k1": SecretStr(old_key)}})
    server = build(rotated_settings, stack.session, port=0)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            admin = rpc.AdminStub(ch)
            dry = admin.ReencryptSigningKeys(pb.ReencryptSigningKeysRequest(tenant_id=t.tenant_id, dry_run=True),
                                             metadata=stack.admin_md())
            assert (dry.current_master_key_id, dry.endpoints_reencrypted, dict(dry.keys_by_master_key)) == (
                "k2", 0, {"k1": 1})
            done = admin.ReencryptSigningKeys(pb.ReencryptSigningKeysRequest(tenant_id=t.tenant_id),
                                              metadata=stack.admin_md())
            assert (done.endpoints_reencrypted, done.keys_reencrypted, dict(done.keys_by_master_key)) == (
                1, 1, {"k2": 1})
            assert code_of(lambda: admin.ReencryptSigningKeys(pb.ReencryptSigningKeysRequest(),
                                                              metadata=t.md)) == grpc.StatusCode.PERMISSION_DENIED
    finally:
        server.stop(grace_s=2)
    got = stack.api.GetEndpoint(ref(e.endpoint_id), metadata=t.md)
    assert got.config_version == e.config_version + 1
    only_k2 = Keyring.single(base64.b64decode(new_key), "k2")
    [(_, value)] = consume(stack, stack.settings.kafka.endpoints_topic, lambda k, v: k == e.endpoint_id.encode()
                           and parse_endpoint_topic_value(v).config_version == got.config_version)
    [key] = parse_endpoint_topic_value(value).signing_keys
    assert sealed_with(key.ciphertext_b64) == "k2"
    secret = decrypt_secret(only_k2, key.ciphertext_b64, tenant_id=t.tenant_id, endpoint_id=e.endpoint_id,
                            key_version=key.version)
    assert secret == created.signing_secret



def test_subscription_authorisation_and_a_malformed_allow_list_over_grpc(stack: Stack) -> None:
    """On the real API: the admin restricts a tenant's event types; `*` and types
    outside are PERMISSION_DENIED; a malformed payload allow-list is INVALID_ARGUMENT."""
    t = new_tenant(stack)
    wide = create_endpoint(stack, t, event_types=["*"]).endpoint
    r = stack.admin.SetTenantEventTypes(pb.SetTenantEventTypesRequest(
        tenant_id=t.tenant_id, allowed_event_types=["invoice.*"]), metadata=stack.admin_md())
    assert r.tenant.event_types_restricted and list(r.tenant.allowed_event_types) == ["invoice.*"]
    assert list(r.endpoints_outside) == [wide.endpoint_id]
    request = pb.CreateEndpointRequest(url=HOOK_URL, event_types=["*"])
    assert code_of(lambda: stack.api.CreateEndpoint(request, metadata=t.md)) == grpc.StatusCode.PERMISSION_DENIED
    ok = create_endpoint(stack, t, event_types=["invoice.paid"], payload_mode="fields", payload_fields=["/id"])
    assert (ok.endpoint.payload_mode, list(ok.endpoint.payload_fields)) == ("fields", ["/id"])
    bad = pb.CreateEndpointRequest(url=HOOK_URL, event_types=["invoice.paid"], payload_mode="fields",
                                   payload_fields=["id"])
    with pytest.raises(grpc.RpcError) as err:
        stack.api.CreateEndpoint(bad, metadata=t.md)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "JSON Pointer" in err.value.details()
    assert code_of(lambda: stack.admin.SetTenantEventTypes(pb.SetTenantEventTypesRequest(
        tenant_id=t.tenant_id, unrestricted=True), metadata=t.md)) == grpc.StatusCode.PERMISSION_DENIED


# -- ordering keys -------------------------------------------------------------


def test_ordering_key_is_stored_published_and_turned_off_over_grpc(stack: Stack) -> None:
    t = new_tenant(stack)
    e = create_endpoint(stack, t, ordering_key="object_id").endpoint
    assert e.ordering_key == "object_id"
    assert stack.api.GetEndpoint(ref(e.endpoint_id), metadata=t.md).ordering_key == "object_id"
    off = stack.api.UpdateEndpoint(pb.UpdateEndpointRequest(
        endpoint_id=e.endpoint_id, endpoint=pb.Endpoint(), update_mask=FieldMask(paths=["ordering_key"])),
        metadata=t.md)
    assert (off.ordering_key, off.config_version) == ("", 2)
    configs = [parse_endpoint_topic_value(v) for _k, v in consume(
        stack, stack.settings.kafka.endpoints_topic, lambda k, _v: k == e.endpoint_id.encode(), count=2)]
    assert [(c.config_version, c.ordering_key) for c in configs if isinstance(c, EndpointConfig)] == [
        (1, "object_id"), (2, "")]
    with pytest.raises(grpc.RpcError) as err:
        create_endpoint(stack, t, ordering_key="customer.id")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "JSON Pointer" in err.value.details()


def test_versions_keep_the_payload_mode_and_ordering_key_over_grpc(stack: Stack) -> None:
    t = new_tenant(stack)
    e = create_endpoint(stack, t, ordering_key="object_id").endpoint
    stack.api.UpdateEndpoint(pb.UpdateEndpointRequest(
        endpoint_id=e.endpoint_id, endpoint=pb.Endpoint(payload_mode="fields", payload_fields=["/id"]),
        update_mask=FieldMask(paths=["payload_mode", "payload_fields", "ordering_key"])), metadata=t.md)
    v2, v1 = stack.api.ListEndpointVersions(ref(e.endpoint_id), metadata=t.md).versions
    assert (v1.payload_mode, list(v1.payload_fields), v1.ordering_key) == ("full", [], "object_id")
    assert (v2.payload_mode, list(v2.payload_fields), v2.ordering_key, v2.change) == (
        "fields", ["/id"], "", "update ordering_key,payload_fields,payload_mode")
    # A version row from before these columns were written: shown as not known, not as defaults.
    stack.session.execute(
        "UPDATE endpoint_config_versions SET payload_policy = null, ordering_key = null "
        "WHERE tenant_id = %s AND endpoint_id = %s AND config_version = 1", (t.tenant_id, e.endpoint_id))
    old = stack.api.ListEndpointVersions(ref(e.endpoint_id), metadata=t.md).versions[1]
    assert old.config_version == 1 and old.payload_mode == "" and not old.HasField("ordering_key")


def write_blocked_key(stack: Stack, tenant_id: str, endpoint_id: str, key: str, head: str) -> None:
    """A blocked_ordering_keys row as the dispatcher writes it with a failing head's record."""
    now = datetime.now(tz=UTC)
    stack.session.execute(
        "INSERT INTO blocked_ordering_keys (tenant_id, endpoint_id, bucket, ordering_key, head_delivery_id, "
        "head_event_id, head_object_version, attempts, last_http_status, last_error_class, next_attempt_at, "
        "waiting, blocked_since, updated_at) VALUES (%s, %s, %s, %s, %s, %s, 3, 2, 503, 'http_5xx', %s, 4, %s, %s)",
        (tenant_id, endpoint_id, bucket_of(key), key, head, "evt_" + key, now, now, now))


def test_blocked_keys_are_listed_and_a_head_is_skipped_over_grpc(stack: Stack) -> None:
    """On the real store and topic: blocked keys written as the job writes them are listed (one
    whose head is final meanwhile is not), a skip of the head the caller saw is audited with its
    action and lands on the replays topic as a ReplayRequest with action skip; another tenant
    gets NOT_FOUND for both calls."""
    t, other = new_tenant(stack), new_tenant(stack)
    e = create_endpoint(stack, t, ordering_key="object_id").endpoint
    heads = {f"inv_{n}": write_delivery(stack, t.tenant_id, e.endpoint_id, n, None, now_ms() - 1000)
             for n in range(3)}
    for key, head in heads.items():
        write_blocked_key(stack, t.tenant_id, e.endpoint_id, key, head)
    final = write_delivery(stack, t.tenant_id, e.endpoint_id, 9, "succeeded", now_ms() - 1000)
    write_blocked_key(stack, t.tenant_id, e.endpoint_id, "inv_final", final)  # a lost delete

    listed: list[pb.BlockedKey] = []
    token = ""
    while True:
        page = stack.api.ListBlockedKeys(pb.ListBlockedKeysRequest(
            endpoint_id=e.endpoint_id, page_size=2, page_token=token), metadata=t.md)
        listed += page.keys
        if not (token := page.next_page_token):
            break
    assert sorted(k.ordering_key for k in listed) == sorted(heads)
    assert [(bucket_of(k.ordering_key), k.ordering_key) for k in listed] == sorted(
        (bucket_of(k), k) for k in heads)  # bucket by bucket
    k0 = next(k for k in listed if k.ordering_key == "inv_0")
    assert (k0.head_delivery_id, k0.attempts, k0.last_http_status, k0.waiting) == (heads["inv_0"], 2, 503, 4)
    assert abs(k0.blocked_since.ToMilliseconds() - now_ms()) < 60_000
    assert code_of(lambda: stack.api.ListBlockedKeys(pb.ListBlockedKeysRequest(
        endpoint_id=e.endpoint_id, page_token="forged.token"), metadata=t.md)) == grpc.StatusCode.INVALID_ARGUMENT

    def skip(key: str, delivery_id: str = "", md: list[tuple[str, str]] = t.md) -> pb.SkipOrderingHeadResponse:
        return stack.api.SkipOrderingHead(pb.SkipOrderingHeadRequest(
            endpoint_id=e.endpoint_id, ordering_key=key, delivery_id=delivery_id, reason="INC-17"), metadata=md)

    with pytest.raises(grpc.RpcError) as err:
        skip("inv_0", heads["inv_1"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and heads["inv_0"] in err.value.details()
    assert code_of(lambda: skip("inv_final")) == grpc.StatusCode.NOT_FOUND
    skipped = skip("inv_0", heads["inv_0"])
    assert skipped.delivery_id == heads["inv_0"]
    [(_key, value)] = consume(stack, stack.settings.kafka.replays_topic,
                              lambda k, _v: k == heads["inv_0"].encode())
    request = ReplayRequest.from_json(value)
    assert (request.action, request.request_id, request.tenant_id, request.endpoint_id, request.requested_by) == (
        "skip", skipped.request_id, t.tenant_id, e.endpoint_id, t.key_id)
    [audit] = stack.api.GetDelivery(pb.GetDeliveryRequest(delivery_id=heads["inv_0"]), metadata=t.md).replays
    assert (audit.action, audit.request_id, audit.reason) == ("skip", skipped.request_id, "INC-17")
    row = stack.session.execute("SELECT action FROM replay_requests WHERE delivery_id = %s AND request_id = %s",
                                (heads["inv_0"], skipped.request_id)).one()
    assert row.action == "skip"

    assert code_of(lambda: stack.api.ListBlockedKeys(pb.ListBlockedKeysRequest(endpoint_id=e.endpoint_id),
                                                     metadata=other.md)) == grpc.StatusCode.NOT_FOUND
    assert code_of(lambda: skip("inv_1", md=other.md)) == grpc.StatusCode.NOT_FOUND
