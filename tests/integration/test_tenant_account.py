"""A tenant's account of every event (TenantAccount.GetAccount, `webhookctl account`) on the real
stack: outbox -> Debezium -> Kafka -> fan-out (with the tenant's catalog) -> the job -> receivers.

One tenant, a catalog (order.paid rejecting, majors 1 and 2; invoice.sent warning) and two
endpoints for order.* (``any``, and ``v2`` pinned to major 2). Four events: order.paid 1 (sent
to ``any``, skipped at ``v2``), order.paid 2 (sent to both), an invalid order.paid 1
(dead-lettered, schema_invalid) and invoice.sent (no subscriber). The account places each one
with its reason, agrees with reconciliation figure by figure, never shows another tenant's
events, and lists by id a delivery whose row was deleted by hand.

NEEDS A TASKMANAGER THAT RUNS THIS CHECKOUT'S OPERATORS (schema checks in fan-out), as
tests/integration/test_catalog_fanout.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import grpc
import pytest

from control_plane.cli import main as cli
from control_plane.rpc.catalog_api import cpb, crpc
from core.records import delivery_id_for
from core.settings import Settings
from outbox.producer import write_event
from stack.outbox_relay import OutboxRelay
from tests.integration.test_catalog_fanout import GOOD, SCHEMA, raw_row
from tests.support.faults import wait_all_reached
from tests.support.helpers import (
    account_and_report,
    account_mismatches,
    auth,
    create_endpoints,
    eventually,
    new_tenant,
    reconcile,
)
from tests.support.receiver import Receiver

pytestmark = pytest.mark.integration

DROP_DELIVERY = ("DELETE event_id, tenant_id, endpoint_id, endpoint_config_version, event_type, created_at, expires_at,"
                 " status, attempt_count, next_attempt_at, last_http_status, last_error_class, auto_retry_active,"
                 " updated_at FROM delivery_history WHERE delivery_id=%s")


class Window:
    """The tenant, its events and the window they arrived in."""

    def __init__(self, channel: grpc.Channel, settings: Settings, receiver: Receiver, relay: OutboxRelay) -> None:
        self.tenant_id, self.key = new_tenant(channel, settings)
        admin = auth(settings.control_plane.admin_token.get_secret_value())
        catalog = crpc.EventCatalogStub(channel)
        for name, enforcement, versions in (("order.paid", "reject", ("1", "2")), ("invoice.sent", "warn", ("1",))):
            catalog.CreateEventType(cpb.CreateEventTypeRequest(tenant_id=self.tenant_id, name=name,
                                                               enforcement=enforcement), metadata=admin)
            for version in versions:
                catalog.AddSchemaVersion(cpb.AddSchemaVersionRequest(
                    tenant_id=self.tenant_id, name=name, version=version, schema_json=json.dumps(SCHEMA),
                    examples_json=[json.dumps(GOOD)]), metadata=admin)
        paths = {k: f"/ep/account-{k}-{self.tenant_id}" for k in ("any", "v2")}
        ids = create_endpoints(channel, self.key, [f"{receiver.base_url}{p}" for p in paths.values()], ["order.*"])
        self.endpoints = dict(zip(paths, ids, strict=True))
        catalog.SetEndpointSchemaMajors(cpb.SetEndpointSchemaMajorsRequest(
            endpoint_id=self.endpoints["v2"], schema_majors=[2]), metadata=auth(self.key))
        time.sleep(2)  # the catalog and the pins reach fan-out through the endpoints topic
        self.since_ms = int(time.time() * 1000) - 1000
        with relay.connect() as conn:
            self.v1 = write_event(conn, self.tenant_id, "order.paid", GOOD, schema_version="1")
            self.v2 = write_event(conn, self.tenant_id, "order.paid", GOOD, schema_version="2")
            self.unsubscribed = write_event(conn, self.tenant_id, "invoice.sent", GOOD, schema_version="1")
        self.bad = raw_row(relay, self.tenant_id, "order.paid", "1", {"id": "o1", "amount": "3"})
        self.sent = {delivery_id_for(self.v1, self.endpoints["any"]), delivery_id_for(self.v2, self.endpoints["any"]),
                     delivery_id_for(self.v2, self.endpoints["v2"])}
        wait_all_reached(receiver, self.sent, timeout=120)


@pytest.fixture(scope="module")
def window(grpc_channel: grpc.Channel, settings: Settings, receiver: Receiver, relay: OutboxRelay) -> Window:
    return Window(grpc_channel, settings, receiver, relay)


def settled(grpc_channel: grpc.Channel, settings: Settings, w: Window, expect_balanced: bool = True) -> Any:
    """The account once every event is placed (history and dead letters are written after the
    receiver answers)."""
    def placed() -> Any:
        account, report = account_and_report(grpc_channel, settings, w.tenant_id, w.since_ms, w.key)
        t = account.total
        done = t.accepted == 4 and t.deliveries.pending == 0 and sum(t.dead_lettered.values()) == 1 \
            and sum(t.skipped.values()) == 1
        return (account, report) if done and account.balanced == expect_balanced else None
    return eventually(placed, timeout=90, interval=2, what="every event of the window placed")


def test_every_event_is_placed_with_its_reason_per_type(grpc_channel: grpc.Channel, settings: Settings,
                                                        window: Window) -> None:
    account, report = settled(grpc_channel, settings, window)
    by = {t.event_type: t for t in account.event_types}
    assert set(by) == {"order.paid", "invoice.sent"}
    paid, sent = by["order.paid"], by["invoice.sent"]
    assert (paid.accepted, paid.fanned_out, paid.no_subscriber, dict(paid.dead_lettered)) == \
        (3, 2, 0, {"schema_invalid": 1})
    assert (paid.deliveries.succeeded, paid.deliveries.pending, paid.deliveries.missing) == (3, 0, 0)
    assert sum(paid.skipped.values()) == 1 and paid.balanced
    assert (sent.accepted, sent.no_subscriber, sent.fanned_out) == (1, 1, 0)
    assert account.balanced and list(account.unaccounted) == []
    assert account.tenant_id == window.tenant_id


def test_the_account_agrees_with_reconciliation_figure_by_figure(grpc_channel: grpc.Channel, settings: Settings,
                                                                 window: Window) -> None:
    account, report = settled(grpc_channel, settings, window)
    assert account_mismatches(account, report) == []


def test_another_tenant_sees_none_of_these_events(grpc_channel: grpc.Channel, settings: Settings,
                                                 window: Window) -> None:
    other, key = new_tenant(grpc_channel, settings)
    account, _ = account_and_report(grpc_channel, settings, other, window.since_ms, key)
    assert account.tenant_id == other
    assert account.total.accepted == 0 and list(account.event_types) == []


def test_webhookctl_account_prints_it_and_exits_0_when_balanced(grpc_channel: grpc.Channel, settings: Settings,
                                                              window: Window, control_plane: str,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    settled(grpc_channel, settings, window)
    monkeypatch.setenv("WEBHOOKCTL_API_KEY", window.key)
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(window.since_ms // 1000))
    assert cli.main(["--target", control_plane, "account", "--since", since]) == 0
    out = capsys.readouterr().out
    assert "every event accounted for" in out and "order.paid" in out and "schema_invalid 1" in out
    assert cli.main(["--target", control_plane, "--json", "account", "--since", since]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["balanced"] is True and data["total"]["accepted"] == "4"  # int64 is a string in JSON


def test_a_delivery_row_deleted_by_hand_is_listed_by_id_and_the_cli_exits_3(
        grpc_channel: grpc.Channel, settings: Settings, window: Window, cassandra_session: Any, control_plane: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    lost = delivery_id_for(window.v2, window.endpoints["v2"])
    cassandra_session.execute(DROP_DELIVERY, (lost,))
    try:
        def unbalanced() -> Any:
            found = account_and_report(grpc_channel, settings, window.tenant_id, window.since_ms, window.key)
            return found if not found[0].balanced else None
        account, report = eventually(unbalanced, timeout=30, interval=2, what="the deleted row missing")
        assert [(u.event_id, u.kind, u.delivery_id) for u in account.unaccounted] == \
            [(window.v2, "delivery_missing", lost)]
        assert account_mismatches(account, report) == []
        monkeypatch.setenv("WEBHOOKCTL_API_KEY", window.key)
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(window.since_ms // 1000))
        assert cli.main(["--target", control_plane, "account", "--since", since]) == 3
        assert lost in capsys.readouterr().out
    finally:
        # Put it back as reconciliation's repair does (the attempt row records the success).
        reconcile(grpc_channel, settings, window.tenant_id, window.since_ms, repair=True)
