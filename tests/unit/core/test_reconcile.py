"""core.reconcile: each boundary's gap, named with its id; the clean case names none."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core import reconcile as rc
from core.fanout import SNAPSHOT_BUCKETS, FanoutSnapshot, SkippedDelivery, snapshot_partition
from core.records import delivery_id_for

NOW = 1_700_000_000_000
MIN = 60_000
OVERDUE = 15 * MIN


def snap(event_id: str, *endpoints: str, tenant: str = "t_1", at: int = NOW - 30 * MIN) -> FanoutSnapshot:
    return FanoutSnapshot(event_id, tenant, at, tuple((e, 1) for e in sorted(endpoints)))


def row(event_id: str, endpoint_id: str, status: str = "succeeded", attempts: int = 1,
        next_at: int | None = None, tenant: str = "t_1") -> rc.DeliveryRow:
    return rc.DeliveryRow(delivery_id_for(event_id, endpoint_id), event_id, tenant, endpoint_id, status, attempts,
                          next_at, NOW + 23 * 60 * MIN)


def ok(n: int = 1) -> list[rc.AttemptRow]:
    return [*(rc.AttemptRow(i, "retry", False) for i in range(1, n)), rc.AttemptRow(n, "succeeded", False)]


def clean_inputs() -> rc.Inputs:
    """e1 -> ep_a, ep_b (both succeeded); e2 -> nobody; e3 -> ep_a, pending, not yet due."""
    rows = [row("e1", "ep_a"), row("e1", "ep_b", attempts=2),
            row("e3", "ep_a", status="pending", attempts=0, next_at=NOW + MIN)]
    return rc.Inputs(
        topic_events=[rc.TopicEvent(e, "t_1", NOW - 30 * MIN) for e in ("e1", "e2", "e3")],
        dead_lettered=1,
        snapshots=[snap("e1", "ep_a", "ep_b"), snap("e2"), snap("e3", "ep_a")],
        deliveries={r.delivery_id: r for r in rows},
        attempts={rows[0].delivery_id: ok(), rows[1].delivery_id: ok(2),
                  rows[2].delivery_id: [rc.AttemptRow(1, "reserved", False)]},
    )


def run(inputs: rc.Inputs) -> rc.Report:
    return rc.reconcile(inputs, NOW - 60 * MIN, NOW, None, NOW, OVERDUE)


def test_a_clean_window_has_no_gaps_and_its_counts_add_up() -> None:
    r = run(clean_inputs())
    assert r.clean and r.gaps == []
    c = r.counts
    assert (c["events_on_topic"], c["events_fanned_out"], c["events_without_subscriber"]) == (3, 3, 1)
    assert c["events_dead_lettered"] == 1
    assert c["deliveries_expected"] == c["deliveries_found"] == 3
    assert c["deliveries_expected"] == (c["succeeded"] + c["failed"] + c["expired"] + c["pending_in_progress"]
                                        + c["pending_held"] + c["pending_orphaned"])
    assert (c["succeeded"], c["pending_in_progress"], c["attempts"], c["requests_outcome_unknown"]) == (2, 1, 3, 0)
    assert all(c["gap_" + k] == 0 for k in rc.GAP_KINDS)


def _drop_snapshot(i: rc.Inputs) -> rc.Inputs:
    return replace(i, snapshots=[s for s in i.snapshots if s.event_id != "e2"])


def _drop_delivery(i: rc.Inputs) -> rc.Inputs:
    return replace(i, deliveries={k: v for k, v in i.deliveries.items() if k != delivery_id_for("e1", "ep_b")})


def _orphan(i: rc.Inputs) -> rc.Inputs:
    did = delivery_id_for("e3", "ep_a")
    return replace(i, deliveries={**i.deliveries, did: replace(i.deliveries[did], next_attempt_at_ms=NOW - 20 * MIN)})


def _success_without_evidence(i: rc.Inputs) -> rc.Inputs:
    did = delivery_id_for("e1", "ep_a")
    return replace(i, attempts={**i.attempts, did: [rc.AttemptRow(1, "retry", False)]})


def _attempts_without_rows(i: rc.Inputs) -> rc.Inputs:
    did = delivery_id_for("e1", "ep_b")
    return replace(i, deliveries={**i.deliveries, did: replace(i.deliveries[did], attempt_count=5)})


@pytest.mark.parametrize(("damage", "kind", "gap_id"), [
    (_drop_snapshot, rc.EVENT_NOT_FANNED_OUT, "e2"),
    (_drop_delivery, rc.DELIVERY_MISSING, delivery_id_for("e1", "ep_b")),
    (_orphan, rc.PENDING_OVERDUE, delivery_id_for("e3", "ep_a")),
    (_success_without_evidence, rc.SUCCESS_UNRECORDED, delivery_id_for("e1", "ep_a")),
    (_attempts_without_rows, rc.ATTEMPTS_UNRECORDED, delivery_id_for("e1", "ep_b")),
])
def test_each_damage_is_reported_as_exactly_its_gap(damage, kind: str, gap_id: str) -> None:  # type: ignore[no-untyped-def]
    r = run(damage(clean_inputs()))
    assert [(g.kind, g.id) for g in r.gaps] == [(kind, gap_id)]
    assert r.counts["gap_" + kind] == 1 and not r.clean


def test_a_past_due_pending_delivery_on_an_endpoint_the_job_reports_is_held_not_orphaned() -> None:
    damaged = _orphan(clean_inputs())
    fresh = run(replace(damaged, backlog_reported_at={"ep_a": NOW - MIN}))
    assert fresh.clean and fresh.counts["pending_held"] == 1 and fresh.counts["pending_orphaned"] == 0
    stale = run(replace(damaged, backlog_reported_at={"ep_a": NOW - OVERDUE - MIN}))
    assert [g.kind for g in stale.gaps] == [rc.PENDING_OVERDUE] and stale.counts["pending_orphaned"] == 1


def test_a_pending_delivery_just_due_is_in_progress() -> None:
    did = delivery_id_for("e3", "ep_a")
    i = clean_inputs()
    i = replace(i, deliveries={**i.deliveries, did: replace(i.deliveries[did], next_attempt_at_ms=NOW - OVERDUE)})
    assert run(i).clean


def test_a_reserved_row_behind_a_final_status_is_an_unrecorded_request_not_a_gap() -> None:
    """A worker died with the request in flight: the receiver may have seen it twice."""
    did = delivery_id_for("e1", "ep_a")
    i = clean_inputs()
    i = replace(i, attempts={**i.attempts, did: [rc.AttemptRow(1, "reserved", False),
                                                 rc.AttemptRow(2, "succeeded", False)]})
    r = run(i)
    assert r.clean and r.counts["requests_outcome_unknown"] == 1


def test_snapshot_partitions_are_stable_and_spread() -> None:
    assert snapshot_partition("evt_1", NOW) == snapshot_partition("evt_1", NOW + 1)
    hour, _ = snapshot_partition("evt_1", NOW)
    assert hour <= NOW < hour + 3_600_000 and hour % 3_600_000 == 0
    buckets = {snapshot_partition(f"evt_{n}", NOW)[1] for n in range(500)}
    assert buckets == set(range(SNAPSHOT_BUCKETS))


def test_a_pending_delivery_past_its_deadline_by_the_jobs_give_up_bound_is_orphaned_even_on_a_held_endpoint() -> None:
    """The job lets go of a delivery whose history write kept failing one give-up bound after its
    deadline (it stays pending in history): no job holds it any more, whatever the job reports
    about the endpoint's other deliveries, so reconciliation names it for the sweeper."""
    base = clean_inputs()
    did = delivery_id_for("e3", "ep_a")
    reported = {"ep_a": NOW - MIN}
    give_up = 60 * MIN
    for expired_ago, kind in ((give_up + MIN, [rc.PENDING_OVERDUE]), (give_up - MIN, [])):
        stuck = replace(base.deliveries[did], next_attempt_at_ms=NOW - 2 * OVERDUE,
                        expires_at_ms=NOW - expired_ago)
        r = rc.reconcile(replace(base, deliveries={**base.deliveries, did: stuck}, backlog_reported_at=reported),
                         NOW - 60 * MIN, NOW, None, NOW, OVERDUE, given_up_after_ms=give_up)
        assert [g.kind for g in r.gaps] == kind, expired_ago


def test_a_pair_fan_out_skipped_is_neither_expected_nor_a_gap() -> None:
    # e1's snapshot also carries ep_c, skipped (pinned to another schema major): it has no
    # delivery to find, and the window stays clean with the same counts.
    inputs = clean_inputs()
    skipped = SkippedDelivery(delivery_id_for("e1", "ep_c"), "ep_c", 1, "order.paid", "schema major 1 not accepted")
    inputs = replace(inputs, snapshots=[replace(inputs.snapshots[0], skipped=(skipped,)), *inputs.snapshots[1:]])
    assert delivery_id_for("e1", "ep_c") not in rc.expected_deliveries(inputs.snapshots)
    r = run(inputs)
    assert r.clean and r.counts == run(clean_inputs()).counts
