"""A tenant's account of every event it sent in a window: where each one went, per event type.

Pure: built from what reconciliation already reads (:class:`core.reconcile.Inputs` and its
:class:`core.reconcile.Report`, for one tenant), plus two things reconciliation does not need --
the dead letters naming the tenant's events (reason by event id) and the skipped pairs of its
endpoints (the history's ``skipped`` rows: fan-out left the endpoint out, schema pins).
``control_plane.history.account`` reads them; this module only adds up.

Two balances, each per event type, both must hold:

* **events**: ``accepted = fanned_out + no_subscriber + dead_lettered + not_accounted``.
  *accepted*: on the events topic in the window (the broker's arrival time, as reconciliation),
  or with a fan-out snapshot there. *fanned out*: fan-out matched at least one endpoint (sent or
  skipped). *dead-lettered* (by reason): the job refused it (its schema, an id another tenant
  used); fan-out wrote an empty snapshot or none. *not accounted for*: on the topic with neither
  a snapshot nor a dead letter -- each is listed by id.
* **deliveries** of the fanned-out events:
  ``expected = succeeded + failed + expired + pending + missing``, and beside them ``skipped``
  (by reason), which are never expected. ``pending`` includes those reconciliation calls
  orphaned; each orphaned or missing delivery is listed by id with its event.

The counts are reconciliation's own (same inputs, same gaps), so the account of a tenant and
``webhookctl reconcile --tenant`` agree by construction; a test pins it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from core import reconcile as rc

UNKNOWN_TYPE = "(unknown type)"
DELIVERY_STATUSES = ("succeeded", "failed", "expired", "pending", "missing")

# Why an event or a delivery is listed: each is a reconciliation gap kind, or no snapshot at all.
NOT_FANNED_OUT = rc.EVENT_NOT_FANNED_OUT
DELIVERY_MISSING = rc.DELIVERY_MISSING
PENDING_ORPHANED = rc.PENDING_OVERDUE


@dataclass(frozen=True)
class Skipped:
    """One skipped pair from the history: the event was not sent to this endpoint, for ``reason``."""

    delivery_id: str
    event_id: str
    endpoint_id: str
    reason: str


@dataclass(frozen=True)
class Unaccounted:
    """An event (and, for a delivery, its id) the account cannot place, and why."""

    event_id: str
    event_type: str
    kind: str  # event_not_fanned_out | delivery_missing | pending_orphaned
    delivery_id: str
    detail: str


@dataclass
class TypeAccount:
    event_type: str
    accepted: int = 0
    fanned_out: int = 0
    no_subscriber: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)  # reason -> events
    not_accounted: int = 0
    deliveries: Counter[str] = field(default_factory=Counter)  # DELIVERY_STATUSES -> deliveries
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> deliveries

    @property
    def expected(self) -> int:
        return sum(self.deliveries[s] for s in DELIVERY_STATUSES)

    @property
    def events_balance(self) -> bool:
        return self.accepted == (self.fanned_out + self.no_subscriber + sum(self.dead_lettered.values())
                                 + self.not_accounted)


@dataclass
class Account:
    tenant_id: str
    since_ms: int
    until_ms: int
    types: list[TypeAccount]  # by event type name
    unaccounted: list[Unaccounted]  # every event or delivery not accounted for, by id

    @property
    def total(self) -> TypeAccount:
        t = TypeAccount("(all)")
        for a in self.types:
            t.accepted += a.accepted
            t.fanned_out += a.fanned_out
            t.no_subscriber += a.no_subscriber
            t.not_accounted += a.not_accounted
            t.dead_lettered.update(a.dead_lettered)
            t.deliveries.update(a.deliveries)
            t.skipped.update(a.skipped)
        return t

    @property
    def balanced(self) -> bool:
        """Every event placed: both balances hold and nothing is listed as unaccounted."""
        return not self.unaccounted and all(a.events_balance for a in self.types)


def build(tenant_id: str, inputs: rc.Inputs, report: rc.Report, event_types: Mapping[str, str],
          dead_letters: Mapping[str, str], skipped: Iterable[Skipped]) -> Account:
    """The account of ``tenant_id`` from reconciliation's inputs and report for that tenant.

    ``event_types``: event id -> type (the topic's events; history rows for the rest).
    ``dead_letters``: event id -> the reason the job refused it. ``skipped``: the tenant's skipped
    pairs in the window (pairs of events outside it are ignored)."""
    def type_of(event_id: str) -> str:
        return event_types.get(event_id) or UNKNOWN_TYPE

    types: dict[str, TypeAccount] = {}

    def account_of(event_id: str) -> TypeAccount:
        name = type_of(event_id)
        if name not in types:
            types[name] = TypeAccount(name)
        return types[name]

    snapshots = {s.event_id: s for s in inputs.snapshots if s.tenant_id == tenant_id}
    accepted = {e.event_id for e in inputs.topic_events if e.tenant_id == tenant_id} | set(snapshots)
    skipped_by_event: dict[str, list[Skipped]] = {}
    for s in skipped:
        if s.event_id in accepted:
            skipped_by_event.setdefault(s.event_id, []).append(s)

    unaccounted: list[Unaccounted] = []
    for event_id in sorted(accepted):
        a = account_of(event_id)
        a.accepted += 1
        snap = snapshots.get(event_id)
        pairs = skipped_by_event.get(event_id, [])
        for s in pairs:
            a.skipped[s.reason] += 1
        if event_id in dead_letters and (snap is None or not snap.endpoints):
            a.dead_lettered[dead_letters[event_id]] += 1
        elif snap is None:
            a.not_accounted += 1
            unaccounted.append(Unaccounted(event_id, a.event_type, NOT_FANNED_OUT, "",
                                           "on the topic, no fan-out snapshot and no dead letter"))
        elif snap.endpoints or pairs:
            a.fanned_out += 1
        else:
            a.no_subscriber += 1

    # Deliveries: the report's gaps say which are missing or orphaned; the rows say the rest.
    gaps = {g.id: g for g in report.gaps if g.kind in (DELIVERY_MISSING, PENDING_ORPHANED)}
    for delivery_id, (snap, _endpoint_id) in sorted(rc.expected_deliveries(snapshots.values()).items()):
        a = account_of(snap.event_id)
        row = inputs.deliveries.get(delivery_id)
        status = "missing" if row is None else (row.status or "pending")
        a.deliveries[status if status in DELIVERY_STATUSES else "pending"] += 1
        gap = gaps.get(delivery_id)
        if gap is not None:
            unaccounted.append(Unaccounted(snap.event_id, a.event_type, gap.kind, delivery_id, gap.detail))
    return Account(tenant_id, report.since_ms, report.until_ms,
                   [types[name] for name in sorted(types)], unaccounted)
