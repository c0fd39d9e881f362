"""The control plane's own records: what the store keeps and the service returns.

Plain frozen dataclasses with no gRPC, Kafka or Cassandra import, so the service logic is
tested with in-memory fakes. Times are unix milliseconds (UTC), like core.records.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from core.custom_headers import SealedHeader
from core.records import REPLAY, EndpointConfig, EndpointStatus, SigningKey
from core.signing import ED25519, HMAC_SHA256

# The control plane's history window (seed: deliveries stay queryable for 30 days).
HISTORY_WINDOW_MS = 30 * 24 * 3600 * 1000


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant's API key, already checked."""

    tenant_id: str
    key_id: str
    read_only: bool


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    name: str
    created_at_ms: int
    # The event types (exact, `prefix.*`, `*`) this tenant's endpoints may subscribe to, set by
    # the admin; None: unrestricted.
    allowed_event_types: tuple[str, ...] | None = None
    # New endpoints (and URL changes) must answer an ownership challenge before they receive events.
    verify_endpoints: bool = False


@dataclass(frozen=True)
class Challenge:
    """The ownership challenge an endpoint must answer: the `webhook.challenge` event sent to it
    and when answering stops counting. The token is derived, never stored (service._token)."""

    event_id: str
    expires_at_ms: int


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    tenant_id: str
    key_hash: str  # hex sha256 of the whole key; the key itself is never stored
    description: str
    read_only: bool
    created_at_ms: int
    revoked_at_ms: int | None = None


@dataclass(frozen=True)
class StoredKey:
    """One signing key version as stored: ciphertext under the master key."""

    version: int
    ciphertext_b64: str
    created_at_ms: int
    not_after_ms: int | None = None
    # ed25519 keys: the whpk_ public key receivers verify with (public, so stored in clear and
    # shown by every read); "" for an HMAC key, whose secret is shown once only.
    public_key: str = ""

    @property
    def scheme(self) -> str:
        return ED25519 if self.public_key else HMAC_SHA256

    def live_at(self, now_ms: int) -> bool:
        return self.not_after_ms is None or self.not_after_ms > now_ms


@dataclass(frozen=True)
class EndpointSpec:
    """The fields a tenant sets on an endpoint (create, or the result of an update)."""

    url: str
    description: str
    event_types: tuple[str, ...]
    rate_limit_per_s: float | None
    max_in_flight: int | None
    metadata: Mapping[str, str] = field(default_factory=dict)
    # What the endpoint is sent of each event (core.minimise): full, fields (payload_fields, JSON
    # Pointers), or thin.
    payload_mode: str = "full"
    payload_fields: tuple[str, ...] = ()
    # Where a delivery's ordering key comes from (core.ordering): "" (not ordered), "object_id"
    # or a JSON Pointer into the payload.
    ordering_key: str = ""
    # Custom headers sent with every request (core.custom_headers), as stored: secret values
    # sealed. Set from HeaderInput by the service (create, update), never from a request directly.
    headers: tuple[SealedHeader, ...] = ()


@dataclass(frozen=True)
class Endpoint:
    tenant_id: str
    endpoint_id: str
    spec: EndpointSpec
    status: EndpointStatus
    config_version: int
    published_version: int
    signing_keys: tuple[StoredKey, ...]  # newest first
    created_at_ms: int
    updated_at_ms: int
    # Who made the change that produced config_version, and what it was: the audit row of
    # this version can always be rebuilt from the endpoint row itself (see service._audit).
    changed_by: str
    change: str
    challenge: Challenge | None = None  # set while PENDING_VERIFICATION

    def live_keys(self, now_ms: int) -> tuple[StoredKey, ...]:
        return tuple(k for k in self.signing_keys if k.live_at(now_ms))

    def to_config(self, published_at_ms: int) -> EndpointConfig:
        """The record the delivery job reads from webhooks.endpoints."""
        return EndpointConfig(
            endpoint_id=self.endpoint_id,
            tenant_id=self.tenant_id,
            config_version=self.config_version,
            url=self.spec.url,
            status=self.status,
            event_types=self.spec.event_types,
            # Expired overlap keys are dropped here; the job also honours not_after_ms itself.
            signing_keys=tuple(
                SigningKey(k.version, k.ciphertext_b64, k.not_after_ms)
                for k in self.live_keys(published_at_ms)
            ),
            published_at_ms=published_at_ms,
            rate_limit_per_s=self.spec.rate_limit_per_s,
            max_in_flight=self.spec.max_in_flight,
            payload_mode=self.spec.payload_mode,
            payload_fields=self.spec.payload_fields,
            ordering_key=self.spec.ordering_key,
            headers=self.spec.headers,
        )


@dataclass(frozen=True)
class EndpointVersion:
    """Audit row: the endpoint as it was at one config version."""

    tenant_id: str
    endpoint_id: str
    config_version: int
    spec: EndpointSpec
    status: EndpointStatus
    key_versions: tuple[int, ...]
    changed_at_ms: int
    changed_by: str
    change: str
    # False for rows written before versions recorded the payload mode and ordering key
    # (2026-12-03): their spec carries the defaults there, not what the endpoint had.
    delivery_settings_known: bool = True

    @staticmethod
    def of(endpoint: Endpoint) -> EndpointVersion:
        return EndpointVersion(
            tenant_id=endpoint.tenant_id,
            endpoint_id=endpoint.endpoint_id,
            config_version=endpoint.config_version,
            spec=endpoint.spec,
            status=endpoint.status,
            key_versions=tuple(k.version for k in endpoint.signing_keys),
            changed_at_ms=endpoint.updated_at_ms,
            changed_by=endpoint.changed_by,
            change=endpoint.change,
        )


@dataclass(frozen=True)
class IdempotencyRecord:
    tenant_id: str
    request_id: str
    fingerprint: str  # sha256 of the normalised request, to refuse a reused id
    endpoint_id: str
    created_at_ms: int


class DeliveryStatus(enum.StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    # Never sent: fan-out left the endpoint out because it is pinned to other schema majors
    # (core.fanout.SkippedDelivery); the reason is in the delivery's last_error_class.
    SKIPPED = "skipped"

    @staticmethod
    def parse(value: str | None) -> DeliveryStatus:
        # The job leaves status null until the first outcome (cassandra/schema/001_history.cql).
        return DeliveryStatus(value) if value else DeliveryStatus.PENDING


# What bulk recovery replays: deliveries that ended without success.
RECOVERABLE_STATUSES = frozenset({DeliveryStatus.FAILED, DeliveryStatus.EXPIRED})
FINAL_STATUSES = frozenset({DeliveryStatus.SUCCEEDED, *RECOVERABLE_STATUSES})


@dataclass(frozen=True)
class DeliverySummary:
    delivery_id: str
    event_id: str
    tenant_id: str
    endpoint_id: str
    event_type: str
    status: DeliveryStatus
    attempt_count: int
    last_http_status: int | None
    created_at_ms: int
    updated_at_ms: int | None


@dataclass(frozen=True)
class Attempt:
    attempt_number: int
    attempt_id: str
    started_at_ms: int | None
    finished_at_ms: int | None
    http_status: int | None
    latency_ms: int | None
    outcome: str
    error_class: str
    manual: bool
    endpoint_config_version: int | None
    url: str
    signing_key_versions: tuple[int, ...]
    response_sha256: str
    response_prefix: str


# The job reserves an attempt row before each request and writes the outcome into it afterwards
# (operators/history_store.py). A reserved row that is not the delivery's next request is one
# whose outcome was never written: the worker died while the request may have been in flight.
RESERVED = "reserved"
NO_OUTCOME = "unknown (no outcome recorded)"


def attempt_outcome(outcome: str, attempt_number: int, latest_number: int) -> str:
    """The outcome to show for a stored attempt row. The latest reserved row is the next request
    (waiting for its time, or in flight now: an automatic retry or a manual replay); an older
    one was superseded without an outcome."""
    if outcome != RESERVED:
        return outcome
    return RESERVED if attempt_number == latest_number else NO_OUTCOME


@dataclass(frozen=True)
class DeliveryDetail:
    summary: DeliverySummary
    endpoint_config_version: int | None
    auto_retry_active: bool
    expires_at_ms: int | None
    next_attempt_at_ms: int | None
    last_error_class: str
    attempts: tuple[Attempt, ...]
    replays: tuple[ReplayAudit, ...] = ()  # oldest first
    # Which history tier answered: "hot" (Cassandra) or "archive" (control_plane/history/tiered.py).
    tier: str = "hot"


@dataclass(frozen=True)
class ReplayAudit:
    """Who asked for a replay (or an ordering-head skip) of a delivery, when and why (one per
    request id)."""

    delivery_id: str
    request_id: str
    tenant_id: str
    requested_by: str  # the API key id
    requested_at_ms: int
    reason: str
    action: str = REPLAY  # core.records.REPLAY or SKIP


# (bucket, ordering_key) of the last blocked key a caller saw; a listing resumes after it.
KeyPosition = tuple[int, str]


@dataclass(frozen=True)
class BlockedKey:
    """A row of blocked_ordering_keys (cassandra/schema/010_ordering_keys.cql), written by the
    job: an ordering key whose head failed and will retry, holding the key's later deliveries."""

    ordering_key: str
    bucket: int  # core.history_buckets.bucket_of(ordering_key): the listing's position
    head_delivery_id: str
    head_event_id: str
    head_object_version: int | None
    attempts: int
    last_http_status: int | None
    last_error_class: str
    next_attempt_at_ms: int | None
    waiting: int
    blocked_since_ms: int | None
    updated_at_ms: int | None

    @property
    def position(self) -> KeyPosition:
        return self.bucket, self.ordering_key


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: tuple[T, ...]
    next_cursor: str


@dataclass(frozen=True)
class RecoverProgress:
    total: int
    replayed: int
    skipped: int
    done: bool
    last_delivery_id: str
    # Failed deliveries past their replay window (core/replay_policy.py), not replayed: how many,
    # and how many under each rule (by the rule's name).
    not_allowed: int = 0
    not_allowed_by_rule: tuple[tuple[str, int], ...] = ()
