"""Reconciliation: compare what each durable boundary holds for a time window and name every gap.

Pure: the control plane (:mod:`control_plane.history.reconcile`) reads the events topic and Cassandra and
hands the rows here; this module decides what is a gap. The boundaries, in the order an event
crosses them:

1. **topic -> fan-out**: every event on the events topic whose arrival (the broker's
   LogAppendTime) is in the window has a fan-out snapshot (:class:`core.fanout.FanoutSnapshot`).
   Records the job dead-letters are counted, not gaps (the dead-letter topic holds them; all
   tenants: an unreadable record names none).
2. **snapshot -> deliveries**: every (event, endpoint) the snapshot names has a delivery row (the
   delivery id is derived from the pair, so the snapshot is also the index of an event's
   deliveries). A snapshot with no endpoints is "no subscriber".
3. **deliveries -> status**: ``expected = succeeded + failed + expired + pending + missing``.
   Pending splits three ways: *in progress* (not yet due, or due less than ``overdue_after_ms``
   ago), *held* (past due, but the job reported holding deliveries of its endpoint within
   ``overdue_after_ms``: an open breaker, a disabled endpoint, a backlog), and *orphaned* (past due
   and no job reports its endpoint: the job lost it, e.g. resubmitted without its savepoint).
4. **status -> attempts**: a succeeded delivery has a ``succeeded`` attempt row, and a delivery
   never claims more automatic attempts than it has recorded rows for.

Duplicates are not gaps: an attempt row still ``reserved`` after its delivery moved on is a
request whose outcome was never recorded -- a crash came between its reservation and its outcome,
so the request may or may not have left. They are counted as ``requests_outcome_unknown``: an
upper bound on the duplicates the window holds, each one named by its row (most reserved
requests have not left yet: docs/operating.md, reconciliation, has a measured example).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from core.fanout import FanoutSnapshot

# Gap kinds, in boundary order. Each names what is missing and what --repair does about it.
EVENT_NOT_FANNED_OUT = "event_not_fanned_out"  # re-match with current configs, write the snapshot, redrive
DELIVERY_MISSING = "delivery_missing"          # redrive from the snapshot (CHECKed: never re-sends a final one)
PENDING_OVERDUE = "pending_orphaned"           # the sweeper: redrive from the delivery row
SUCCESS_UNRECORDED = "success_without_attempt"  # report only: evidence is missing, nothing to re-send
ATTEMPTS_UNRECORDED = "attempts_without_rows"  # report only

GAP_KINDS = (EVENT_NOT_FANNED_OUT, DELIVERY_MISSING, PENDING_OVERDUE, SUCCESS_UNRECORDED, ATTEMPTS_UNRECORDED)
REPAIRABLE = frozenset({EVENT_NOT_FANNED_OUT, DELIVERY_MISSING, PENDING_OVERDUE})

SENT_OUTCOMES = frozenset({"succeeded", "retry", "failed", "expired"})


@dataclass(frozen=True)
class TopicEvent:
    event_id: str
    tenant_id: str
    arrived_at_ms: int


@dataclass(frozen=True)
class DeliveryRow:
    delivery_id: str
    event_id: str
    tenant_id: str
    endpoint_id: str
    status: str  # pending | succeeded | failed | expired
    attempt_count: int
    next_attempt_at_ms: int | None
    expires_at_ms: int | None


@dataclass(frozen=True)
class AttemptRow:
    attempt_number: int
    outcome: str  # reserved | succeeded | retry | failed | expired | not_sent
    manual: bool


@dataclass(frozen=True)
class Gap:
    kind: str
    id: str  # event_id for EVENT_NOT_FANNED_OUT, else delivery_id
    tenant_id: str
    detail: str


@dataclass
class Report:
    since_ms: int
    until_ms: int
    tenant_id: str | None
    counts: Counter[str] = field(default_factory=Counter)
    gaps: list[Gap] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.gaps

    def gap_counts(self) -> dict[str, int]:
        c = Counter(g.kind for g in self.gaps)
        return {k: c.get(k, 0) for k in GAP_KINDS}


@dataclass(frozen=True)
class Inputs:
    """What the reader found for the window (already filtered to the tenant, when one is given)."""

    topic_events: list[TopicEvent]
    dead_lettered: int  # records on the topic the job cannot parse
    snapshots: list[FanoutSnapshot]
    deliveries: Mapping[str, DeliveryRow]  # by delivery_id; absent = no row
    attempts: Mapping[str, list[AttemptRow]]  # by delivery_id
    # endpoint_id -> when a job last reported holding some of its deliveries (ms)
    backlog_reported_at: Mapping[str, int] = field(default_factory=dict)


def expected_deliveries(snapshots: Iterable[FanoutSnapshot]) -> dict[str, tuple[FanoutSnapshot, str]]:
    """delivery_id -> (its snapshot, endpoint_id)."""
    out: dict[str, tuple[FanoutSnapshot, str]] = {}
    for s in snapshots:
        for did, endpoint_id in s.delivery_ids().items():
            out[did] = (s, endpoint_id)
    return out


def reconcile(inputs: Inputs, since_ms: int, until_ms: int, tenant_id: str | None, now_ms: int,
              overdue_after_ms: int, given_up_after_ms: int | None = None) -> Report:
    """``given_up_after_ms``: how long past its deadline the job lets go of a delivery whose
    history write keeps failing (``dispatch.storage_give_up_s``); pending beyond it, no job holds
    the delivery whatever it reports about its endpoint."""
    r = Report(since_ms, until_ms, tenant_id)
    c = r.counts
    snapshot_ids = {s.event_id for s in inputs.snapshots}

    # 1. topic -> fan-out
    c["events_on_topic"] = len(inputs.topic_events)
    c["events_dead_lettered"] = inputs.dead_lettered
    for e in sorted(inputs.topic_events, key=lambda e: (e.arrived_at_ms, e.event_id)):
        if e.event_id not in snapshot_ids:
            r.gaps.append(Gap(EVENT_NOT_FANNED_OUT, e.event_id, e.tenant_id,
                              f"on the topic at {e.arrived_at_ms} ms, no fan-out snapshot"))
    c["events_fanned_out"] = len(snapshot_ids)
    c["events_without_subscriber"] = sum(1 for s in inputs.snapshots if not s.endpoints)
    c["events_released_without_clock"] = sum(1 for s in inputs.snapshots if s.degraded)

    # 2. snapshot -> deliveries
    expected = expected_deliveries(inputs.snapshots)
    c["deliveries_expected"] = len(expected)
    for did, (snap, endpoint_id) in sorted(expected.items(), key=lambda kv: (kv[1][0].arrived_at_ms, kv[0])):
        row = inputs.deliveries.get(did)
        if row is None:
            r.gaps.append(Gap(DELIVERY_MISSING, did, snap.tenant_id,
                              f"event {snap.event_id} -> endpoint {endpoint_id}: no delivery row"))
            continue
        c["deliveries_found"] += 1

        # 3. deliveries -> status
        status = row.status or "pending"
        if status == "pending":
            due = [t for t in (row.next_attempt_at_ms, row.expires_at_ms) if t is not None]
            late_by = now_ms - min(due) if due else 0
            reported = inputs.backlog_reported_at.get(endpoint_id)
            let_go = (given_up_after_ms is not None and row.expires_at_ms is not None
                      and now_ms - row.expires_at_ms > given_up_after_ms)
            if late_by <= overdue_after_ms:
                c["pending_in_progress"] += 1
            elif reported is not None and now_ms - reported <= overdue_after_ms and not let_go:
                c["pending_held"] += 1
            else:
                c["pending_orphaned"] += 1
                r.gaps.append(Gap(PENDING_OVERDUE, did, snap.tenant_id,
                                  f"pending, due {late_by // 1000} s ago, and "
                                  + ("past the job's give-up bound after its deadline" if let_go else
                                     f"no job reports holding endpoint {endpoint_id}'s deliveries")))
        else:
            c[status] += 1

        # 4. status -> attempts
        rows = inputs.attempts.get(did, [])
        recorded_auto = sum(1 for a in rows if not a.manual and a.outcome in SENT_OUTCOMES)
        c["attempts"] += sum(1 for a in rows if a.outcome in SENT_OUTCOMES)
        if status == "succeeded" and not any(a.outcome == "succeeded" for a in rows):
            r.gaps.append(Gap(SUCCESS_UNRECORDED, did, snap.tenant_id, "succeeded without a succeeded attempt row"))
        if row.attempt_count > recorded_auto:
            r.gaps.append(Gap(ATTEMPTS_UNRECORDED, did, snap.tenant_id,
                              f"attempt_count {row.attempt_count} > {recorded_auto} recorded automatic attempts"))
        # A reserved row is the next request of a delivery in progress only if it is its newest.
        latest = max((a.attempt_number for a in rows), default=None)
        c["requests_outcome_unknown"] += sum(1 for a in rows if a.outcome == "reserved"
                                        and (status != "pending" or a.attempt_number != latest))
    for kind, n in r.gap_counts().items():
        c["gap_" + kind] = n
    return r

