"""The archive facts (core/archive_facts.py): built from the job's own records, one record per
call round-trips exactly (payload bytes included), the columns match the Parquet schemas, and
the log reduces by key the way Cassandra's cells do."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from control_plane.archive.rows import SCHEMAS
from core import archive_facts
from core.archive_layout import KINDS
from core.fanout import FanoutSnapshot, SkippedDelivery
from tests.support.archive_facts import BAND_US, attempt, delivery, history

ARRIVED = int(datetime(2026, 11, 29, 19, 42, tzinfo=UTC).timestamp() * 1000)
HOUR = int(datetime(2026, 11, 29, 19, tzinfo=UTC).timestamp() * 1000)


def test_every_kind_has_the_columns_of_its_parquet_schema_in_order():
    assert set(archive_facts.COLUMNS) == set(KINDS) == set(SCHEMAS)
    for kind, columns in archive_facts.COLUMNS.items():
        assert columns == tuple(SCHEMAS[kind].names)
        assert set(archive_facts.KEYS[kind]) <= set(columns)


def test_a_record_round_trips_every_fact_with_the_exact_payload_bytes():
    d = delivery("t-acme", 1, ARRIVED)
    d = d.__class__(**{**d.__dict__, "event": d.event.__class__(**{**d.event.__dict__,
                                                                   "payload": b"\x00\xff{\"a\": 1}\n"})})
    facts = history(d, [(503, "pending"), (200, "succeeded")])
    decoded = archive_facts.decode(archive_facts.encode(facts))
    assert [k for k, _ in decoded] == ["deliveries", "events", "attempts", "deliveries", "attempts", "deliveries"]
    event = decoded[1][1]
    assert event["payload"] == b"\x00\xff{\"a\": 1}\n" and event["payload_sha256"] == d.event.payload_sha256
    for (kind, values), (kind2, row) in zip(facts, decoded, strict=True):
        assert kind == kind2
        assert tuple(row.values()) == tuple(values)
        assert row["hour"] == HOUR and row["tenant_id"] == "t-acme"


def test_every_fact_of_a_delivery_is_in_its_arrival_hour_whenever_it_happens():
    d = delivery("t-acme", 2, ARRIVED)
    late = attempt(3, ARRIVED + 20 * 3_600_000, 200, "succeeded")  # a retry the next day
    assert archive_facts.attempt_fact(d, late, 0)[1][archive_facts.COLUMNS["attempts"].index("hour")] == HOUR
    assert archive_facts.status_fact(d, late, 3, 0)[1][archive_facts.COLUMNS["deliveries"].index("hour")] == HOUR


def test_skipped_pairs_are_delivery_facts_with_their_reason():
    s = FanoutSnapshot(event_id="evt_1", tenant_id="t-acme", arrived_at_ms=ARRIVED, endpoints=(),
                       skipped=(SkippedDelivery("dlv_1", "ep-9", 4, "invoice.paid", "schema_pinned"),))
    [(kind, values)] = archive_facts.skipped_facts(s, ARRIVED * 1000)
    row = dict(zip(archive_facts.COLUMNS[kind], values, strict=True))
    assert (kind, row["status"], row["last_error_class"], row["delivery_id"]) == (
        "deliveries", "skipped", "schema_pinned", "dlv_1")


@pytest.mark.parametrize("raw", [b"{}", b'["webhooks.archive-facts/9", []]', b"not json",
                                 b'["webhooks.archive-facts/1", [["payloads", [1]]]]',
                                 b'["webhooks.archive-facts/1", [["events", [1, 2]]]]',
                                 # wrong shapes: a TypeError inside would stop the writer instead
                                 b"5", b'["webhooks.archive-facts/1", 5]', b'["webhooks.archive-facts/1", [5]]',
                                 b'["webhooks.archive-facts/1", [[["events"], []]]]',
                                 b'["webhooks.archive-facts/1", [["events", 5]]]'])
def test_anything_but_a_facts_record_is_refused(raw):
    with pytest.raises(ValueError):
        archive_facts.decode(raw)


def test_the_latest_write_time_wins_and_a_final_status_outranks_a_later_pending_one():
    d = delivery("t-acme", 3, ARRIVED)
    facts = history(d, [(503, "pending"), (200, "succeeded")])
    stale = attempt(1, ARRIVED + 9000, 503, "pending")  # a stale incarnation's late pending write
    facts.append(archive_facts.status_fact(d, stale, 1, (ARRIVED + 9000) * 1000))
    rows = archive_facts.decode(archive_facts.encode(facts + facts))  # and everything twice
    deliveries = archive_facts.latest("deliveries", [r for k, r in rows if k == "deliveries"])
    attempts = archive_facts.latest("attempts", [r for k, r in rows if k == "attempts"])
    assert [(r["status"], r["attempt_count"]) for r in deliveries] == [("succeeded", 2)]
    assert sorted(r["attempt_number"] for r in attempts) == [1, 2]
    assert deliveries[0]["write_ts"] > 2 * BAND_US
