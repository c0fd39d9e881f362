"""The :class:`~control_plane.store.protocols.EndpointStore` in Cassandra: the tables the control
plane owns (tenants, API keys, endpoints and their versions, config-clock holds, idempotency
claims; cassandra/schema/002_control_plane.cql and later). Creates and version changes are
lightweight transactions (control_plane.store.cql); rows map to the domain in
control_plane.store.endpoint_rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from control_plane.domain import ApiKey, Endpoint, EndpointVersion, IdempotencyRecord, Tenant
from control_plane.store.cql import DRIVER_ERRORS, CassandraTables, dt, ms, unavailable, unavailable_on_driver_error
from control_plane.store.endpoint_rows import (
    FULL_POLICY,
    challenge_json,
    endpoint_from_row,
    headers_json,
    keys_to_json,
    payload_policy_json,
    version_from_row,
)

_ENDPOINT_COLUMNS = (
    "tenant_id, endpoint_id, url, description, event_types, rate_limit_per_s, max_in_flight, "
    "metadata, status, config_version, published_version, signing_keys, created_at, updated_at, "
    "changed_by, change, payload_policy, challenge, ordering_key, headers"
)
_VERSION_COLUMNS = (
    "tenant_id, endpoint_id, config_version, url, description, event_types, rate_limit_per_s, "
    "max_in_flight, metadata, status, key_versions, changed_at, changed_by, change, payload_policy, ordering_key, "
    "headers"
)


class CassandraEndpointStore(CassandraTables):
    STATEMENTS = {
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
    }

    # -- tenants and keys -------------------------------------------------------------------

    @unavailable_on_driver_error
    def create_tenant(self, tenant: Tenant) -> bool:
        return self._applied(
            "tenant_insert", (tenant.tenant_id, tenant.name, dt(tenant.created_at_ms), tenant.verify_endpoints),
            mine=lambda row: row.get("name") == tenant.name and ms(row.get("created_at")) == tenant.created_at_ms,
        )

    @unavailable_on_driver_error
    def iter_tenant_ids(self) -> Iterator[str]:
        return iter([row["tenant_id"] for row in self._execute("tenant_ids", (), fetch_size=self._scan_page_size)])

    @unavailable_on_driver_error
    def get_tenant(self, tenant_id: str) -> Tenant | None:
        row = self._first("tenant_get", (tenant_id,))
        if row is None:
            return None
        allowed = row.get("allowed_event_types")  # null: unrestricted (a restriction is never empty)
        return Tenant(row["tenant_id"], row["name"] or "", ms(row["created_at"]) or 0,
                      None if not allowed else tuple(allowed), bool(row.get("verify_endpoints")))

    @unavailable_on_driver_error
    def set_allowed_event_types(self, tenant_id: str, types: tuple[str, ...] | None) -> bool:
        return self._applied("tenant_set_types", (None if types is None else list(types), tenant_id))

    @unavailable_on_driver_error
    def put_api_key(self, key: ApiKey) -> None:
        # Hash row first: a key listed by tenant but not authenticating is harmless; the reverse
        # would be a key nobody can revoke.
        self._session.execute(
            self._p["key_insert"],
            (key.key_hash, key.key_id, key.tenant_id, key.description, key.read_only,
             dt(key.created_at_ms), dt(key.revoked_at_ms)),
        )
        self._session.execute(
            self._p["key_by_tenant_insert"], (key.tenant_id, key.key_id, key.key_hash)
        )

    @unavailable_on_driver_error
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
            created_at_ms=ms(row["created_at"]) or 0,
            revoked_at_ms=ms(row["revoked_at"]),
        )

    @unavailable_on_driver_error
    def get_api_key_by_id(self, tenant_id: str, key_id: str) -> ApiKey | None:
        row = self._first("key_hash_by_id", (tenant_id, key_id))
        return None if row is None else self.get_api_key(row["key_hash"])

    @unavailable_on_driver_error
    def revoke_api_key(self, key: ApiKey, at_ms: int) -> None:
        self._session.execute(self._p["key_revoke"], (dt(at_ms), key.key_hash))

    # -- endpoints --------------------------------------------------------------------------

    @unavailable_on_driver_error
    def insert_endpoint(self, endpoint: Endpoint) -> bool:
        s = endpoint.spec
        keys = keys_to_json(endpoint.signing_keys)
        return self._applied(
            "endpoint_insert",
            (endpoint.tenant_id, endpoint.endpoint_id, s.url, s.description, list(s.event_types),
             s.rate_limit_per_s, s.max_in_flight, dict(s.metadata), endpoint.status.value,
             endpoint.config_version, endpoint.published_version,
             keys, dt(endpoint.created_at_ms),
             dt(endpoint.updated_at_ms), endpoint.changed_by, endpoint.change, payload_policy_json(s),
             challenge_json(endpoint.challenge), s.ordering_key or None, headers_json(s)),
            # The row a retry finds is this call's own when it holds the key sealed here (its
            # nonce is this call's): the create answers with its secret, not as a repeat.
            mine=lambda row: row.get("signing_keys") == keys,
        )

    @unavailable_on_driver_error
    def replace_endpoint(self, endpoint: Endpoint, expected_version: int) -> bool:
        s = endpoint.spec
        keys = keys_to_json(endpoint.signing_keys)

        def mine(_row: dict[str, Any]) -> bool:
            # A failed condition returns only config_version: read the row to tell this call's
            # write (its version, time and sealed keys) from a concurrent change's.
            now = self._first("endpoint_get", (endpoint.tenant_id, endpoint.endpoint_id))
            return (now is not None and now["config_version"] == endpoint.config_version
                    and now["signing_keys"] == keys and ms(now["updated_at"]) == endpoint.updated_at_ms)

        return self._applied(
            "endpoint_replace",
            (s.url, s.description, list(s.event_types), s.rate_limit_per_s, s.max_in_flight,
             dict(s.metadata), endpoint.status.value, endpoint.config_version,
             keys_to_json(endpoint.signing_keys), dt(endpoint.updated_at_ms),
             endpoint.changed_by, endpoint.change, payload_policy_json(s), challenge_json(endpoint.challenge),
             s.ordering_key or None, headers_json(s), endpoint.tenant_id, endpoint.endpoint_id,
             expected_version),
            mine=mine,
        )

    @unavailable_on_driver_error
    def mark_published(self, tenant_id: str, endpoint_id: str, version: int) -> None:
        # Not applied = someone already marked this version or a later one: nothing to do.
        self._applied("endpoint_mark", (version, tenant_id, endpoint_id, version))

    @unavailable_on_driver_error
    def put_clock_hold(self, tenant_id: str, endpoint_id: str, version: int, since_ms: int) -> None:
        self._session.execute(self._p["hold_put"], (tenant_id, endpoint_id, version, dt(since_ms)))

    @unavailable_on_driver_error
    def clear_clock_holds(self, tenant_id: str, endpoint_id: str, up_to_version: int) -> None:
        # Every publish clears, and holds are rare: a blind DELETE left a range tombstone per
        # publish in the one partition every clock tick scans, on the way to Cassandra's
        # tombstone_failure_threshold (docs/performance.md#the-control-planes-tables). Delete
        # only what is there.
        if self._first("hold_find", (tenant_id, endpoint_id, up_to_version)) is not None:
            self._session.execute(self._p["hold_clear"], (tenant_id, endpoint_id, up_to_version))

    @unavailable_on_driver_error
    def oldest_clock_hold_ms(self) -> int | None:
        # One partition with a row per unpublished change: normally empty.
        sinces = [ms(r["since"]) for r in self._execute("hold_scan", ())]
        return min((s for s in sinces if s is not None), default=None)

    @unavailable_on_driver_error
    def get_endpoint(self, tenant_id: str, endpoint_id: str) -> Endpoint | None:
        row = self._first("endpoint_get", (tenant_id, endpoint_id))
        return None if row is None else endpoint_from_row(row)

    @unavailable_on_driver_error
    def list_endpoints(self, tenant_id: str, after_id: str, limit: int) -> list[Endpoint]:
        return [endpoint_from_row(r) for r in self._execute("endpoint_list", (tenant_id, after_id, limit))]

    def iter_unpublished(self) -> Iterator[tuple[str, str]]:
        # A paged full scan of a small table (one row per endpoint, four columns read). If the
        # endpoint count grows past what a scan every few seconds can afford, replace this with
        # a dirty-endpoints outbox table written before each change.
        try:
            for row in self._execute("endpoint_scan", (), fetch_size=self._scan_page_size):
                if (row["published_version"] or 0) < (row["config_version"] or 0):
                    yield row["tenant_id"], row["endpoint_id"]
        except DRIVER_ERRORS as exc:
            raise unavailable(exc) from exc

    @unavailable_on_driver_error
    def put_version(self, version: EndpointVersion) -> None:
        s = version.spec
        self._session.execute(
            self._p["version_insert"],
            (version.tenant_id, version.endpoint_id, version.config_version, s.url,
             s.description, list(s.event_types), s.rate_limit_per_s, s.max_in_flight,
             dict(s.metadata), version.status.value, list(version.key_versions),
             dt(version.changed_at_ms), version.changed_by, version.change,
             payload_policy_json(s) or FULL_POLICY, s.ordering_key, headers_json(s)),
        )

    @unavailable_on_driver_error
    def list_versions(self, tenant_id: str, endpoint_id: str) -> list[EndpointVersion]:
        return [version_from_row(r) for r in self._execute("version_list", (tenant_id, endpoint_id))]

    @unavailable_on_driver_error
    def claim_request(self, record: IdempotencyRecord) -> IdempotencyRecord:
        # A retry after an unknown outcome that finds the claim taken finds this call's own when
        # it applied: the same fingerprint and endpoint id, which the service treats as a repeat.
        row, _ = self._lwt(
            "request_claim",
            (record.tenant_id, record.request_id, record.fingerprint, record.endpoint_id,
             dt(record.created_at_ms)),
        )
        if row is None or row["[applied]"]:
            return record
        # A failed IF NOT EXISTS returns the existing row.
        return IdempotencyRecord(
            tenant_id=row["tenant_id"],
            request_id=row["request_id"],
            fingerprint=row["fingerprint"],
            endpoint_id=row["endpoint_id"],
            created_at_ms=ms(row["created_at"]) or 0,
        )
