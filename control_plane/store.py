"""Persistence for the control plane: the interfaces the service uses, and Cassandra behind them.

Small protocols: :class:`EndpointStore` (tables of cassandra/schema/002_control_plane.cql,
owned by the control plane), :class:`HistoryStore` (delivery history the Flink job writes,
cassandra/schema/001_history.cql, read-only here) and :class:`OrderingStore` (the blocked
ordering keys the job writes, 010_ordering_keys.cql, read-only here). Unit tests implement
them in memory.
Driver failures surface as :class:`errors.Unavailable` so no driver type leaks upwards.
"""

from __future__ import annotations

import calendar
import functools
import heapq
import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any, ParamSpec, Protocol, TypeVar

from cassandra import ConsistencyLevel, DriverException, WriteTimeout, WriteType
from cassandra.cluster import NoHostAvailable, Session
from cassandra.protocol import ErrorMessage
from cassandra.query import PreparedStatement

from control_plane.domain import (
    ApiKey,
    Attempt,
    BlockedKey,
    Challenge,
    DeliveryDetail,
    DeliveryStatus,
    DeliverySummary,
    Endpoint,
    EndpointSpec,
    EndpointVersion,
    IdempotencyRecord,
    KeyPosition,
    ReplayAudit,
    StoredKey,
    Tenant,
    attempt_outcome,
)
from control_plane.errors import Unavailable
from core import history_rows
from core.custom_headers import SealedHeader
from core.history_buckets import HISTORY_BUCKETS, bucket_of
from core.records import REPLAY, EndpointStatus

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


def _ms(value: datetime | None) -> int | None:
    # The driver returns naive UTC datetimes.
    if value is None:
        return None
    return calendar.timegm(value.utctimetuple()) * 1000 + value.microsecond // 1000


def _dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def _keys_to_json(keys: Sequence[StoredKey]) -> str:
    return json.dumps(
        [
            {
                "version": k.version,
                "ciphertext_b64": k.ciphertext_b64,
                "created_at_ms": k.created_at_ms,
                "not_after_ms": k.not_after_ms,
                **({"public_key": k.public_key} if k.public_key else {}),
            }
            for k in keys
        ]
    )


def _keys_from_json(raw: str | None) -> tuple[StoredKey, ...]:
    return tuple(
        StoredKey(
            version=int(d["version"]),
            ciphertext_b64=str(d["ciphertext_b64"]),
            created_at_ms=int(d["created_at_ms"]),
            not_after_ms=None if d.get("not_after_ms") is None else int(d["not_after_ms"]),
            public_key=str(d.get("public_key") or ""),
        )
        for d in json.loads(raw or "[]")
    )


def _spec(row: dict[str, Any]) -> EndpointSpec:
    policy = json.loads(row.get("payload_policy") or "{}")
    return EndpointSpec(
        url=row["url"] or "",
        description=row["description"] or "",
        event_types=tuple(row["event_types"] or ()),
        rate_limit_per_s=row["rate_limit_per_s"],
        max_in_flight=row["max_in_flight"],
        metadata=dict(row["metadata"] or {}),
        payload_mode=str(policy.get("mode") or "full"),
        payload_fields=tuple(policy.get("fields") or ()),
        ordering_key=str(row.get("ordering_key") or ""),  # null: written before ordering existed
        headers=tuple(SealedHeader.from_dict(h) for h in json.loads(row.get("headers") or "[]")),
    )


def _headers_json(s: EndpointSpec) -> str | None:
    """Custom headers as one JSON column (secret values sealed); None (no column) for none."""
    return json.dumps([h.to_dict() for h in s.headers]) if s.headers else None


def _payload_policy(s: EndpointSpec) -> str | None:
    """The payload mode and allow-list as one JSON column; None (no column) for full payloads."""
    if s.payload_mode == "full":
        return None
    return json.dumps({"mode": s.payload_mode, "fields": list(s.payload_fields)})


def _endpoint(row: dict[str, Any]) -> Endpoint:
    return Endpoint(
        tenant_id=row["tenant_id"],
        endpoint_id=row["endpoint_id"],
        spec=_spec(row),
        status=EndpointStatus(row["status"]),
        config_version=row["config_version"],
        published_version=row["published_version"] or 0,
        signing_keys=_keys_from_json(row["signing_keys"]),
        created_at_ms=_ms(row["created_at"]) or 0,
        updated_at_ms=_ms(row["updated_at"]) or 0,
        changed_by=row["changed_by"] or "",
        change=row["change"] or "",
        challenge=_challenge(row.get("challenge")),
    )


def _challenge_json(c: Challenge | None) -> str | None:
    return None if c is None else json.dumps({"event_id": c.event_id, "expires_at_ms": c.expires_at_ms})


def _challenge(raw: str | None) -> Challenge | None:
    if not raw:
        return None
    d = json.loads(raw)
    return Challenge(str(d["event_id"]), int(d["expires_at_ms"]))


def _summary(row: dict[str, Any], tenant_id: str, endpoint_id: str) -> DeliverySummary:
    return DeliverySummary(
        delivery_id=row["delivery_id"],
        event_id=row["event_id"] or "",
        tenant_id=tenant_id,
        endpoint_id=endpoint_id,
        event_type=row["event_type"] or "",
        status=DeliveryStatus.parse(row["status"]),
        attempt_count=row["attempt_count"] or 0,
        last_http_status=row["last_http_status"],
        created_at_ms=_ms(row["created_at"]) or 0,
        updated_at_ms=_ms(row["updated_at"]),
    )


def _attempt(row: dict[str, Any], latest_number: int) -> Attempt:
    # A reserved row has only its number, id, endpoint, config version and reservation time.
    return Attempt(
        attempt_number=row["attempt_number"],
        attempt_id=row["attempt_id"] or "",
        started_at_ms=_ms(row["started_at"]),
        finished_at_ms=_ms(row["finished_at"]),
        http_status=row["http_status"],
        latency_ms=row["latency_ms"],
        outcome=attempt_outcome(row["outcome"] or "", row["attempt_number"], latest_number),
        error_class=row["error_class"] or "",
        manual=bool(row["manual"]),
        endpoint_config_version=row["endpoint_config_version"],
        url=row["url"] or "",
        signing_key_versions=tuple(row["signing_key_versions"] or ()),
        response_sha256=row["response_sha256"] or "",
        response_prefix=row["response_prefix"] or "",
    )


P = ParamSpec("P")
R = TypeVar("R")


_CAS_WRITE_UNKNOWN = 0x1700
# An LWT whose outcome Cassandra could not learn is tried this many times in all before the call
# answers UNAVAILABLE, backing off a random 25-200 ms, doubling: on a ring, concurrent creates of
# one tenant (one partition of `endpoints`) contend in Paxos and a few of them come back unknown.
_LWT_TRIES = 4
_LWT_BACKOFF_S = (0.025, 0.2)


def _outcome_unknown(exc: BaseException) -> bool:
    """Cassandra could not tell whether this LWT applied: a CAS write timeout, or protocol v5's
    CAS_WRITE_UNKNOWN (a proposal a minority accepted), which has no driver class."""
    if isinstance(exc, WriteTimeout):
        return getattr(exc, "write_type", None) == WriteType.CAS
    return isinstance(exc, ErrorMessage) and exc.code == _CAS_WRITE_UNKNOWN


def _unavailable_on_driver_error(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (DriverException, NoHostAvailable) as exc:
            # A timed-out LWT may or may not have applied; the caller retries and the version
            # check (or the idempotency key) makes the retry safe.
            raise Unavailable(f"storage unavailable ({type(exc).__name__}); retry") from exc
        except ErrorMessage as exc:
            # Protocol v5's CAS_WRITE_UNKNOWN (a proposal a minority of replicas accepted; seen on a
            # 3-node ring under concurrent creates) has no driver class: the same as a timed-out LWT.
            if not _outcome_unknown(exc):
                raise
            raise Unavailable("storage unavailable (LWT result unknown); retry") from exc

    return wrapper


_ENDPOINT_COLUMNS = (
    "tenant_id, endpoint_id, url, description, event_types, rate_limit_per_s, max_in_flight, "
    "metadata, status, config_version, published_version, signing_keys, created_at, updated_at, "
    "changed_by, change, payload_policy, challenge, ordering_key, headers"
)
# Point reads sent at once by one call: a page of 1,000 keys must not take a connection's
# every stream.
_READS_AT_ONCE = 128
_BLOCKED_COLUMNS = (
    "bucket, ordering_key, head_delivery_id, head_event_id, head_object_version, attempts, last_http_status, "
    "last_error_class, next_attempt_at, waiting, blocked_since, updated_at"
)
_VERSION_COLUMNS = (
    "tenant_id, endpoint_id, config_version, url, description, event_types, rate_limit_per_s, "
    "max_in_flight, metadata, status, key_versions, changed_at, changed_by, change, payload_policy, ordering_key, "
    "headers"
)
# A version's payload_policy is never null once written (011_version_delivery_settings.cql): null
# marks a row from before the column, whose payload mode and ordering key are not known.
_FULL_POLICY = json.dumps({"mode": "full"})


class CassandraStore:
    """Both stores over one driver session on keyspace ``webhooks``; statements prepared once."""

    def __init__(self, session: Session, scan_page_size: int = 500, consistency: str = "LOCAL_QUORUM") -> None:
        self._session = session
        self._scan_page_size = scan_page_size
        # Whatever session it is given (the server's, a test's), reads and writes at the
        # configured level (cassandra.consistency); LWTs at LOCAL_SERIAL (the server's profile).
        self._consistency = ConsistencyLevel.name_to_value[consistency]
        self._p = self._prepare_all()

    def _prepare_all(self) -> dict[str, PreparedStatement]:
        cql = {
            "tenant_insert": "INSERT INTO tenants (tenant_id, name, created_at, verify_endpoints) VALUES (?, ?, ?, ?) "
            "IF NOT EXISTS",
            "tenant_get": "SELECT tenant_id, name, created_at, allowed_event_types, verify_endpoints FROM tenants "
            "WHERE tenant_id = ?",
            "tenant_set_types": "UPDATE tenants SET allowed_event_types = ? WHERE tenant_id = ? IF EXISTS",
            "tenant_ids": "SELECT tenant_id FROM tenants",
            "key_insert": "INSERT INTO api_keys (key_hash, key_id, tenant_id, description, "
            "read_only, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            "key_by_tenant_insert": "INSERT INTO api_keys_by_tenant (tenant_id, key_id, key_hash) "
            "VALUES (?, ?, ?)",
            "key_get": "SELECT key_hash, key_id, tenant_id, description, read_only, created_at, "
            "revoked_at FROM api_keys WHERE key_hash = ?",
            "key_hash_by_id": "SELECT key_hash FROM api_keys_by_tenant WHERE tenant_id = ? "
            "AND key_id = ?",
            "key_revoke": "UPDATE api_keys SET revoked_at = ? WHERE key_hash = ?",
            "endpoint_insert": f"INSERT INTO endpoints ({_ENDPOINT_COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
            "endpoint_replace": "UPDATE endpoints SET url = ?, description = ?, event_types = ?, "
            "rate_limit_per_s = ?, max_in_flight = ?, metadata = ?, status = ?, "
            "config_version = ?, signing_keys = ?, updated_at = ?, changed_by = ?, change = ?, "
            "payload_policy = ?, challenge = ?, ordering_key = ?, headers = ? "
            "WHERE tenant_id = ? AND endpoint_id = ? IF config_version = ?",
            "endpoint_mark": "UPDATE endpoints SET published_version = ? "
            "WHERE tenant_id = ? AND endpoint_id = ? IF published_version < ?",
            "endpoint_get": f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints "
            "WHERE tenant_id = ? AND endpoint_id = ?",
            "endpoint_list": f"SELECT {_ENDPOINT_COLUMNS} FROM endpoints "
            "WHERE tenant_id = ? AND endpoint_id > ? LIMIT ?",
            "hold_put": "INSERT INTO config_holds (bucket, tenant_id, endpoint_id, version, since) "
            "VALUES (0, ?, ?, ?, ?)",
            "hold_clear": "DELETE FROM config_holds WHERE bucket = 0 AND tenant_id = ? AND endpoint_id = ? "
            "AND version <= ?",
            "hold_find": "SELECT version FROM config_holds WHERE bucket = 0 AND tenant_id = ? AND endpoint_id = ? "
            "AND version <= ? LIMIT 1",
            "hold_scan": "SELECT since FROM config_holds WHERE bucket = 0",
            "endpoint_scan": "SELECT tenant_id, endpoint_id, config_version, published_version "
            "FROM endpoints",
            "version_insert": f"INSERT INTO endpoint_config_versions ({_VERSION_COLUMNS}) VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            "version_list": f"SELECT {_VERSION_COLUMNS} FROM endpoint_config_versions "
            "WHERE tenant_id = ? AND endpoint_id = ?",
            "request_claim": "INSERT INTO endpoint_idempotency (tenant_id, request_id, "
            "fingerprint, endpoint_id, created_at) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS",
            # Both schemas: delivery_history first, the old tables for what it lacks (core/history_rows.py).
            "delivery_get": history_rows.SELECT_NEW,
            "delivery_get_old": history_rows.SELECT_OLD_DELIVERY,
            "attempts_get_old": history_rows.SELECT_OLD_ATTEMPTS,
            "replay_insert": "INSERT INTO replay_requests (delivery_id, request_id, tenant_id, requested_by, "
            "requested_at, reason, action) VALUES (?, ?, ?, ?, ?, ?, ?)",
            "replay_insert_new": "INSERT INTO replay_requests (delivery_id, request_id, tenant_id, requested_by, "
            "requested_at, reason, action) VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
            "delivery_status": "SELECT status FROM delivery_history WHERE delivery_id = ? LIMIT 1",
            "delivery_status_old": "SELECT status FROM deliveries WHERE delivery_id = ?",
            "blocked_keys": f"SELECT {_BLOCKED_COLUMNS} FROM blocked_ordering_keys "
            "WHERE tenant_id = ? AND endpoint_id = ? AND bucket = ? AND ordering_key > ?",
            "blocked_key": f"SELECT {_BLOCKED_COLUMNS} FROM blocked_ordering_keys "
            "WHERE tenant_id = ? AND endpoint_id = ? AND bucket = ? AND ordering_key = ?",
            "replays_get": "SELECT * FROM replay_requests WHERE delivery_id = ?",
            "deliveries_by_day": "SELECT created_at, delivery_id, event_id, event_type, status, "
            "attempt_count, last_http_status, updated_at FROM deliveries_by_endpoint "
            "WHERE tenant_id = ? AND endpoint_id = ? AND day = ? "
            "AND created_at >= ? AND created_at <= ?",
            "deliveries_by_day_bucket": "SELECT created_at, delivery_id, event_id, event_type, status, "
            "attempt_count, last_http_status, updated_at FROM endpoint_deliveries "
            "WHERE tenant_id = ? AND endpoint_id = ? AND day = ? AND bucket = ? "
            "AND created_at >= ? AND created_at <= ?",
        }
        prepared = {}
        for name, text in cql.items():
            stmt = self._session.prepare(text)
            stmt.consistency_level = self._consistency
            prepared[name] = stmt
        return prepared

    # -- tenants and keys -------------------------------------------------------------------

    @_unavailable_on_driver_error
    def create_tenant(self, tenant: Tenant) -> bool:
        return self._applied(
            "tenant_insert", (tenant.tenant_id, tenant.name, _dt(tenant.created_at_ms), tenant.verify_endpoints),
            mine=lambda row: row.get("name") == tenant.name and _ms(row.get("created_at")) == tenant.created_at_ms,
        )

    @_unavailable_on_driver_error
    def iter_tenant_ids(self) -> Iterator[str]:
        return iter([row["tenant_id"] for row in self._execute("tenant_ids", (), fetch_size=self._scan_page_size)])

    @_unavailable_on_driver_error
    def get_tenant(self, tenant_id: str) -> Tenant | None:
        row = self._first("tenant_get", (tenant_id,))
        if row is None:
            return None
        allowed = row.get("allowed_event_types")  # null: unrestricted (a restriction is never empty)
        return Tenant(row["tenant_id"], row["name"] or "", _ms(row["created_at"]) or 0,
                      None if not allowed else tuple(allowed), bool(row.get("verify_endpoints")))

    @_unavailable_on_driver_error
    def set_allowed_event_types(self, tenant_id: str, types: tuple[str, ...] | None) -> bool:
        return self._applied("tenant_set_types", (None if types is None else list(types), tenant_id))

    @_unavailable_on_driver_error
    def put_api_key(self, key: ApiKey) -> None:
        # Hash row first: a key listed by tenant but not authenticating is harmless; the reverse
        # would be a key nobody can revoke.
        self._session.execute(
            self._p["key_insert"],
            (key.key_hash, key.key_id, key.tenant_id, key.description, key.read_only,
             _dt(key.created_at_ms), _dt(key.revoked_at_ms)),
        )
        self._session.execute(
            self._p["key_by_tenant_insert"], (key.tenant_id, key.key_id, key.key_hash)
        )

    @_unavailable_on_driver_error
    def get_api_key(self, key_hash: str) -> ApiKey | None:
        row = self._first("key_get", (key_hash,))
        if row is None:
            return None
        return ApiKey(
            key_id=row["key_id"],
            tenant_id=row["tenant_id"],
            key_hash=row["key_hash"],
            description=row["description"] or "",
            read_only=bool(row["read_only"]),
            created_at_ms=_ms(row["created_at"]) or 0,
            revoked_at_ms=_ms(row["revoked_at"]),
        )

    @_unavailable_on_driver_error
    def get_api_key_by_id(self, tenant_id: str, key_id: str) -> ApiKey | None:
        row = self._first("key_hash_by_id", (tenant_id, key_id))
        return None if row is None else self.get_api_key(row["key_hash"])

    @_unavailable_on_driver_error
    def revoke_api_key(self, key: ApiKey, at_ms: int) -> None:
        self._session.execute(self._p["key_revoke"], (_dt(at_ms), key.key_hash))

    # -- endpoints --------------------------------------------------------------------------

    @_unavailable_on_driver_error
    def insert_endpoint(self, endpoint: Endpoint) -> bool:
        s = endpoint.spec
        keys = _keys_to_json(endpoint.signing_keys)
        return self._applied(
            "endpoint_insert",
            (endpoint.tenant_id, endpoint.endpoint_id, s.url, s.description, list(s.event_types),
             s.rate_limit_per_s, s.max_in_flight, dict(s.metadata), endpoint.status.value,
             endpoint.config_version, endpoint.published_version,
             keys, _dt(endpoint.created_at_ms),
             _dt(endpoint.updated_at_ms), endpoint.changed_by, endpoint.change, _payload_policy(s),
             _challenge_json(endpoint.challenge), s.ordering_key or None, _headers_json(s)),
            # The row a retry finds is this call's own when it holds the key sealed here (its
            # nonce is this call's): the create answers with its secret, not as a repeat.
            mine=lambda row: row.get("signing_keys") == keys,
        )

    @_unavailable_on_driver_error
    def replace_endpoint(self, endpoint: Endpoint, expected_version: int) -> bool:
        s = endpoint.spec
        keys = _keys_to_json(endpoint.signing_keys)

        def mine(_row: dict[str, Any]) -> bool:
            # A failed condition returns only config_version: read the row to tell this call's
            # write (its version, time and sealed keys) from a concurrent change's.
            now = self._first("endpoint_get", (endpoint.tenant_id, endpoint.endpoint_id))
            return (now is not None and now["config_version"] == endpoint.config_version
                    and now["signing_keys"] == keys and _ms(now["updated_at"]) == endpoint.updated_at_ms)

        return self._applied(
            "endpoint_replace",
            (s.url, s.description, list(s.event_types), s.rate_limit_per_s, s.max_in_flight,
             dict(s.metadata), endpoint.status.value, endpoint.config_version,
             _keys_to_json(endpoint.signing_keys), _dt(endpoint.updated_at_ms),
             endpoint.changed_by, endpoint.change, _payload_policy(s), _challenge_json(endpoint.challenge),
             s.ordering_key or None, _headers_json(s), endpoint.tenant_id, endpoint.endpoint_id,
             expected_version),
            mine=mine,
        )

    @_unavailable_on_driver_error
    def mark_published(self, tenant_id: str, endpoint_id: str, version: int) -> None:
        # Not applied = someone already marked this version or a later one: nothing to do.
        self._applied("endpoint_mark", (version, tenant_id, endpoint_id, version))

    @_unavailable_on_driver_error
    def put_clock_hold(self, tenant_id: str, endpoint_id: str, version: int, since_ms: int) -> None:
        self._session.execute(self._p["hold_put"], (tenant_id, endpoint_id, version, _dt(since_ms)))

    @_unavailable_on_driver_error
    def clear_clock_holds(self, tenant_id: str, endpoint_id: str, up_to_version: int) -> None:
        # Every publish clears, and holds are rare: a blind DELETE left a range tombstone per
        # publish in the one partition every clock tick scans (20 reads/s) -- 24,000 of them on
        # the local stack, on the way to Cassandra's tombstone_failure_threshold. Delete only
        # what is there.
        if self._first("hold_find", (tenant_id, endpoint_id, up_to_version)) is not None:
            self._session.execute(self._p["hold_clear"], (tenant_id, endpoint_id, up_to_version))

    @_unavailable_on_driver_error
    def oldest_clock_hold_ms(self) -> int | None:
        # One partition with a row per unpublished change: normally empty.
        sinces = [_ms(r["since"]) for r in self._execute("hold_scan", ())]
        return min((s for s in sinces if s is not None), default=None)

    @_unavailable_on_driver_error
    def get_endpoint(self, tenant_id: str, endpoint_id: str) -> Endpoint | None:
        row = self._first("endpoint_get", (tenant_id, endpoint_id))
        return None if row is None else _endpoint(row)

    @_unavailable_on_driver_error
    def list_endpoints(self, tenant_id: str, after_id: str, limit: int) -> list[Endpoint]:
        return [_endpoint(r) for r in self._execute("endpoint_list", (tenant_id, after_id, limit))]

    def iter_unpublished(self) -> Iterator[tuple[str, str]]:
        # A paged full scan of a small table (one row per endpoint, four columns read). If the
        # endpoint count grows past what a scan every few seconds can afford, replace this with
        # a dirty-endpoints outbox table written before each change.
        try:
            for row in self._execute("endpoint_scan", (), fetch_size=self._scan_page_size):
                if (row["published_version"] or 0) < (row["config_version"] or 0):
                    yield row["tenant_id"], row["endpoint_id"]
        except (DriverException, NoHostAvailable) as exc:
            raise Unavailable(f"storage unavailable ({type(exc).__name__}); retry") from exc

    @_unavailable_on_driver_error
    def put_version(self, version: EndpointVersion) -> None:
        s = version.spec
        self._session.execute(
            self._p["version_insert"],
            (version.tenant_id, version.endpoint_id, version.config_version, s.url,
             s.description, list(s.event_types), s.rate_limit_per_s, s.max_in_flight,
             dict(s.metadata), version.status.value, list(version.key_versions),
             _dt(version.changed_at_ms), version.changed_by, version.change,
             _payload_policy(s) or _FULL_POLICY, s.ordering_key, _headers_json(s)),
        )

    @_unavailable_on_driver_error
    def list_versions(self, tenant_id: str, endpoint_id: str) -> list[EndpointVersion]:
        return [
            EndpointVersion(
                tenant_id=r["tenant_id"],
                endpoint_id=r["endpoint_id"],
                config_version=r["config_version"],
                spec=_spec(r),
                status=EndpointStatus(r["status"]),
                key_versions=tuple(r["key_versions"] or ()),
                changed_at_ms=_ms(r["changed_at"]) or 0,
                changed_by=r["changed_by"] or "",
                change=r["change"] or "",
                delivery_settings_known=r["payload_policy"] is not None,
            )
            for r in self._execute("version_list", (tenant_id, endpoint_id))
        ]

    @_unavailable_on_driver_error
    def claim_request(self, record: IdempotencyRecord) -> IdempotencyRecord:
        # A retry after an unknown outcome that finds the claim taken finds this call's own when
        # it applied: the same fingerprint and endpoint id, which the service treats as a repeat.
        row, _ = self._lwt(
            "request_claim",
            (record.tenant_id, record.request_id, record.fingerprint, record.endpoint_id,
             _dt(record.created_at_ms)),
        )
        if row is None or row["[applied]"]:
            return record
        # A failed IF NOT EXISTS returns the existing row.
        return IdempotencyRecord(
            tenant_id=row["tenant_id"],
            request_id=row["request_id"],
            fingerprint=row["fingerprint"],
            endpoint_id=row["endpoint_id"],
            created_at_ms=_ms(row["created_at"]) or 0,
        )

    # -- delivery history (read-only) -------------------------------------------------------

    @_unavailable_on_driver_error
    def get_delivery(self, delivery_id: str) -> DeliveryDetail | None:
        row, rows = history_rows.split(self._execute("delivery_get", (delivery_id,)))
        if history_rows.needs_old(row):
            old, old_attempts = self._execute_all([("delivery_get_old", (delivery_id,)),
                                                   ("attempts_get_old", (delivery_id,))])
            row, rows = history_rows.merge(row, rows, next(old, None), old_attempts)
        if row is None:
            return None
        return delivery_detail(row, rows, self._execute("replays_get", (delivery_id,)))

    @_unavailable_on_driver_error
    def record_replay(self, audit: ReplayAudit, if_new: bool) -> bool:
        params = (audit.delivery_id, audit.request_id, audit.tenant_id, audit.requested_by,
                  _dt(audit.requested_at_ms), audit.reason, audit.action)
        if if_new:
            return self._applied("replay_insert_new", params)
        self._first("replay_insert", params)
        return True

    def iter_endpoint_deliveries(
        self,
        tenant_id: str,
        endpoint_id: str,
        start_ms: int,
        end_ms: int,
        after: HistoryPosition | None,
    ) -> Iterator[DeliverySummary]:
        # Partitions per (endpoint, UTC day, bucket): walk the days newest first, reading a day's
        # buckets at once and merging them newest first (core.history_buckets). The unbucketed
        # table written before them is read beside them until its rows expire; a delivery made
        # before an upgrade and finished after it has a row in both, merged into one.
        upper_ms = end_ms - 1 if after is None else min(end_ms - 1, after[0])
        if upper_ms < start_ms:
            return
        day = _utc_day(upper_ms)
        first_day = _utc_day(start_ms)
        try:
            while day >= first_day:
                bounds = (_dt(start_ms), _dt(upper_ms))
                sources = self._execute_all(
                    [("deliveries_by_day", (tenant_id, endpoint_id, day, *bounds))]
                    + [("deliveries_by_day_bucket", (tenant_id, endpoint_id, day, b, *bounds))
                       for b in range(HISTORY_BUCKETS)])
                for row in _merged(sources):
                    summary = _summary(row, tenant_id, endpoint_id)
                    if after is not None and summary.created_at_ms == after[0] \
                            and summary.delivery_id <= after[1]:
                        continue  # same millisecond as the cursor, already returned
                    yield summary
                day -= timedelta(days=1)
        except (DriverException, NoHostAvailable) as exc:
            raise Unavailable(f"storage unavailable ({type(exc).__name__}); retry") from exc

    # -- blocked ordering keys (read-only) ---------------------------------------------------

    def iter_blocked_keys(self, tenant_id: str, endpoint_id: str, after: KeyPosition | None) -> Iterator[BlockedKey]:
        # One partition per (endpoint, bucket), read in bucket order and only as far as the
        # caller reads: a page of a few keys costs up to 16 small queries, a page of a huge
        # endpoint reads no bucket beyond the one it ends in.
        first, last_key = after if after is not None else (0, "")
        try:
            for bucket in range(first, HISTORY_BUCKETS):
                params = (tenant_id, endpoint_id, bucket, last_key if bucket == first else "")
                for row in self._execute("blocked_keys", params, fetch_size=self._scan_page_size):
                    yield _blocked(row)
        except (DriverException, NoHostAvailable) as exc:
            raise Unavailable(f"storage unavailable ({type(exc).__name__}); retry") from exc

    @_unavailable_on_driver_error
    def get_blocked_key(self, tenant_id: str, endpoint_id: str, ordering_key: str) -> BlockedKey | None:
        row = self._first("blocked_key", (tenant_id, endpoint_id, bucket_of(ordering_key), ordering_key))
        return None if row is None else _blocked(row)

    @_unavailable_on_driver_error
    def delivery_statuses(self, delivery_ids: Sequence[str]) -> dict[str, DeliveryStatus]:
        unique = list(dict.fromkeys(delivery_ids))
        found: dict[str, DeliveryStatus] = {}
        for i in range(0, len(unique), _READS_AT_ONCE):
            chunk = unique[i:i + _READS_AT_ONCE]
            results = self._execute_all([("delivery_status", (did,)) for did in chunk])
            found.update((did, DeliveryStatus.parse(row["status"]))
                         for did, rows in zip(chunk, results, strict=True) for row in rows
                         if row["status"] is not None)
            # Written before delivery_history existed (and not touched since): the old table.
            older = [did for did in chunk if did not in found]
            if older:
                results = self._execute_all([("delivery_status_old", (did,)) for did in older])
                found.update((did, DeliveryStatus.parse(row["status"]))
                             for did, rows in zip(older, results, strict=True) for row in rows)
        return found

    # -- helpers ----------------------------------------------------------------------------

    def _execute_all(self, queries: list[tuple[str, Sequence[Any]]]) -> list[Iterator[dict[str, Any]]]:
        """Several reads sent at once (first pages in parallel), each then read like _execute."""
        futures = []
        for name, params in queries:
            bound = self._p[name].bind(params)
            bound.fetch_size = self._scan_page_size
            futures.append(self._session.execute_async(bound))
        return [_rows(f.result()) for f in futures]

    def _execute(
        self, name: str, params: Sequence[Any], fetch_size: int | None = None
    ) -> Iterator[dict[str, Any]]:
        bound = self._p[name].bind(params)
        if fetch_size is not None:
            bound.fetch_size = fetch_size
        yield from _rows(self._session.execute(bound))

    def _first(self, name: str, params: Sequence[Any]) -> dict[str, Any] | None:
        return next(self._execute(name, params), None)

    def _applied(self, name: str, params: Sequence[Any],
                 mine: Callable[[dict[str, Any]], bool] | None = None) -> bool:
        """Whether an LWT applied (sent by _lwt). If an earlier try's outcome was unknown and a
        later one finds the condition false, ``mine`` says whether the row it found is that try's
        own write (applied after all) or another writer's."""
        row, unknown = self._lwt(name, params)
        if row is None:
            return False
        if row["[applied]"]:
            return True
        return unknown and mine is not None and mine(row)

    def _lwt(self, name: str, params: Sequence[Any]) -> tuple[dict[str, Any] | None, bool]:
        """An LWT's result row, and whether a try before it came back unknown. A try whose
        outcome Cassandra could not learn is sent again (the condition makes that safe) up to
        _LWT_TRIES times; still unknown after the last, the error is raised (UNAVAILABLE at the
        API: the caller retries)."""
        backoff = _LWT_BACKOFF_S[0]
        for attempt in range(_LWT_TRIES):
            try:
                return self._first(name, params), attempt > 0
            except (WriteTimeout, ErrorMessage) as exc:
                if not _outcome_unknown(exc) or attempt == _LWT_TRIES - 1:
                    raise
                self._sleep(random.uniform(backoff / 2, backoff))
                backoff = min(backoff * 2, _LWT_BACKOFF_S[1])
        raise AssertionError("unreachable")  # the last try returns or raises

    _sleep = staticmethod(time.sleep)


def _rows(result: Any) -> Iterator[dict[str, Any]]:
    # Whatever row factory the shared session uses, rows become dicts keyed by column name.
    names = result.column_names
    for row in result:
        yield row if isinstance(row, dict) else dict(zip(names, row, strict=True))


def _merged(sources: list[Iterator[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """Rows of several newest-first partitions as one newest-first stream; rows of one delivery
    from the old and the new table (sources[0] is the old one) come out as one, the new table's
    cells winning where it has them."""
    def keyed(i: int, src: Iterator[dict[str, Any]]) -> Iterator[tuple[tuple[int, str, int], dict[str, Any]]]:
        for r in src:
            yield (-(_ms(r["created_at"]) or 0), r["delivery_id"], i), r

    streams = [keyed(i, src) for i, src in enumerate(sources)]
    pending: dict[str, Any] | None = None
    for (_, did, _), row in heapq.merge(*streams, key=lambda kv: kv[0]):
        if pending is not None and pending["delivery_id"] == did:
            pending = {**pending, **{k: v for k, v in row.items() if v is not None}}
            continue
        if pending is not None:
            yield pending
        pending = row
    if pending is not None:
        yield pending


def delivery_detail(row: dict[str, Any], attempt_rows: list[dict[str, Any]], replay_rows: Iterable[dict[str, Any]],
                    tier: str = "hot") -> DeliveryDetail:
    """A delivery from its rows (core/history_rows.py's shape), whichever tier they came from."""
    latest = history_rows.top_attempt_number(attempt_rows)
    return DeliveryDetail(
        summary=_summary(row, row["tenant_id"] or "", row["endpoint_id"] or ""),
        endpoint_config_version=row["endpoint_config_version"],
        auto_retry_active=bool(row["auto_retry_active"]),
        expires_at_ms=_ms(row["expires_at"]),
        next_attempt_at_ms=_ms(row["next_attempt_at"]),
        last_error_class=row["last_error_class"] or "",
        attempts=tuple(_attempt(a, latest) for a in attempt_rows),
        replays=tuple(sorted((_replay(r) for r in replay_rows), key=lambda r: (r.requested_at_ms, r.request_id))),
        tier=tier,
    )


def _replay(row: dict[str, Any]) -> ReplayAudit:
    return ReplayAudit(delivery_id=row["delivery_id"], request_id=row["request_id"], tenant_id=row["tenant_id"] or "",
                       requested_by=row["requested_by"] or "", requested_at_ms=_ms(row["requested_at"]) or 0,
                       reason=row["reason"] or "", action=row.get("action") or REPLAY)  # null: written before skips


def _blocked(row: dict[str, Any]) -> BlockedKey:
    return BlockedKey(
        ordering_key=row["ordering_key"],
        bucket=row["bucket"],
        head_delivery_id=row["head_delivery_id"] or "",
        head_event_id=row["head_event_id"] or "",
        head_object_version=row["head_object_version"],
        attempts=row["attempts"] or 0,
        last_http_status=row["last_http_status"],
        last_error_class=row["last_error_class"] or "",
        next_attempt_at_ms=_ms(row["next_attempt_at"]),
        waiting=row["waiting"] or 0,
        blocked_since_ms=_ms(row["blocked_since"]),
        updated_at_ms=_ms(row["updated_at"]),
    )


def _utc_day(ms: int) -> date:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).date()
