"""The storage the control plane's services use, as three small protocols.

:class:`EndpointStore`: the tables the control plane owns (cassandra/schema/002_control_plane.cql:
tenants, API keys, endpoints and their versions, config-clock holds, idempotency claims).
:class:`HistoryStore`: the delivery history the Flink job writes (001_history.cql), read here;
the control plane writes only replay audit rows. :class:`OrderingStore`: the blocked ordering
keys the job writes (010_ordering_keys.cql), read here. Cassandra implements each in a module of
this package; unit tests implement them in memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from control_plane.domain import (
    ApiKey,
    BlockedKey,
    DeliveryDetail,
    DeliveryStatus,
    DeliverySummary,
    Endpoint,
    EndpointVersion,
    IdempotencyRecord,
    KeyPosition,
    ReplayAudit,
    Tenant,
)

# (created_at_ms, delivery_id) of the last row a caller saw; iteration resumes after it.
HistoryPosition = tuple[int, str]


class EndpointStore(Protocol):
    def create_tenant(self, tenant: Tenant) -> bool: ...
    def get_tenant(self, tenant_id: str) -> Tenant | None: ...
    def set_allowed_event_types(self, tenant_id: str, types: tuple[str, ...] | None) -> bool:
        """False when the tenant does not exist."""
        ...
    def iter_tenant_ids(self) -> Iterator[str]:
        """Every tenant (a full scan, paged: admin operations only)."""
        ...
    def put_api_key(self, key: ApiKey) -> None: ...
    def get_api_key(self, key_hash: str) -> ApiKey | None: ...
    def get_api_key_by_id(self, tenant_id: str, key_id: str) -> ApiKey | None: ...
    def revoke_api_key(self, key: ApiKey, at_ms: int) -> None: ...

    def insert_endpoint(self, endpoint: Endpoint) -> bool:
        """Create the row unless the id exists; False if it did."""
        ...

    def replace_endpoint(self, endpoint: Endpoint, expected_version: int) -> bool:
        """Write a new config version iff the stored one is still ``expected_version``.

        Leaves published_version alone. False if another change won the race."""
        ...

    def mark_published(self, tenant_id: str, endpoint_id: str, version: int) -> None:
        """Raise published_version to ``version`` (never lowers it)."""
        ...

    def get_endpoint(self, tenant_id: str, endpoint_id: str) -> Endpoint | None: ...
    def list_endpoints(self, tenant_id: str, after_id: str, limit: int) -> list[Endpoint]: ...

    def put_clock_hold(self, tenant_id: str, endpoint_id: str, version: int, since_ms: int) -> None:
        """A durable hold on the config clock (see control_plane.publishing.configs)."""
        ...

    def clear_clock_holds(self, tenant_id: str, endpoint_id: str, up_to_version: int) -> None: ...

    def oldest_clock_hold_ms(self) -> int | None:
        """The earliest ``since`` of every durable hold, from every replica; None if none."""
        ...

    def iter_unpublished(self) -> Iterator[tuple[str, str]]:
        """(tenant_id, endpoint_id) of every row whose latest config Kafka has not confirmed."""
        ...

    def put_version(self, version: EndpointVersion) -> None: ...
    def list_versions(self, tenant_id: str, endpoint_id: str) -> list[EndpointVersion]: ...

    def claim_request(self, record: IdempotencyRecord) -> IdempotencyRecord:
        """Store the record unless (tenant, request_id) exists; returns whichever is stored."""
        ...


class HistoryStore(Protocol):
    def get_delivery(self, delivery_id: str) -> DeliveryDetail | None:
        """The delivery with its attempts and replay audit, or None."""
        ...

    def record_replay(self, audit: ReplayAudit, if_new: bool) -> bool:
        """Write the audit row of a replay request; False when ``if_new`` and its request id was
        recorded already (the first row is kept: a retried request is not a second replay)."""
        ...

    def iter_endpoint_deliveries(
        self,
        tenant_id: str,
        endpoint_id: str,
        start_ms: int,
        end_ms: int,
        after: HistoryPosition | None,
    ) -> Iterator[DeliverySummary]:
        """Deliveries created in [start_ms, end_ms), newest first, resuming after ``after``."""
        ...


class OrderingStore(Protocol):
    def iter_blocked_keys(self, tenant_id: str, endpoint_id: str, after: KeyPosition | None) -> Iterator[BlockedKey]:
        """The endpoint's blocked keys bucket by bucket, in key order within one, resuming after
        ``after``; rows as the job left them (a head may be final by now)."""
        ...

    def get_blocked_key(self, tenant_id: str, endpoint_id: str, ordering_key: str) -> BlockedKey | None: ...

    def delivery_statuses(self, delivery_ids: Sequence[str]) -> dict[str, DeliveryStatus]:
        """The status of each delivery that has a row (one small read each, sent at once)."""
        ...
