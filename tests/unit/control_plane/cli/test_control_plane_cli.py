"""webhookctl without a server: argument -> request mapping and rendering."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.cli import deliveries, endpoints, events, master_key
from control_plane.cli import main as cli
from control_plane.cli.common import table
from control_plane.rpc.api import pb
from core.event_schemas import SchemaVersion
from outbox.schemas import CatalogType, TenantCatalog
from tests.unit.outbox.test_outbox_producer import RecordingConnection
from tests.unit.outbox.test_outbox_schemas import FakeSource


class RecordingStub:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        def call(request: Any, **_options: Any) -> Any:
            self.calls.append((name, request))
            if name == "RecoverFailedDeliveries":
                return iter([pb.RecoverProgress(total=2), pb.RecoverProgress(total=2, replayed=2, done=True)])
            if name == "ListDeliveries":
                return pb.ListDeliveriesResponse(deliveries=[
                    pb.DeliverySummary(delivery_id="dlv_1", status=pb.DELIVERY_STATUS_SKIPPED)])
            if name == "Reconcile":
                return pb.ReconcileReport(
                    tenant_id=request.tenant_id, counts={"events_on_topic": 3, "succeeded": 4,
                                                         "gap_delivery_missing": 1},
                    gaps=[pb.ReconcileGap(kind="delivery_missing", id="dlv_x", tenant_id="t_1", detail="no row")],
                    repairs=[pb.ReconcileRepair(kind="delivery_missing", id="dlv_x", action="redriven")])
            if name == "CreateEndpoint":
                return pb.CreateEndpointResponse(endpoint=pb.Endpoint(endpoint_id="ep_1"), signing_secret="whsec_x")
            if name == "SetTenantEventTypes":
                return pb.SetTenantEventTypesResponse(
                    tenant=pb.Tenant(tenant_id=request.tenant_id, event_types_restricted=not request.unrestricted,
                                     allowed_event_types=request.allowed_event_types), endpoints_outside=["ep_9"])
            if name == "ReencryptSigningKeys":
                return pb.ReencryptSigningKeysReport(current_master_key_id="k2", endpoints_scanned=3,
                                                     endpoints_reencrypted=1, keys_reencrypted=2,
                                                     keys_by_master_key={"k2": 3, "k1": 1})
            if name == "ReplayDelivery":
                return pb.ReplayDeliveryResponse(delivery_id=request.delivery_id, request_id="rq")
            if name == "ListBlockedKeys":
                return pb.ListBlockedKeysResponse(keys=[pb.BlockedKey(
                    ordering_key="inv_7", head_delivery_id="dlv_h", head_object_version=3, attempts=5,
                    last_http_status=503, waiting=2)], next_page_token="tok2")
            if name == "ListEndpointVersions":
                return pb.ListEndpointVersionsResponse(versions=[
                    pb.EndpointVersion(config_version=2, change="update payload_mode", payload_mode="fields",
                                       payload_fields=["/id", "/customer/id"], ordering_key="object_id"),
                    pb.EndpointVersion(config_version=1, change="create")])  # recorded before: unknown
            if name == "SkipOrderingHead":
                return pb.SkipOrderingHeadResponse(delivery_id="dlv_h", request_id="skp_1")
            return pb.Endpoint(endpoint_id="ep_1", url="https://h.example.com:443/")

        return call


def run(argv: list[str]) -> tuple[RecordingStub, list[str]]:
    stub, shown = RecordingStub(), []
    cli.run(cli.parser().parse_args(argv), stub, stub, emit=shown.append, show=shown.append)
    return stub, shown


def test_update_sends_only_the_given_fields_in_the_mask() -> None:
    stub, shown = run(["endpoints", "update", "ep_1", "--description", "new", "--clear-rate-limit",
                       "--max-in-flight", "3"])
    [(name, request)] = stub.calls
    assert name == "UpdateEndpoint"
    assert sorted(request.update_mask.paths) == ["description", "max_in_flight", "rate_limit_per_s"]
    assert request.endpoint.max_in_flight == 3 and not request.endpoint.HasField("rate_limit_per_s")
    assert "ep_1" in shown[0]


def test_replay_and_recover_send_the_reason_and_get_shows_the_audit() -> None:
    stub, shown = run(["deliveries", "replay", "dlv_1", "--reason", "fixed on their side"])
    assert stub.calls[0][1].reason == "fixed on their side" and "rq" in shown[0]
    stub, _ = run(["deliveries", "recover", "ep_1", "--since", "2026-11-01T00:00:00Z", "--until", "2026-11-02",
                   "--reason", "INC-42"])
    assert stub.calls[0][1].reason == "INC-42"
    detail = pb.DeliveryDetail(delivery=pb.DeliverySummary(delivery_id="dlv_1"), replays=[
        pb.ReplayAudit(request_id="rq-1", requested_by="key_abc", reason="INC-42")])
    text = deliveries.delivery_detail(detail)
    assert "replays" in text and "key_abc" in text and "INC-42" in text
    assert "replays" not in deliveries.delivery_detail(pb.DeliveryDetail(delivery=pb.DeliverySummary(delivery_id="d")))


def test_recover_draws_a_progress_bar(capsys: Any) -> None:
    run(["deliveries", "recover", "ep_1", "--since", "2026-11-01T00:00:00Z", "--until", "2026-11-02"])
    assert "[" + "#" * 30 + "] 2/2 replayed" in capsys.readouterr().err


def test_table_aligns_columns() -> None:
    assert table(["a", "bb"], [("xxx", 1)]).splitlines() == ["A    BB", "xxx  1"]


def test_reconcile_maps_its_window_and_renders_counts_gaps_and_repairs() -> None:
    stub, shown = run(["reconcile", "--since", "2026-11-01T00:00:00Z", "--until", "2026-11-01T01:00:00Z",
                       "--tenant", "t_1", "--repair"])
    [(name, request)] = stub.calls
    assert name == "Reconcile" and request.repair and request.tenant_id == "t_1"
    assert request.end_time.ToSeconds() - request.start_time.ToSeconds() == 3600
    text = shown[0]
    assert "1 gap(s)" in text
    assert any(line.split()[-2:] == ["events_on_topic", "3"] for line in text.splitlines())
    assert any("dlv_x" in line and "no row" in line for line in text.splitlines())
    assert any("dlv_x" in line and "redriven" in line for line in text.splitlines())


def test_reconcile_takes_json_after_its_arguments_too() -> None:
    args = cli.parser().parse_args(["reconcile", "--since", "2026-11-01", "--until", "2026-11-02", "--json"])
    assert args.json is True
    assert cli.parser().parse_args(["reconcile", "--since", "2026-11-01", "--until", "2026-11-02"]).json is False


@pytest.mark.parametrize(("target", "ca", "insecure", "tls"), [
    ("127.0.0.1:50051", None, False, False),   # the dev stack on loopback
    ("localhost:50051", None, False, False),
    ("[::1]:50051", None, False, False),
    ("cp.example.com:443", None, False, True),  # anywhere else: TLS with the system's roots
    ("10.0.0.5:50051", None, False, True),
    ("127.0.0.1:50051", "CA", False, True),     # --ca asks for TLS even on loopback
    ("cp.example.com:443", None, True, False),  # --insecure: plaintext, asked for
])
def test_channel_security_by_target_and_flags(target: str, ca: str | None, insecure: bool, tls: bool,
                                              tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from control_plane.cli import common as cli_module

    made: list[str] = []
    monkeypatch.setattr(cli_module.grpc, "insecure_channel", lambda t: made.append("plain") or t)
    monkeypatch.setattr(cli_module.grpc, "secure_channel", lambda t, creds: made.append("tls") or t)
    if ca is not None:
        (tmp_path / "ca.pem").write_bytes(b"-----BEGIN CERTIFICATE-----\n")
        ca = str(tmp_path / "ca.pem")
    monkeypatch.setattr(cli_module.grpc, "ssl_channel_credentials", lambda root_certificates=None: root_certificates)
    cli_module.open_channel(target, ca, insecure)
    assert made == ["tls" if tls else "plain"]


def test_master_key_reencrypt_says_whether_the_old_key_can_go() -> None:
    stub, shown = run(["master-key", "reencrypt", "--tenant", "t_1", "--dry-run"])
    [(name, request)] = stub.calls
    assert name == "ReencryptSigningKeys" and request.tenant_id == "t_1" and request.dry_run
    assert "k1=1, k2=3" in shown[0] and "still sealed under k1: run again" in shown[0]
    done = pb.ReencryptSigningKeysReport(current_master_key_id="k2", keys_by_master_key={"k2": 4})
    assert "every key is sealed under the current master key" in master_key.reencrypt_report(done)


def test_payload_flags_and_tenant_event_types() -> None:
    stub, _ = run(["endpoints", "create", "--url", "https://h.example.com/", "--event-type", "a.b",
                   "--payload-mode", "fields", "--payload-field", "/id", "--payload-field", "/c/id"])
    request = stub.calls[0][1]
    assert (request.payload_mode, list(request.payload_fields)) == ("fields", ["/id", "/c/id"])
    stub, _ = run(["endpoints", "update", "ep_1", "--payload-mode", "thin"])
    assert sorted(stub.calls[0][1].update_mask.paths) == ["payload_mode"]
    stub, shown = run(["tenants", "event-types", "t_1", "--allow", "invoice.*", "--allow", "order.shipped"])
    assert list(stub.calls[0][1].allowed_event_types) == ["invoice.*", "order.shipped"]
    assert "invoice.*, order.shipped" in shown[0] and "ep_9" in shown[0]


def test_ordering_key_flags_blocked_keys_and_skip_head() -> None:
    stub, _ = run(["endpoints", "create", "--url", "https://h.example.com/", "--event-type", "a.b",
                   "--ordering-key", "/customer/id"])
    assert stub.calls[0][1].ordering_key == "/customer/id"
    stub, _ = run(["endpoints", "update", "ep_1", "--ordering-key", ""])  # '' turns ordering off
    request = stub.calls[0][1]
    assert list(request.update_mask.paths) == ["ordering_key"] and request.endpoint.ordering_key == ""
    stub, _ = run(["endpoints", "update", "ep_1", "--description", "d"])
    assert "ordering_key" not in stub.calls[0][1].update_mask.paths
    assert "ordering key:   object_id" in endpoints.endpoint_detail(pb.Endpoint(ordering_key="object_id"))
    assert "ordering key:   none" in endpoints.endpoint_detail(pb.Endpoint())

    stub, shown = run(["endpoints", "blocked-keys", "ep_1", "--page-size", "10", "--page-token", "tok1"])
    [(name, request)] = stub.calls
    assert name == "ListBlockedKeys" and (request.endpoint_id, request.page_size, request.page_token) == (
        "ep_1", 10, "tok1")
    row = shown[0].splitlines()[1].split()
    assert row[:6] == ["inv_7", "dlv_h", "3", "5", "503", "-"] and "next page token: tok2" in shown[0]

    stub, shown = run(["endpoints", "skip-head", "ep_1", "inv_7", "--delivery-id", "dlv_h", "--reason", "INC-9"])
    [(name, request)] = stub.calls
    assert name == "SkipOrderingHead"
    assert (request.endpoint_id, request.ordering_key, request.delivery_id, request.reason) == (
        "ep_1", "inv_7", "dlv_h", "INC-9")
    assert "skp_1" in shown[0] and "dlv_h" in shown[0]
    with pytest.raises(SystemExit):  # a skip says why
        cli.parser().parse_args(["endpoints", "skip-head", "ep_1", "inv_7"])


def test_delivery_detail_says_which_requests_were_skips() -> None:
    detail = pb.DeliveryDetail(delivery=pb.DeliverySummary(delivery_id="dlv_1"), replays=[
        pb.ReplayAudit(request_id="rq-1", requested_by="key_a", reason="INC-1", action="replay"),
        pb.ReplayAudit(request_id="skp-1", requested_by="key_b", reason="INC-2", action="skip")])
    lines = deliveries.delivery_detail(detail).splitlines()
    assert "ACTION" in next(line for line in lines if line.startswith("REQUESTED"))
    assert any("key_b" in line and " skip " in line and "INC-2" in line for line in lines)


def test_versions_show_each_versions_payload_and_ordering_or_that_they_are_unknown() -> None:
    _, shown = run(["endpoints", "versions", "ep_1"])
    header, v2, v1 = shown[0].splitlines()
    assert "PAYLOAD" in header and "ORDERING" in header
    assert "fields:/id,/customer/id" in v2 and "object_id" in v2
    assert v1.split()[-2:] == ["?", "?"]


def test_a_skipped_delivery_is_listed_as_skipped_and_its_detail_says_why() -> None:
    stub, shown = run(["deliveries", "list", "ep_1", "--status", "skipped"])
    assert list(stub.calls[0][1].statuses) == [pb.DELIVERY_STATUS_SKIPPED]
    assert "dlv_1" in shown[0] and " skipped " in shown[0]
    summary = pb.DeliverySummary(delivery_id="dlv_1", status=pb.DELIVERY_STATUS_SKIPPED)
    text = deliveries.delivery_detail(pb.DeliveryDetail(delivery=summary,
                                                 last_error_class="schema major 1 not accepted (pinned: 2)"))
    assert "skipped, never sent: schema major 1 not accepted (pinned: 2)" in text
    plain = pb.DeliveryDetail(delivery=pb.DeliverySummary(delivery_id="d"))
    assert "never sent" not in deliveries.delivery_detail(plain)


def test_schema_major_flags_on_create_and_update_and_get_shows_them() -> None:
    stub, _ = run(["endpoints", "create", "--url", "https://h.example.com/", "--event-type", "a.b",
                   "--schema-major", "2", "--schema-major", "3"])
    assert list(stub.calls[0][1].schema_majors) == [2, 3]
    stub, _ = run(["endpoints", "update", "ep_1", "--schema-major", "2"])
    request = stub.calls[0][1]
    assert list(request.update_mask.paths) == ["schema_majors"] and list(request.endpoint.schema_majors) == [2]
    stub, _ = run(["endpoints", "update", "ep_1", "--clear-schema-majors"])  # every major again
    request = stub.calls[0][1]
    assert list(request.update_mask.paths) == ["schema_majors"] and list(request.endpoint.schema_majors) == []
    stub, _ = run(["endpoints", "update", "ep_1", "--description", "d"])
    assert "schema_majors" not in stub.calls[0][1].update_mask.paths
    assert "schema majors:  2, 3" in endpoints.endpoint_detail(pb.Endpoint(schema_majors=[2, 3]))
    assert "schema majors:  all" in endpoints.endpoint_detail(pb.Endpoint())


# -- events publish: the producer library, checked against the tenant's catalog ----------------


class OutboxConnection(RecordingConnection):
    """psycopg.connect's connection as `events publish` uses it: a context manager."""

    def __enter__(self) -> OutboxConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class ClosableSource(FakeSource):
    closed = False

    def close(self) -> None:
        self.closed = True


AMOUNT_CATALOG = TenantCatalog({"invoice.paid": CatalogType("reject", {SchemaVersion(1, 0): {
    "type": "object", "properties": {"amount": {"type": "number", "minimum": 0}}, "required": ["amount"]}})},
    "reject")


def publish(data: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
            credential: bool = True) -> tuple[int, OutboxConnection, ClosableSource, str]:
    conn, source, asked = OutboxConnection(), ClosableSource(AMOUNT_CATALOG), []
    monkeypatch.setattr(events.psycopg, "connect", lambda dsn, **kw: conn)
    monkeypatch.setattr(events, "GrpcCatalog", lambda *a, **kw: asked.append((a, kw)) or source)
    monkeypatch.delenv("WEBHOOKCTL_ADMIN_TOKEN", raising=False)
    if credential:
        monkeypatch.setenv("WEBHOOKCTL_API_KEY", "key_acme")
    else:
        monkeypatch.delenv("WEBHOOKCTL_API_KEY", raising=False)
    code = cli.main(["--target", "127.0.0.1:50051", "events", "publish", "--tenant", "acme", "--type",
                     "invoice.paid", "--schema-version", "1.0", "--dsn", "postgresql://outbox", "--data", data])
    assert asked == ([(("127.0.0.1:50051", "key_acme"), {"ca_file": None, "insecure": True, "timeout_s": 30.0})]
                     if credential else [])
    return code, conn, source, capsys.readouterr().err


@pytest.mark.parametrize(("data", "says"), [
    ('{"id": "inv_3", "amount": "lots"}', "/amount: 'lots' is not of type 'number'"),
    ('{"id": "inv_3", "amount": -5}', "/amount: -5 is less than the minimum of 0"),
    ('{"id": "inv_3", "amount": NaN}', "NaN is not a JSON number"),
    ('{"id": "inv_3", "amount": 5, "amount": -5}', "the key 'amount' appears twice"),
])
def test_publish_refuses_what_the_schema_version_or_strict_json_refuses_and_writes_nothing(
        data: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, conn, source, err = publish(data, monkeypatch, capsys)
    assert code == 2 and conn.executed == []
    assert err.startswith("webhookctl: invalid event: ") and says in err, err
    assert source.closed


def test_publish_writes_a_payload_its_schema_version_accepts(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, conn, source, err = publish('{"id": "inv_3", "amount": 5}', monkeypatch, capsys)
    assert code == 0 and len(conn.executed) == 1 and source.fetches == 1 and err == ""


def test_publish_without_a_credential_says_the_catalog_was_not_consulted(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, conn, _, err = publish('{"id": "inv_3", "amount": "lots"}', monkeypatch, capsys, credential=False)
    assert code == 0 and len(conn.executed) == 1  # the job checks it at fan-out
    assert "not checked against the event-type catalog" in err and "WEBHOOKCTL_API_KEY" in err
    code, conn, _, err = publish('{"amount": NaN}', monkeypatch, capsys, credential=False)
    assert code == 2 and conn.executed == [] and "NaN is not a JSON number" in err  # strict JSON, always


def test_publish_with_a_missing_ca_file_is_a_usage_error(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("WEBHOOKCTL_API_KEY", "key_acme")
    code = cli.main(["--target", "cp.example.com:443", "--ca", str(tmp_path / "none.pem"), "events", "publish",
                     "--tenant", "acme", "--type", "invoice.paid", "--dsn", "postgresql://outbox", "--data", "{}"])
    assert code == 2 and "--ca" in capsys.readouterr().err
