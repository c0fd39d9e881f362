"""core.account: every event of a tenant placed, per type; its counts are reconciliation's own."""

from __future__ import annotations

import pytest

from core import account as acc
from core import reconcile as rc
from core.fanout import FanoutSnapshot
from core.records import delivery_id_for

NOW = 1_700_000_000_000
MIN = 60_000
OVERDUE = 15 * MIN
TENANT = "t_1"


def snap(event_id: str, *endpoints: str, tenant: str = TENANT) -> FanoutSnapshot:
    return FanoutSnapshot(event_id, tenant, NOW - 30 * MIN, tuple((e, 1) for e in sorted(endpoints)))


def row(event_id: str, endpoint_id: str, status: str = "succeeded", next_at: int | None = None,
        tenant: str = TENANT) -> rc.DeliveryRow:
    return rc.DeliveryRow(delivery_id_for(event_id, endpoint_id), event_id, tenant, endpoint_id, status,
                          1 if status != "pending" else 0, next_at, NOW + 23 * 60 * MIN)


def attempts_for(rows: list[rc.DeliveryRow]) -> dict[str, list[rc.AttemptRow]]:
    return {r.delivery_id: [rc.AttemptRow(1, "succeeded" if r.status == "succeeded" else "failed", False)]
            for r in rows if r.status != "pending"}


def inputs(topic: list[tuple[str, str]], snapshots: list[FanoutSnapshot], rows: list[rc.DeliveryRow]) -> rc.Inputs:
    return rc.Inputs(topic_events=[rc.TopicEvent(e, t, NOW - 30 * MIN) for e, t in topic], dead_lettered=0,
                     snapshots=snapshots, deliveries={r.delivery_id: r for r in rows}, attempts=attempts_for(rows))


def account(i: rc.Inputs, types: dict[str, str], dead: dict[str, str] | None = None,
            skipped: list[acc.Skipped] | None = None) -> tuple[acc.Account, rc.Report]:
    report = rc.reconcile(i, NOW - 60 * MIN, NOW, TENANT, NOW, OVERDUE)
    return acc.build(TENANT, i, report, types, dead or {}, skipped or []), report


def test_a_window_where_everything_went_somewhere_balances_per_type() -> None:
    rows = [row("e1", "ep_a"), row("e1", "ep_b", "failed"), row("e3", "ep_a", "pending", next_at=NOW + MIN),
            row("e5", "ep_a", "expired")]
    i = inputs([(e, TENANT) for e in ("e1", "e2", "e3", "e4", "e5")],
               [snap("e1", "ep_a", "ep_b"), snap("e2"), snap("e3", "ep_a"), snap("e4"), snap("e5", "ep_a")], rows)
    types = {"e1": "invoice.paid", "e2": "invoice.paid", "e3": "user.created", "e4": "invoice.paid",
             "e5": "user.created"}
    a, _ = account(i, types, dead={"e4": "schema_invalid"})
    by = {t.event_type: t for t in a.types}
    assert [t.event_type for t in a.types] == ["invoice.paid", "user.created"]
    paid, user = by["invoice.paid"], by["user.created"]
    assert (paid.accepted, paid.fanned_out, paid.no_subscriber, dict(paid.dead_lettered)) == \
        (3, 1, 1, {"schema_invalid": 1})
    assert (paid.deliveries["succeeded"], paid.deliveries["failed"], paid.expected) == (1, 1, 2)
    assert (user.accepted, user.fanned_out, user.deliveries["pending"], user.deliveries["expired"]) == (2, 2, 1, 1)
    assert a.balanced and a.unaccounted == []
    assert all(t.events_balance for t in a.types)


def test_the_totals_equal_reconciliations_counts_for_the_tenant() -> None:
    rows = [row("e1", "ep_a"), row("e1", "ep_b", "failed"), row("e3", "ep_a", "pending", next_at=NOW + MIN)]
    i = inputs([("e1", TENANT), ("e2", TENANT), ("e3", TENANT)],
               [snap("e1", "ep_a", "ep_b"), snap("e2"), snap("e3", "ep_a")], rows)
    a, report = account(i, {"e1": "a", "e2": "b", "e3": "a"})
    t, c = a.total, report.counts
    assert t.accepted == c["events_on_topic"]
    assert t.fanned_out + t.no_subscriber == c["events_fanned_out"]
    assert t.no_subscriber == c["events_without_subscriber"]
    assert t.expected == c["deliveries_expected"]
    for status in ("succeeded", "failed", "expired"):
        assert t.deliveries[status] == c[status]
    assert t.deliveries["pending"] == c["pending_in_progress"] + c["pending_held"] + c["pending_orphaned"]


@pytest.mark.parametrize(("case", "topic", "snapshots", "rows", "kind", "delivery"), [
    ("on the topic, never fanned out", ["e1"], [], [], acc.NOT_FANNED_OUT, ""),
    ("fanned out, its delivery row missing", ["e1"], [snap("e1", "ep_a")], [], acc.DELIVERY_MISSING,
     delivery_id_for("e1", "ep_a")),
    ("pending, overdue, no job holds it", ["e1"], [snap("e1", "ep_a")],
     [row("e1", "ep_a", "pending", next_at=NOW - 20 * MIN)], acc.PENDING_ORPHANED, delivery_id_for("e1", "ep_a")),
])
def test_what_cannot_be_placed_is_listed_by_id(case: str, topic: list[str], snapshots: list[FanoutSnapshot],
                                                rows: list[rc.DeliveryRow], kind: str, delivery: str) -> None:
    a, _ = account(inputs([(e, TENANT) for e in topic], snapshots, rows), {"e1": "invoice.paid"})
    assert [(u.event_id, u.kind, u.delivery_id, u.event_type) for u in a.unaccounted] == \
        [("e1", kind, delivery, "invoice.paid")], case
    assert not a.balanced
    assert a.types[0].events_balance  # the event balance still holds: the listed one is counted once


def test_an_event_never_fanned_out_counts_as_not_accounted_for() -> None:
    a, _ = account(inputs([("e1", TENANT)], [], []), {"e1": "x"})
    assert (a.types[0].accepted, a.types[0].not_accounted) == (1, 1)


def test_a_dead_lettered_event_is_placed_with_its_reason_whether_or_not_fan_out_wrote_a_snapshot() -> None:
    i = inputs([("e1", TENANT), ("e2", TENANT)], [snap("e1")], [])
    a, _ = account(i, {"e1": "x", "e2": "x"}, dead={"e1": "schema_invalid", "e2": "event_id_conflict"})
    t = a.types[0]
    assert dict(t.dead_lettered) == {"schema_invalid": 1, "event_id_conflict": 1}
    assert (t.no_subscriber, t.not_accounted, a.unaccounted) == (0, 0, [])
    assert a.balanced


def test_skipped_pairs_count_by_reason_and_make_the_event_fanned_out_not_unsubscribed() -> None:
    i = inputs([("e1", TENANT), ("e2", TENANT)], [snap("e1"), snap("e2", "ep_a")], [row("e2", "ep_a")])
    skipped = [acc.Skipped(delivery_id_for("e1", "ep_p"), "e1", "ep_p", "schema_major_not_accepted"),
               acc.Skipped(delivery_id_for("e2", "ep_p"), "e2", "ep_p", "schema_major_not_accepted"),
               acc.Skipped(delivery_id_for("e9", "ep_p"), "e9", "ep_p", "outside the window")]
    a, _ = account(i, {"e1": "x", "e2": "x"}, skipped=skipped)
    t = a.types[0]
    assert (t.fanned_out, t.no_subscriber, dict(t.skipped)) == (2, 0, {"schema_major_not_accepted": 2})
    assert t.expected == 1  # a skipped pair is never an expected delivery
    assert a.balanced


def test_another_tenants_events_snapshots_and_letters_are_not_in_the_account() -> None:
    i = inputs([("e1", TENANT), ("x1", "t_other")], [snap("e1"), snap("x1", "ep_z", tenant="t_other")],
               [row("x1", "ep_z", tenant="t_other")])
    report = rc.reconcile(i, NOW - 60 * MIN, NOW, None, NOW, OVERDUE)
    a = acc.build(TENANT, i, report, {"e1": "x", "x1": "y"}, {"x1": "schema_invalid"}, [])
    assert [t.event_type for t in a.types] == ["x"]
    assert a.total.accepted == 1 and a.total.expected == 0


def test_an_event_without_a_known_type_is_grouped_under_unknown() -> None:
    a, _ = account(inputs([("e1", TENANT)], [snap("e1")], []), {})
    assert a.types[0].event_type == acc.UNKNOWN_TYPE


def test_an_empty_window_is_balanced_and_has_no_types() -> None:
    a, _ = account(inputs([], [], []), {})
    assert (a.types, a.unaccounted, a.balanced, a.total.accepted) == ([], [], True, 0)
