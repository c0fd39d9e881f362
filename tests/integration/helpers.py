"""Small helpers shared by the integration tests: tenants, endpoints, events, polling."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

import grpc
from confluent_kafka import Producer

from control_plane.api import pb, rpc
from core.records import EventRecord
from core.settings import Settings

T = TypeVar("T")


def auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def new_tenant(channel: grpc.Channel, settings: Settings) -> tuple[str, str]:
    """A fresh tenant and an API key for it, made with the admin credential."""
    admin = rpc.AdminStub(channel)
    md = auth(settings.control_plane.admin_token.get_secret_value())
    tenant_id = f"ten_{uuid.uuid4().hex[:10]}"
    admin.CreateTenant(pb.CreateTenantRequest(tenant_id=tenant_id, name="test tenant"), metadata=md)
    key = admin.CreateApiKey(pb.CreateApiKeyRequest(tenant_id=tenant_id, description="tests"), metadata=md)
    return tenant_id, key.api_key


def event(tenant_id: str, event_type: str, payload: bytes, target: str | None = None) -> EventRecord:
    return EventRecord(
        event_id=f"evt_{uuid.uuid4().hex}", tenant_id=tenant_id, event_type=event_type,
        schema_version="2026-01-01", object_id="obj_1", object_version=1,
        occurred_at_ms=int(time.time() * 1000), payload=payload, target_endpoint_id=target)


def produce(settings: Settings, records: list[bytes], keys: list[str] | None = None,
            topic: str | None = None) -> None:
    p = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "enable.idempotence": True})
    for i, value in enumerate(records):
        p.produce(topic or settings.kafka.events_topic, value=value, key=keys[i] if keys else None)
    assert p.flush(30) == 0, "Kafka did not acknowledge every record"


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
