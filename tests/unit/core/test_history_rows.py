"""Reading a delivery from both history schemas (core/history_rows.py), with no Cassandra."""

from __future__ import annotations

from core import history_rows as hr


def new_row(number: int | None, **cells: object) -> dict[str, object]:
    """One row of a delivery_history partition: the static cells repeat on every row."""
    return {"delivery_id": "d1", "attempt_number": number, **cells}


def test_a_partition_splits_into_the_delivery_and_its_attempts_in_number_order() -> None:
    statics = {"event_id": "e1", "endpoint_id": "ep", "created_at": 1, "status": "pending"}
    rows = [new_row(2, outcome="reserved", config_version=4, **statics),
            new_row(1, outcome="retry", config_version=3, **statics)]
    delivery, attempts = hr.split(rows)
    assert delivery is not None and (delivery["event_id"], delivery["status"]) == ("e1", "pending")
    assert [(a["attempt_number"], a["outcome"], a["endpoint_config_version"], a["endpoint_id"])
            for a in attempts] == [(1, "retry", 3, "ep"), (2, "reserved", 4, "ep")]
    assert not hr.needs_old(delivery)


def test_an_empty_or_attempts_only_partition_has_no_delivery_and_needs_the_old_tables() -> None:
    assert hr.split([]) == (None, [])
    delivery, attempts = hr.split([new_row(3, outcome="reserved")])
    assert delivery is None and [a["attempt_number"] for a in attempts] == [3]
    assert hr.needs_old(delivery)


def test_merge_lets_the_new_cells_win_and_joins_attempts_by_number() -> None:
    old = {"delivery_id": "d1", "event_id": "e1", "status": "pending", "attempt_count": 1, "created_at": 1}
    old_attempts = [{"attempt_number": 1, "outcome": "retry"}, {"attempt_number": 2, "outcome": "reserved"}]
    new, new_attempts = hr.split([new_row(2, outcome="succeeded", status="succeeded", attempt_count=2)])
    delivery, attempts = hr.merge(new, new_attempts, old, old_attempts)
    assert delivery is not None
    assert (delivery["event_id"], delivery["status"], delivery["attempt_count"]) == ("e1", "succeeded", 2)
    assert [(a["attempt_number"], a["outcome"]) for a in attempts] == [(1, "retry"), (2, "succeeded")]
    assert hr.top_attempt_number(attempts) == 2


def test_merge_with_no_old_row_keeps_the_new_partition_as_it_is() -> None:
    new, new_attempts = hr.split([new_row(1, outcome="reserved", event_id="e1", created_at=5)])
    assert hr.merge(new, new_attempts, None, []) == (new, new_attempts)
