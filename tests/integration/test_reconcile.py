"""Reconciliation on the real stack (Kafka, the Flink job, Cassandra, the gRPC control plane).

A clean window reports zero gaps with counts that add up; each kind of damage made by hand (a
deleted delivery row, a deleted fan-out snapshot, a delivery marked pending that no job holds)
is reported as exactly that gap with its id, and ``repair`` closes it without re-sending a final
delivery. The orphan's repair re-sends it once (at-least-once), explained by its attempt rows.
"""

from __future__ import annotations

import time

import grpc
import pytest

from control_plane.rpc.api import pb, rpc
from core.fanout import snapshot_partition
from core.records import delivery_id_for
from tests.support.helpers import auth, event, eventually, new_tenant, produce

pytestmark = pytest.mark.integration

QUIET_S = 5


def _endpoint(grpc_channel, api_key: str, url: str, event_types: list[str]) -> str:
    cp = rpc.ControlPlaneStub(grpc_channel)
    return cp.CreateEndpoint(pb.CreateEndpointRequest(url=url, event_types=event_types),
                             metadata=auth(api_key)).endpoint.endpoint_id


def _stamp(ms: int):  # type: ignore[no-untyped-def]
    from google.protobuf.timestamp_pb2 import Timestamp

    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


class Reconcile:
    def __init__(self, grpc_channel, settings, tenant_id: str, since_ms: int) -> None:  # type: ignore[no-untyped-def]
        self._admin = rpc.AdminStub(grpc_channel)
        self._md = auth(settings.control_plane.admin_token.get_secret_value())
        self._tenant = tenant_id
        self._since = since_ms

    def __call__(self, repair: bool = False, overdue_after_s: int = 0):  # type: ignore[no-untyped-def]
        return self._admin.Reconcile(pb.ReconcileRequest(
            start_time=_stamp(self._since), end_time=_stamp(int(time.time() * 1000)), tenant_id=self._tenant,
            repair=repair, overdue_after_seconds=overdue_after_s), metadata=self._md, timeout=120)


def _gaps(report) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return sorted((g.kind, g.id) for g in report.gaps)


@pytest.fixture(scope="module")
def window(settings, grpc_channel, receiver, delivery_job, cassandra_session):  # type: ignore[no-untyped-def]
    """One tenant, two endpoints, three events (two, none and one matching endpoints) and one
    unreadable record, all delivered."""
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    base = f"/rec/{tenant_id}"
    ep_a = _endpoint(grpc_channel, api_key, receiver.base_url + base + "/a", ["invoice.*"])
    ep_b = _endpoint(grpc_channel, api_key, receiver.base_url + base + "/b", ["invoice.paid"])
    since = int(time.time() * 1000) - 1000
    e1 = event(tenant_id, "invoice.paid", b'{"n":1}')
    e2 = event(tenant_id, "order.shipped", b'{"n":2}')
    e3 = event(tenant_id, "invoice.created", b'{"n":3}')
    produce(settings, [e1.to_json(), e2.to_json(), e3.to_json(), b"{not json"])
    receiver.wait_for(base + "/a", 2, timeout=90)
    receiver.wait_for(base + "/b", 1, timeout=90)
    ids = {"e1a": delivery_id_for(e1.event_id, ep_a), "e1b": delivery_id_for(e1.event_id, ep_b),
           "e3a": delivery_id_for(e3.event_id, ep_a)}

    def all_succeeded() -> bool:
        rows = [cassandra_session.execute(STATUS, (d,)).one()
                for d in ids.values()]
        return all(r is not None and r.status == "succeeded" for r in rows)

    eventually(all_succeeded, timeout=60, what="three succeeded deliveries")
    check = Reconcile(grpc_channel, settings, tenant_id, since)
    # the dispatcher writes snapshots within ~200 ms of fan-out; wait for the window to settle
    eventually(lambda: check().clean, timeout=30, what="a clean reconciliation")
    return {"tenant": tenant_id, "base": base, "check": check, "events": (e1, e2, e3), "ids": ids,
            "a": ep_a, "b": ep_b}


def test_a_clean_window_has_no_gaps_and_counts_that_add_up(window) -> None:  # type: ignore[no-untyped-def]
    r = window["check"]()
    c = dict(r.counts)
    assert r.clean and list(r.gaps) == []
    assert (c["events_on_topic"], c["events_fanned_out"], c["events_without_subscriber"]) == (3, 3, 1)
    assert c["events_dead_lettered"] >= 1  # ours; other tests' unreadable records may share the window
    assert c["deliveries_expected"] == c["deliveries_found"] == c["succeeded"] == 3
    assert c["attempts"] == 3 and all(v == 0 for k, v in c.items() if k.startswith("gap_"))


def test_a_deleted_delivery_row_is_reported_and_restored_without_a_resend(window, cassandra_session,
                                                                           receiver) -> None:  # type: ignore[no-untyped-def]
    did = window["ids"]["e1b"]
    cassandra_session.execute(DROP_DELIVERY, (did,))
    r = window["check"]()
    assert _gaps(r) == [("delivery_missing", did)]
    fixed = window["check"](repair=True)
    assert [(x.kind, x.id, x.action) for x in fixed.repairs] == [("delivery_missing", did, "restored_succeeded")]
    after = window["check"]()
    assert after.clean, _gaps(after)
    row = cassandra_session.execute(STATUS, (did,)).one()
    assert (row.status, row.event_id) == ("succeeded", window["events"][0].event_id)
    time.sleep(QUIET_S)
    assert len(receiver.requests(window["base"] + "/b")) == 1, "a restored success is not sent again"


def test_a_dropped_fan_out_is_reported_and_repaired_without_resending_a_final_delivery(
        window, cassandra_session, receiver) -> None:  # type: ignore[no-untyped-def]
    _, e2, e3 = window["events"]
    for ev in (e2, e3):
        found = _snapshot_row(cassandra_session, ev.event_id, window)
        assert found is not None, f"no snapshot for {ev.event_id}"
        hour, bucket, arrived_at = found
        cassandra_session.execute(
            "DELETE FROM fanout_snapshots WHERE hour=%s AND bucket=%s AND arrived_at=%s AND event_id=%s",
            (hour, bucket, arrived_at, ev.event_id))
    r = window["check"]()
    assert _gaps(r) == sorted([("event_not_fanned_out", e2.event_id), ("event_not_fanned_out", e3.event_id)])
    fixed = window["check"](repair=True)
    actions = sorted((x.id, x.action) for x in fixed.repairs)
    assert actions == sorted([(e2.event_id, "snapshot_written"), (e3.event_id, "snapshot_written"),
                              (window["ids"]["e3a"], "redriven")])
    after = window["check"]()
    assert after.clean, _gaps(after)
    # The redrive reached the dispatcher, which found the delivery final in Cassandra: no new request.
    time.sleep(QUIET_S)
    assert len(receiver.requests(window["base"] + "/a")) == 2
    attempts = list(cassandra_session.execute(OUTCOMES,
                                              (window["ids"]["e3a"],)))
    assert [a.outcome for a in attempts] == ["succeeded"]


def test_a_pending_delivery_no_job_holds_is_orphaned_and_the_sweeper_sends_it(
        window, cassandra_session, receiver) -> None:  # type: ignore[no-untyped-def]
    did = window["ids"]["e1a"]
    path = window["base"] + "/a"
    before = len(receiver.requests(path))
    # Make it pending again, as if a job had lost it: a write just above its succeeded status.
    wt = cassandra_session.execute("SELECT WRITETIME(status) AS wt FROM delivery_history WHERE delivery_id=%s LIMIT 1",
                                   (did,)).one().wt
    hour_ago = int(time.time() * 1000) - 3_600_000
    cassandra_session.execute(
        "UPDATE delivery_history USING TIMESTAMP %s SET status='pending', auto_retry_active=true, next_attempt_at=%s"
        " WHERE delivery_id=%s", (wt + 1000, hour_ago, did))
    r = window["check"](overdue_after_s=60)
    assert _gaps(r) == [("pending_orphaned", did)]
    assert r.counts["pending_orphaned"] == 1
    fixed = window["check"](repair=True, overdue_after_s=60)
    assert [(x.id, x.action) for x in fixed.repairs] == [(did, "redriven")]
    # Re-sent once (at-least-once: the receiver sees the same webhook-id again) and recorded.
    again = receiver.wait_for(path, before + 1, timeout=60)
    assert again[-1].headers["webhook-id"] == did
    eventually(lambda: cassandra_session.execute(STATUS,
                                                 (did,)).one().status == "succeeded",
               timeout=60, what="the swept delivery to succeed")
    outcomes = [a.outcome for a in cassandra_session.execute(
        OUTCOMES, (did,))]
    assert outcomes == ["succeeded", "succeeded"], "the duplicate is explained by a second attempt row"
    assert window["check"](overdue_after_s=60).clean


def test_reconcile_refuses_a_bad_window_and_a_tenant_key(settings, grpc_channel) -> None:  # type: ignore[no-untyped-def]
    admin = rpc.AdminStub(grpc_channel)
    md = auth(settings.control_plane.admin_token.get_secret_value())
    now = int(time.time() * 1000)
    with pytest.raises(grpc.RpcError) as bad:
        admin.Reconcile(pb.ReconcileRequest(start_time=_stamp(now), end_time=_stamp(now - 1)), metadata=md)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as missing:
        admin.Reconcile(pb.ReconcileRequest(end_time=_stamp(now)), metadata=md)
    assert missing.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _, api_key = new_tenant(grpc_channel, settings)
    with pytest.raises(grpc.RpcError) as denied:
        admin.Reconcile(pb.ReconcileRequest(start_time=_stamp(now - 1000), end_time=_stamp(now)),
                        metadata=auth(api_key))
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED


STATUS = "SELECT status, event_id FROM delivery_history WHERE delivery_id=%s LIMIT 1"
OUTCOMES = ("SELECT outcome FROM delivery_history WHERE delivery_id=%s"
            " AND attempt_number > 0 ORDER BY attempt_number ASC")
# The delivery's own cells, not its attempt rows (they share the partition): the evidence of a
# success that a repair restores from.
DROP_DELIVERY = ("DELETE event_id, tenant_id, endpoint_id, endpoint_config_version, event_type, created_at, expires_at,"
                 " status, attempt_count, next_attempt_at, last_http_status, last_error_class, auto_retry_active,"
                 " updated_at FROM delivery_history WHERE delivery_id=%s")


def _snapshot_row(cassandra_session, event_id: str, window):  # type: ignore[no-untyped-def]
    """(hour, bucket, arrived_at) of an event's snapshot: its hour is that of its arrival, between
    the window's start and now."""
    import datetime as dt

    for at in (window["check"]._since, int(time.time() * 1000)):
        hour_ms, bucket = snapshot_partition(event_id, at)
        hour = dt.datetime.fromtimestamp(hour_ms / 1000, tz=dt.UTC)
        row = cassandra_session.execute(
            "SELECT arrived_at FROM fanout_snapshots WHERE hour=%s AND bucket=%s AND event_id=%s ALLOW FILTERING",
            (hour, bucket, event_id)).one()
        if row is not None:
            return hour, bucket, row.arrived_at
    return None


def test_the_periodic_reconciler_reports_a_gap_it_finds(window, settings, cassandra_session, caplog):  # type: ignore[no-untyped-def]
    """The control plane's loop step: the last hour of arrivals (here ending now), report only."""
    import logging

    from control_plane.history.reconcile import Reconciler
    from control_plane.publishing.publisher import KafkaPublisher
    from control_plane.store import CassandraStore

    did = window["ids"]["e1b"]
    cassandra_session.execute(DROP_DELIVERY, (did,))
    cp = settings.control_plane.model_copy(update={"reconcile_settle_s": 0, "reconcile_window_s": 3600})
    publisher = KafkaPublisher(settings.kafka)
    try:
        reconciler = Reconciler(settings.model_copy(update={"control_plane": cp}), cassandra_session,
                                CassandraStore(cassandra_session), publisher, lambda: int(time.time() * 1000))
        with caplog.at_level(logging.WARNING, logger="control_plane.history.reconcile"):
            reconciler.periodic()
    finally:
        publisher.close()
    report = reconciler.last_report
    assert report is not None and report.counts["events_on_topic"] >= 3
    assert ("delivery_missing", did) in {(g.kind, g.id) for g in report.gaps}
    assert any("periodic reconciliation found" in r.getMessage() and "delivery_missing" in r.getMessage()
               for r in caplog.records)
    assert window["check"]().counts["gap_delivery_missing"] == 1  # report only: nothing was repaired
    window["check"](repair=True)
    assert window["check"]().clean


def test_a_repaired_fan_out_leaves_out_an_endpoint_pinned_to_another_schema_major(
        settings, grpc_channel, receiver, delivery_job, cassandra_session) -> None:  # type: ignore[no-untyped-def]
    """An event that lost its fan-out snapshot is matched again with today's configs; an endpoint
    pinned to other schema majors must stay left out, as fan-out left it out (it lists the pair as
    skipped), and is not sent the event by the repair."""
    from dataclasses import replace

    from control_plane.history.reconcile import Reconciler
    from control_plane.publishing.publisher import KafkaPublisher
    from control_plane.rpc.catalog_api import cpb, crpc
    from control_plane.store import CassandraStore

    tenant_id, api_key = new_tenant(grpc_channel, settings)
    base = f"/rec-pins/{tenant_id}"
    open_ep = _endpoint(grpc_channel, api_key, receiver.base_url + base + "/any", ["invoice.*"])
    pinned_ep = _endpoint(grpc_channel, api_key, receiver.base_url + base + "/v2", ["invoice.*"])
    crpc.EventCatalogStub(grpc_channel).SetEndpointSchemaMajors(cpb.SetEndpointSchemaMajorsRequest(
        endpoint_id=pinned_ep, schema_majors=[2]), metadata=auth(api_key))
    since = int(time.time() * 1000) - 1000
    v1 = replace(event(tenant_id, "invoice.paid", b'{"n":1}'), schema_version="1.0")
    produce(settings, [v1.to_json()])
    receiver.wait_for(base + "/any", 1, timeout=90)
    window = {"check": Reconcile(grpc_channel, settings, tenant_id, since)}
    eventually(lambda: _snapshot_row(cassandra_session, v1.event_id, window) is not None, timeout=30,
               what="the event's fan-out snapshot")
    hour, bucket, arrived_at = _snapshot_row(cassandra_session, v1.event_id, window)
    cassandra_session.execute(
        "DELETE FROM fanout_snapshots WHERE hour=%s AND bucket=%s AND arrived_at=%s AND event_id=%s",
        (hour, bucket, arrived_at, v1.event_id))
    publisher = KafkaPublisher(settings.kafka)
    try:
        reconciler = Reconciler(settings, cassandra_session, CassandraStore(cassandra_session), publisher,
                                lambda: int(time.time() * 1000))
        fixed = reconciler.run(since, int(time.time() * 1000), tenant_id, repair=True, requested_by="test")
    finally:
        publisher.close()
    actions = sorted((x.id, x.action) for x in fixed.repairs)
    assert actions == sorted([(v1.event_id, "snapshot_written"),
                              (delivery_id_for(v1.event_id, open_ep), "redriven")]), fixed.repairs
    written = cassandra_session.execute(
        "SELECT endpoints FROM fanout_snapshots WHERE hour=%s AND bucket=%s AND arrived_at=%s AND event_id=%s",
        (hour, bucket, arrived_at, v1.event_id)).one()
    assert set(written.endpoints) == {open_ep}
    time.sleep(QUIET_S)
    assert receiver.requests(base + "/v2") == [], "the pinned endpoint was sent an event of another major"
    assert window["check"]().clean
