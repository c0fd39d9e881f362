"""Where the control plane keeps operational events' state: each tenant's auto-disable setting and
each failing endpoint's clock (cassandra/schema/021_operational_events.cql), and the events of
people's changes not yet confirmed by Kafka (023_pending_operational_events.cql), behind a small
protocol with an in-memory twin for unit tests. Driver failures surface as
:class:`control_plane.errors.Unavailable`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from cassandra import ConsistencyLevel, DriverException
from cassandra.cluster import NoHostAvailable, Session

from control_plane.errors import Unavailable
from core.ingest import IngestError, parse_event
from core.operational_events import AutoDisablePolicy, ChangeMark, FailingClock
from core.records import EventRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredPolicy:
    policy: AutoDisablePolicy
    updated_at_ms: int | None = None  # None: never set, the default
    updated_by: str = ""


@dataclass(frozen=True)
class PendingEvent:
    """The event of a person's change, recorded before the change's write (``since_ms``) and
    deleted once Kafka confirmed it; ``mark`` names the write it announces. ``attempt`` keeps
    apart two requests announcing one event id (a concurrent change to the same state)."""

    tenant_id: str
    endpoint_id: str
    attempt: str
    since_ms: int
    mark: ChangeMark
    event: EventRecord


class OperationalStore(Protocol):
    def get_policy(self, tenant_id: str) -> StoredPolicy: ...
    def set_policy(self, tenant_id: str, policy: AutoDisablePolicy, by: str, at_ms: int) -> None: ...
    def get_clock(self, tenant_id: str, endpoint_id: str) -> FailingClock | None: ...
    def put_clock(self, clock: FailingClock) -> None: ...
    def delete_clock(self, tenant_id: str, endpoint_id: str) -> None: ...
    def iter_clocks(self) -> Iterator[FailingClock]:
        """Every failing endpoint (a scan of a small table)."""
        ...
    def put_pending(self, pending: PendingEvent) -> None: ...
    def delete_pending(self, pending: PendingEvent) -> None: ...
    def iter_pending(self) -> Iterator[PendingEvent]:
        """Every pending event (one small partition: normally empty)."""
        ...


class InMemoryOperationalStore:
    def __init__(self) -> None:
        self.policies: dict[str, StoredPolicy] = {}
        self.clocks: dict[tuple[str, str], FailingClock] = {}
        self.pending: dict[tuple[str, str, str], PendingEvent] = {}

    def get_policy(self, tenant_id: str) -> StoredPolicy:
        return self.policies.get(tenant_id, StoredPolicy(AutoDisablePolicy()))

    def set_policy(self, tenant_id: str, policy: AutoDisablePolicy, by: str, at_ms: int) -> None:
        self.policies[tenant_id] = StoredPolicy(policy, at_ms, by)

    def get_clock(self, tenant_id: str, endpoint_id: str) -> FailingClock | None:
        return self.clocks.get((tenant_id, endpoint_id))

    def put_clock(self, clock: FailingClock) -> None:
        self.clocks[(clock.tenant_id, clock.endpoint_id)] = clock

    def delete_clock(self, tenant_id: str, endpoint_id: str) -> None:
        self.clocks.pop((tenant_id, endpoint_id), None)

    def iter_clocks(self) -> Iterator[FailingClock]:
        return iter(list(self.clocks.values()))

    def put_pending(self, pending: PendingEvent) -> None:
        self.pending[_pending_key(pending)] = pending

    def delete_pending(self, pending: PendingEvent) -> None:
        self.pending.pop(_pending_key(pending), None)

    def iter_pending(self) -> Iterator[PendingEvent]:
        return iter(list(self.pending.values()))


def _pending_key(p: PendingEvent) -> tuple[str, str, str]:
    return (p.tenant_id, p.event.event_id, p.attempt)


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _ms(value: datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    # round, not int: a float a hair below the whole millisecond must not read back 1 ms early.
    return round(value.timestamp() * 1000)


class CassandraOperationalStore:
    def __init__(self, session: Session, consistency: str = "LOCAL_QUORUM") -> None:
        self._session = session
        cql = {
            "policy_get": "SELECT enabled, window_s, warn_at, dry_run, updated_at, updated_by "
            "FROM auto_disable_settings WHERE tenant_id = ?",
            "policy_put": "INSERT INTO auto_disable_settings (tenant_id, enabled, window_s, warn_at, dry_run, "
            "updated_at, updated_by) VALUES (?, ?, ?, ?, ?, ?, ?)",
            "clock_get": "SELECT tenant_id, endpoint_id, since, episode, warned, ended, quiet FROM failing_endpoints "
            "WHERE tenant_id = ? AND endpoint_id = ?",
            "clock_put": "INSERT INTO failing_endpoints (tenant_id, endpoint_id, since, episode, warned, ended, quiet) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            "clock_delete": "DELETE FROM failing_endpoints WHERE tenant_id = ? AND endpoint_id = ?",
            "clock_scan": "SELECT tenant_id, endpoint_id, since, episode, warned, ended, quiet FROM failing_endpoints",
            "pending_put": f"INSERT INTO pending_operational_events ({_PENDING_COLUMNS}) "
            "VALUES (0, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            "pending_delete": "DELETE FROM pending_operational_events WHERE bucket = 0 AND tenant_id = ? "
            "AND event_id = ? AND attempt = ?",
            "pending_scan": f"SELECT {_PENDING_COLUMNS} FROM pending_operational_events WHERE bucket = 0",
        }
        level = ConsistencyLevel.name_to_value[consistency]
        self._p = {}
        for name, text in cql.items():
            stmt = session.prepare(text)
            stmt.consistency_level = level
            self._p[name] = stmt

    def _run(self, name: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        try:
            result = self._session.execute(self._p[name], params)
        except (DriverException, NoHostAvailable) as exc:
            raise Unavailable(f"Cassandra: {exc}") from exc
        # Whatever row factory the shared session uses, rows become dicts keyed by column name.
        names = result.column_names or []
        return [r if isinstance(r, dict) else dict(zip(names, r, strict=True)) for r in result]

    def get_policy(self, tenant_id: str) -> StoredPolicy:
        rows = self._run("policy_get", (tenant_id,))
        if not rows:
            return StoredPolicy(AutoDisablePolicy())
        r = rows[0]
        default = AutoDisablePolicy()
        policy = AutoDisablePolicy(
            window_s=r["window_s"] if r["window_s"] is not None else default.window_s,
            warn_at=tuple(r["warn_at"]) if r["warn_at"] is not None else (),
            dry_run=bool(r["dry_run"]), enabled=r["enabled"] is not False)
        return StoredPolicy(policy, _ms(r["updated_at"]), r["updated_by"] or "")

    def set_policy(self, tenant_id: str, policy: AutoDisablePolicy, by: str, at_ms: int) -> None:
        self._run("policy_put", (tenant_id, policy.enabled, policy.window_s, list(policy.warn_at), policy.dry_run,
                                 _dt(at_ms), by))

    def get_clock(self, tenant_id: str, endpoint_id: str) -> FailingClock | None:
        rows = self._run("clock_get", (tenant_id, endpoint_id))
        return _clock(rows[0]) if rows else None

    def put_clock(self, clock: FailingClock) -> None:
        self._run("clock_put", (clock.tenant_id, clock.endpoint_id, _dt(clock.since_ms), clock.episode, clock.warned,
                                clock.ended, clock.quiet))

    def delete_clock(self, tenant_id: str, endpoint_id: str) -> None:
        self._run("clock_delete", (tenant_id, endpoint_id))

    def iter_clocks(self) -> Iterator[FailingClock]:
        return iter([_clock(r) for r in self._run("clock_scan", ())])

    def put_pending(self, pending: PendingEvent) -> None:
        m = pending.mark
        self._run("pending_put", (pending.tenant_id, pending.event.event_id, pending.attempt, pending.endpoint_id,
                                  m.config_version, m.changed_by, m.change, _dt(pending.since_ms),
                                  pending.event.to_json()))

    def delete_pending(self, pending: PendingEvent) -> None:
        self._run("pending_delete", (pending.tenant_id, pending.event.event_id, pending.attempt))

    def iter_pending(self) -> Iterator[PendingEvent]:
        return iter([p for p in map(pending_from_row, self._run("pending_scan", ())) if p is not None])


_PENDING_COLUMNS = ("bucket, tenant_id, event_id, attempt, endpoint_id, config_version, changed_by, change, since, "
                    "record")


def pending_from_row(r: dict[str, Any]) -> PendingEvent | None:
    """A pending event as stored; None (logged) for a record this code cannot read, which the
    sweep then leaves to its TTL rather than fail every pass on it."""
    try:
        # The record was written by this control plane: its payload is the JSON body it built.
        event = parse_event(bytes(r["record"]), max_payload_bytes=1 << 30, check_payload=False)
    except (IngestError, TypeError) as exc:
        log.error("pending operational event %s of endpoint %s unreadable, left to expire: %s", r.get("event_id"),
                  r.get("endpoint_id"), exc)
        return None
    mark = ChangeMark(config_version=r["config_version"], changed_by=r["changed_by"] or "", change=r["change"] or "")
    return PendingEvent(tenant_id=r["tenant_id"], endpoint_id=r["endpoint_id"], attempt=r["attempt"],
                        since_ms=_ms(r["since"]) or 0, mark=mark, event=event)


def _clock(r: dict[str, Any]) -> FailingClock:
    return FailingClock(tenant_id=r["tenant_id"], endpoint_id=r["endpoint_id"], since_ms=_ms(r["since"]) or 0,
                        episode=r["episode"] or 0, warned=r["warned"] or 0, ended=bool(r["ended"]),
                        quiet=bool(r["quiet"]))
