"""The catalog's Cassandra tables (cassandra/schema/014_event_catalog.cql, 017_catalog_unpublished.cql,
019_replay_windows.cql); statements prepared once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from control_plane.catalog.model import EventTypeEntry, ReplayRuleEntry, VersionEntry
from control_plane.publishing.catalog import Unpublished
from control_plane.store import cql

_TYPE_COLUMNS = ("tenant_id, name, description, type_group, status, sunset_at, enforcement, created_at, updated_at, "
                 "updated_by, revision, versions, replay_window")
_READS_AT_ONCE = 128


class CassandraCatalogStore:
    def __init__(self, session: Session, consistency: str = "LOCAL_QUORUM") -> None:
        self._session = session
        level = ConsistencyLevel.name_to_value[consistency]
        cql = {
            "type_get": f"SELECT {_TYPE_COLUMNS} FROM event_types WHERE tenant_id = ? AND name = ?",
            "type_list": f"SELECT {_TYPE_COLUMNS} FROM event_types WHERE tenant_id = ? AND name > ?",
            "type_list_limit": f"SELECT {_TYPE_COLUMNS} FROM event_types WHERE tenant_id = ? AND name > ? LIMIT ?",
            "type_insert": f"INSERT INTO event_types ({_TYPE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                           "IF NOT EXISTS",
            "type_replace": "UPDATE event_types SET description = ?, type_group = ?, status = ?, sunset_at = ?, "
                            "enforcement = ?, updated_at = ?, updated_by = ?, revision = ?, versions = ?, "
                            "replay_window = ? "
                            "WHERE tenant_id = ? AND name = ? IF revision = ?",
            # The write time orders a plain row's writes in Cassandra: it is the record's revision.
            "settings_get": "SELECT unknown_types, WRITETIME(unknown_types) AS revision FROM event_catalog_settings "
                            "WHERE tenant_id = ?",
            "settings_put": "INSERT INTO event_catalog_settings (tenant_id, unknown_types, updated_at, updated_by) "
                            "VALUES (?, ?, ?, ?)",
            "meta_get": "SELECT introduced_at FROM event_catalog_meta WHERE id = 'catalog'",
            "writer_get": "SELECT key_id FROM event_catalog_writers WHERE tenant_id = ? AND key_id = ?",
            "writer_put": "INSERT INTO event_catalog_writers (tenant_id, key_id, granted_at) VALUES (?, ?, ?)",
            "writer_delete": "DELETE FROM event_catalog_writers WHERE tenant_id = ? AND key_id = ?",
            "event_version": "SELECT schema_version FROM events WHERE event_id = ?",
            "event_occurred": "SELECT occurred_at FROM events WHERE event_id = ?",
            "rules_list": "SELECT pattern, replay_window, updated_at, updated_by FROM replay_rules WHERE tenant_id = ?",
            "rule_put": "INSERT INTO replay_rules (tenant_id, pattern, replay_window, updated_at, updated_by) "
                        "VALUES (?, ?, ?, ?, ?)",
            "rule_delete": "DELETE FROM replay_rules WHERE tenant_id = ? AND pattern = ?",
            "pins_put": "INSERT INTO endpoint_schema_pins (tenant_id, endpoint_id, schema_majors, updated_at, "
                        "updated_by) VALUES (?, ?, ?, ?, ?)",
            "pins_get": "SELECT endpoint_id, schema_majors FROM endpoint_schema_pins "
                        "WHERE tenant_id = ? AND endpoint_id IN ?",
            # updated_at is written with every put (WRITETIME of a non-frozen list is refused).
            "pins_read": "SELECT schema_majors, WRITETIME(updated_at) AS revision FROM endpoint_schema_pins "
                         "WHERE tenant_id = ? AND endpoint_id = ?",
            "unpublished_put": "INSERT INTO catalog_unpublished (bucket, tenant_id, kind, name, attempt, since) "
                               "VALUES (0, ?, ?, ?, ?, ?)",
            "unpublished_clear": "DELETE FROM catalog_unpublished WHERE bucket = 0 AND tenant_id = ? AND kind = ? "
                                 "AND name = ? AND attempt = ?",
            "unpublished_scan": "SELECT tenant_id, kind, name, attempt, since FROM catalog_unpublished "
                                "WHERE bucket = 0",
        }
        self._p: dict[str, PreparedStatement] = {}
        for name, text in cql.items():
            stmt = session.prepare(text)
            stmt.consistency_level = level
            self._p[name] = stmt

    def _rows(self, name: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        return list(cql.rows(self._session.execute(self._p[name].bind(params))))

    @cql.unavailable_on_driver_error
    def get_type(self, tenant_id: str, name: str) -> EventTypeEntry | None:
        rows = self._rows("type_get", (tenant_id, name))
        return _entry(rows[0]) if rows else None

    @cql.unavailable_on_driver_error
    def list_types(self, tenant_id: str, after_name: str, limit: int | None) -> list[EventTypeEntry]:
        if limit is None:
            return [_entry(r) for r in self._rows("type_list", (tenant_id, after_name))]
        return [_entry(r) for r in self._rows("type_list_limit", (tenant_id, after_name, limit))]

    @cql.unavailable_on_driver_error
    def insert_type(self, entry: EventTypeEntry) -> bool:
        rows = self._rows("type_insert", (
            entry.tenant_id, entry.name, entry.description, entry.group, entry.status, cql.dt(entry.sunset_at_ms),
            entry.enforcement, cql.dt(entry.created_at_ms), cql.dt(entry.updated_at_ms), entry.updated_by,
            entry.revision, _versions(entry), entry.replay_window))
        return bool(rows and rows[0]["[applied]"])

    @cql.unavailable_on_driver_error
    def replace_type(self, entry: EventTypeEntry, expected_revision: int) -> bool:
        rows = self._rows("type_replace", (
            entry.description, entry.group, entry.status, cql.dt(entry.sunset_at_ms), entry.enforcement,
            cql.dt(entry.updated_at_ms), entry.updated_by, entry.revision, _versions(entry), entry.replay_window,
            entry.tenant_id, entry.name, expected_revision))
        return bool(rows and rows[0]["[applied]"])

    @cql.unavailable_on_driver_error
    def read_unknown_types(self, tenant_id: str) -> tuple[str, int] | None:
        rows = self._rows("settings_get", (tenant_id,))
        return (rows[0]["unknown_types"], rows[0]["revision"] or 0) if rows else None

    @cql.unavailable_on_driver_error
    def put_unknown_types(self, tenant_id: str, policy: str, at_ms: int, by: str) -> None:
        self._rows("settings_put", (tenant_id, policy, cql.dt(at_ms), by))

    @cql.unavailable_on_driver_error
    def introduced_at_ms(self) -> int | None:
        rows = self._rows("meta_get", ())
        return cql.ms(rows[0]["introduced_at"]) if rows else None

    @cql.unavailable_on_driver_error
    def is_writer(self, tenant_id: str, key_id: str) -> bool:
        return bool(self._rows("writer_get", (tenant_id, key_id)))

    @cql.unavailable_on_driver_error
    def set_writer(self, tenant_id: str, key_id: str, allowed: bool, at_ms: int) -> None:
        if allowed:
            self._rows("writer_put", (tenant_id, key_id, cql.dt(at_ms)))
        else:
            self._rows("writer_delete", (tenant_id, key_id))

    @cql.unavailable_on_driver_error
    def schema_versions_of(self, event_ids: Sequence[str]) -> dict[str, str]:
        return self._event_cells("event_version", "schema_version", event_ids)

    @cql.unavailable_on_driver_error
    def occurred_at_of(self, event_ids: Sequence[str]) -> dict[str, int]:
        return {eid: cql.ms(v) or 0 for eid, v in self._event_cells("event_occurred", "occurred_at", event_ids).items()}

    def _event_cells(self, statement: str, column: str, event_ids: Sequence[str]) -> dict[str, Any]:
        """One column of each stored event (None cells left out), a bounded number of reads at once."""
        found: dict[str, Any] = {}
        unique = list(dict.fromkeys(event_ids))
        for i in range(0, len(unique), _READS_AT_ONCE):
            chunk = unique[i:i + _READS_AT_ONCE]
            futures = [self._session.execute_async(self._p[statement].bind((eid,))) for eid in chunk]
            for eid, future in zip(chunk, futures, strict=True):
                for row in cql.rows(future.result()):
                    if row[column] is not None:
                        found[eid] = row[column]
        return found

    @cql.unavailable_on_driver_error
    def list_replay_rules(self, tenant_id: str) -> list[ReplayRuleEntry]:
        return [ReplayRuleEntry(r["pattern"], r["replay_window"] or "", cql.ms(r["updated_at"]) or 0,
                                r["updated_by"] or "") for r in self._rows("rules_list", (tenant_id,))]

    @cql.unavailable_on_driver_error
    def put_replay_rule(self, tenant_id: str, rule: ReplayRuleEntry) -> None:
        self._rows("rule_put", (tenant_id, rule.pattern, rule.window, cql.dt(rule.updated_at_ms), rule.updated_by))

    @cql.unavailable_on_driver_error
    def delete_replay_rule(self, tenant_id: str, pattern: str) -> None:
        self._rows("rule_delete", (tenant_id, pattern))

    @cql.unavailable_on_driver_error
    def put_schema_pins(self, tenant_id: str, endpoint_id: str, majors: tuple[int, ...], at_ms: int,
                        by: str) -> None:
        self._rows("pins_put", (tenant_id, endpoint_id, list(majors), cql.dt(at_ms), by))

    @cql.unavailable_on_driver_error
    def get_schema_pins(self, tenant_id: str, endpoint_ids: Sequence[str]) -> dict[str, tuple[int, ...]]:
        # One partition (the tenant's), the ids as clustering keys: a page of endpoints is one read.
        rows = self._rows("pins_get", (tenant_id, list(endpoint_ids)))
        return {r["endpoint_id"]: tuple(r["schema_majors"] or ()) for r in rows}

    @cql.unavailable_on_driver_error
    def read_schema_pins(self, tenant_id: str, endpoint_id: str) -> tuple[tuple[int, ...], int] | None:
        rows = self._rows("pins_read", (tenant_id, endpoint_id))
        return (tuple(sorted(rows[0]["schema_majors"] or ())), rows[0]["revision"] or 0) if rows else None

    @cql.unavailable_on_driver_error
    def put_unpublished(self, item: Unpublished) -> None:
        self._rows("unpublished_put", (item.tenant_id, item.kind, item.name, item.attempt, cql.dt(item.since_ms)))

    @cql.unavailable_on_driver_error
    def clear_unpublished(self, item: Unpublished) -> None:
        self._rows("unpublished_clear", (item.tenant_id, item.kind, item.name, item.attempt))

    @cql.unavailable_on_driver_error
    def list_unpublished(self) -> list[Unpublished]:
        # One partition with a row per change in flight or left unpublished: normally empty.
        return [Unpublished(r["tenant_id"], r["kind"], r["name"], r["attempt"], cql.ms(r["since"]) or 0)
                for r in self._rows("unpublished_scan", ())]


def _versions(entry: EventTypeEntry) -> dict[str, str]:
    return {str(v.version): v.stored() for v in entry.versions}


def _entry(row: dict[str, Any]) -> EventTypeEntry:
    versions = sorted((VersionEntry.from_stored(k, v) for k, v in (row["versions"] or {}).items()),
                      key=lambda v: v.version)
    return EventTypeEntry(
        tenant_id=row["tenant_id"], name=row["name"], description=row["description"] or "",
        group=row["type_group"] or "", status=row["status"] or "active", sunset_at_ms=cql.ms(row["sunset_at"]),
        enforcement=row["enforcement"] or "reject", created_at_ms=cql.ms(row["created_at"]) or 0,
        updated_at_ms=cql.ms(row["updated_at"]) or 0, updated_by=row["updated_by"] or "",
        revision=row["revision"] or 0, versions=tuple(versions), replay_window=row.get("replay_window") or "")
