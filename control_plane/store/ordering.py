"""The :class:`~control_plane.store.protocols.OrderingStore` in Cassandra: the blocked ordering keys
the Flink job writes (cassandra/schema/010_ordering_keys.cql), and the status of the deliveries
they hold, read-only here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from control_plane.domain import BlockedKey, DeliveryStatus, KeyPosition
from control_plane.store.cql import DRIVER_ERRORS, CassandraTables, ms, unavailable, unavailable_on_driver_error
from core.history_buckets import HISTORY_BUCKETS, bucket_of

_BLOCKED_COLUMNS = (
    "bucket, ordering_key, head_delivery_id, head_event_id, head_object_version, attempts, last_http_status, "
    "last_error_class, next_attempt_at, waiting, blocked_since, updated_at"
)
# Point reads sent at once by one call: a page of 1,000 keys must not take a connection's
# every stream.
_READS_AT_ONCE = 128


class CassandraOrderingStore(CassandraTables):
    STATEMENTS = {
        "delivery_status": "SELECT status FROM delivery_history WHERE delivery_id = ? LIMIT 1",
        "delivery_status_old": "SELECT status FROM deliveries WHERE delivery_id = ?",
        "blocked_keys": f"SELECT {_BLOCKED_COLUMNS} FROM blocked_ordering_keys "
        "WHERE tenant_id = ? AND endpoint_id = ? AND bucket = ? AND ordering_key > ?",
        "blocked_key": f"SELECT {_BLOCKED_COLUMNS} FROM blocked_ordering_keys "
        "WHERE tenant_id = ? AND endpoint_id = ? AND bucket = ? AND ordering_key = ?",
    }

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
        except DRIVER_ERRORS as exc:
            raise unavailable(exc) from exc

    @unavailable_on_driver_error
    def get_blocked_key(self, tenant_id: str, endpoint_id: str, ordering_key: str) -> BlockedKey | None:
        row = self._first("blocked_key", (tenant_id, endpoint_id, bucket_of(ordering_key), ordering_key))
        return None if row is None else _blocked(row)

    @unavailable_on_driver_error
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
        next_attempt_at_ms=ms(row["next_attempt_at"]),
        waiting=row["waiting"] or 0,
        blocked_since_ms=ms(row["blocked_since"]),
        updated_at_ms=ms(row["updated_at"]),
    )
