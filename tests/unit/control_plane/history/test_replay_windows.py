"""Replay windows in the control plane, on in-memory fakes: the catalog field and the tenant's
pattern rules (control_plane/catalog/service.py), and what single replays, bulk recoveries and the
console's refusal make of them (control_plane/history/deliveries.py, control_plane/history/replay_windows.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
from aiohttp.test_utils import TestClient, TestServer

from control_plane import errors
from control_plane.catalog.service import Caller, EventTypeEntry, ReplayRuleEntry
from control_plane.cli import deliveries as deliveries_cli
from control_plane.cli import event_types as catalog_cli
from control_plane.cli import main as cli
from control_plane.console.app import Console, build_app
from control_plane.console.sessions import Kind, Session, SessionCodec
from control_plane.cursor import Cursors
from control_plane.domain import (
    Attempt,
    DeliveryDetail,
    DeliveryStatus,
    DeliverySummary,
    Endpoint,
    Principal,
    ReplayAudit,
)
from control_plane.history.deliveries import DeliveryDeps, DeliveryService
from control_plane.history.replay_windows import CatalogReplayWindows
from control_plane.rpc.api import pb
from control_plane.rpc.catalog_api import cpb
from core.records import CatalogTypeRecord, ReplayRequest
from core.timeutil import ms_to_iso
from tests.unit.control_plane.catalog.test_catalog_publication import ADMIN, MemoryCatalog, world
from tests.unit.control_plane.cli.test_catalog_cli import RecordingStub
from tests.unit.control_plane.endpoints.test_control_plane_service import (
    ALICE,
    BOB,
    DAY_MS,
    World,
    add_delivery,
    counting_random,
    create,
)
from tests.unit.control_plane.endpoints.test_control_plane_service import w as w  # noqa: F401 -- the fixture

S, H = 1000, 3_600_000

# -- the catalog ---------------------------------------------------------------------------------


def test_a_types_replay_window_is_a_catalog_field_changed_like_the_others() -> None:
    cw = world()
    cw.service.create_type(ADMIN, "user.disabled", "", "", "")
    published = len(cw.topic.records)
    entry = cw.service.update_type(ADMIN, "user.disabled", {"replay_window": " 2S "})
    assert (entry.replay_window, entry.revision, entry.updated_by) == ("2s", 2, "admin")
    assert cw.store.get_type("acme", "user.disabled") == entry
    # Published like any change of the type (the job's records carry no window: it is not theirs).
    assert [type(r) for r in cw.topic.records[published:]][:1] == [CatalogTypeRecord]
    assert cw.service.update_type(ADMIN, "user.disabled", {"replay_window": "never"}).replay_window == "never"
    assert cw.service.update_type(ADMIN, "user.disabled", {"replay_window": ""}).replay_window == ""


@pytest.mark.parametrize(("window", "says"), [("2 weeks", "never or a duration"), ("31d", "30-day history")])
def test_a_bad_window_is_refused_with_what_is_accepted(window: str, says: str) -> None:
    cw = world()
    cw.service.create_type(ADMIN, "user.disabled", "", "", "")
    with pytest.raises(errors.InvalidArgument, match=says):
        cw.service.update_type(ADMIN, "user.disabled", {"replay_window": window})
    assert cw.store.get_type("acme", "user.disabled").revision == 1  # type: ignore[union-attr]


def test_update_names_the_fields_it_accepts() -> None:
    cw = world()
    cw.service.create_type(ADMIN, "user.disabled", "", "", "")
    with pytest.raises(errors.InvalidArgument, match="description, group, enforcement, replay_window"):
        cw.service.update_type(ADMIN, "user.disabled", {"status": "x"})


def test_tenant_rules_are_set_listed_and_removed_with_who_and_when() -> None:
    cw = world()
    settings = cw.service.set_replay_rule(ADMIN, "user.*", "1H")
    assert settings.replay_rules == (ReplayRuleEntry("user.*", "1h", cw.clock.now, "admin"),)
    cw.service.set_replay_rule(ADMIN, "account.deleted", "never")
    assert [r.pattern for r in cw.service.settings("acme").replay_rules] == ["account.deleted", "user.*"]
    assert cw.service.set_replay_rule(ADMIN, "user.*", "").replay_rules == (
        ReplayRuleEntry("account.deleted", "never", cw.clock.now, "admin"),)
    assert cw.service.settings("other").replay_rules == ()


def test_tenant_rules_need_catalog_writing_and_valid_values() -> None:
    cw = world()
    with pytest.raises(errors.PermissionDenied):
        cw.service.set_replay_rule(Caller("acme", "key_r", may_write=False), "user.*", "1h")
    with pytest.raises(errors.InvalidArgument, match="must be an event type"):
        cw.service.set_replay_rule(ADMIN, "*.deleted", "1h")
    with pytest.raises(errors.InvalidArgument, match="never or a duration"):
        cw.service.set_replay_rule(ADMIN, "user.*", "soon")
    assert cw.store.replay_rules == {}


# -- replays ---------------------------------------------------------------------------------------


@dataclass
class Policy:
    w: World
    catalog: MemoryCatalog
    deliveries: DeliveryService


@pytest.fixture
def p(w: World) -> Policy:  # noqa: F811 -- the fixture imported above
    catalog = MemoryCatalog()
    deliveries = DeliveryService(DeliveryDeps(
        endpoints=w.store, history=w.store, publisher=w.publisher, now_ms=w.clock,  # type: ignore[arg-type]
        random_bytes=counting_random(), cursors=Cursors(b"cursor-key"), progress_every=2,  # type: ignore[arg-type]
        replay_windows=CatalogReplayWindows(catalog).for_tenant))
    return Policy(w, catalog, deliveries)


def typed(p: Policy, e: Endpoint, n: int, event_type: str, age_ms: int = 0, tenant: str = "tenant-a",
          status: DeliveryStatus = DeliveryStatus.FAILED) -> str:
    """A delivery of ``event_type`` created ``age_ms`` (+ n ms) ago."""
    did = add_delivery(p.w, e, n, status, age_ms=age_ms, tenant=tenant)
    d = p.w.store.deliveries[did]
    p.w.store.deliveries[did] = replace(d, summary=replace(d.summary, event_type=event_type))
    return did


def catalogue(p: Policy, tenant: str, name: str, window: str) -> None:
    p.catalog.types[(tenant, name)] = EventTypeEntry(tenant, name, "", "", "active", None, "reject", 0, 0, "admin", 1,
                                                     replay_window=window)


def rule(p: Policy, tenant: str, pattern: str, window: str) -> None:
    p.catalog.replay_rules[(tenant, pattern)] = ReplayRuleEntry(pattern, window, 0, "admin")


def test_a_replay_inside_the_window_is_queued_with_its_closing_time(p: Policy) -> None:
    e = create(p.w)
    catalogue(p, "tenant-a", "user.disabled", "2s")
    did = typed(p, e, 1, "user.disabled")
    created = p.w.store.deliveries[did].summary.created_at_ms
    p.deliveries.replay(ALICE, did, "r1")
    [req] = p.w.publisher.replays
    assert (req.replay_closes_at_ms, req.replay_rule) == (created + 2 * S, "catalog user.disabled: replay window 2s")
    assert ReplayRequest.from_json(req.to_json()) == req


def test_a_replay_past_the_window_is_refused_naming_the_rule_and_when_it_closed(p: Policy) -> None:
    e = create(p.w)
    catalogue(p, "tenant-a", "user.disabled", "2s")
    did = typed(p, e, 1, "user.disabled")
    created = p.w.store.deliveries[did].summary.created_at_ms
    p.w.clock.now = created + 2 * S
    with pytest.raises(errors.FailedPrecondition) as refused:
        p.deliveries.replay(ALICE, did, "r1")
    assert str(refused.value) == ("replay not allowed: catalog user.disabled: replay window 2s "
                                  f"(closed at {ms_to_iso(created + 2 * S)})")
    assert not p.w.publisher.replays and not p.w.store.replay_audit  # nothing queued nor audited
    # the history stays whole and readable
    assert p.deliveries.get(ALICE, did).attempts
    assert p.deliveries.replay_refusal(ALICE, p.deliveries.get(ALICE, did)) == str(refused.value)


def test_the_window_counts_from_the_events_occurrence(p: Policy) -> None:
    e = create(p.w)
    catalogue(p, "tenant-a", "user.disabled", "1h")
    did = typed(p, e, 1, "user.disabled")
    summary = p.w.store.deliveries[did].summary
    p.catalog.occurred[summary.event_id] = summary.created_at_ms - H  # sent an hour after it happened
    with pytest.raises(errors.FailedPrecondition, match="replay window 1h"):
        p.deliveries.replay(ALICE, did, "")
    p.catalog.occurred[summary.event_id] = summary.created_at_ms + H  # a producer clock ahead
    p.deliveries.replay(ALICE, did, "")
    assert p.w.publisher.replays[0].replay_closes_at_ms == summary.created_at_ms + H


def test_never_refuses_at_once_and_an_unset_window_keeps_the_history(p: Policy) -> None:
    e = create(p.w)
    catalogue(p, "tenant-a", "account.deleted", "never")
    catalogue(p, "tenant-a", "invoice.paid", "")
    gone = typed(p, e, 1, "account.deleted")
    old = typed(p, e, 2, "invoice.paid", age_ms=29 * DAY_MS)
    with pytest.raises(errors.FailedPrecondition, match="catalog account.deleted: replay window never"):
        p.deliveries.replay(ALICE, gone, "")
    p.deliveries.replay(ALICE, old, "")
    [req] = p.w.publisher.replays
    assert (req.replay_closes_at_ms, req.replay_rule) == (None, "")
    assert b"replay_closes_at_ms" not in req.to_json()  # the request as an older job reads it


def test_a_tenant_pattern_rule_governs_types_without_a_window_and_no_other_tenant(p: Policy) -> None:
    e = create(p.w)
    rule(p, "tenant-a", "user.*", "1h")
    catalogue(p, "tenant-a", "user.renamed", "1d")  # its own window wins over the pattern
    old_user = typed(p, e, 1, "user.disabled", age_ms=2 * H)
    renamed = typed(p, e, 2, "user.renamed", age_ms=2 * H)
    invoice = typed(p, e, 3, "invoice.paid", age_ms=2 * H)
    with pytest.raises(errors.FailedPrecondition, match=r"tenant rule user\.\*: replay window 1h"):
        p.deliveries.replay(ALICE, old_user, "")
    p.deliveries.replay(ALICE, renamed, "")
    p.deliveries.replay(ALICE, invoice, "")
    # Bob's tenant has no rule: the same type and age replays.
    f = create(p.w, BOB)
    bobs = typed(p, f, 4, "user.disabled", age_ms=2 * H, tenant="tenant-b")
    p.deliveries.replay(BOB, bobs, "")
    assert [r.delivery_id for r in p.w.publisher.replays] == [renamed, invoice, bobs]


def test_the_refusal_shown_instead_of_the_replay_form(p: Policy) -> None:
    e = create(p.w)
    rule(p, "tenant-a", "user.*", "1h")
    fresh, old = typed(p, e, 1, "user.disabled"), typed(p, e, 2, "user.disabled", age_ms=2 * H)
    assert p.deliveries.replay_refusal(ALICE, p.deliveries.get(ALICE, fresh)) == ""
    assert p.deliveries.replay_refusal(ALICE, p.deliveries.get(ALICE, old)).startswith(
        "replay not allowed: tenant rule user.*: replay window 1h (closed at ")


def test_a_bulk_recovery_skips_deliveries_past_their_window_and_reports_why(p: Policy) -> None:
    e = create(p.w)
    catalogue(p, "tenant-a", "user.disabled", "1h")
    rule(p, "tenant-a", "account.*", "never")
    inside = [typed(p, e, n, "user.disabled") for n in (1, 2)]
    outside = [typed(p, e, n, "user.disabled", age_ms=2 * H) for n in (3, 4, 5)]
    deleted = typed(p, e, 6, "account.deleted")
    other = typed(p, e, 7, "invoice.paid", age_ms=2 * H)
    typed(p, e, 8, "user.disabled", age_ms=2 * H, status=DeliveryStatus.SUCCEEDED)  # not failed: not counted
    progress = list(p.deliveries.recover(ALICE, e.endpoint_id, p.w.clock.now - DAY_MS, p.w.clock.now + 1))
    by_rule = (("catalog user.disabled: replay window 1h", 3), ("tenant rule account.*: replay window never", 1))
    assert [(x.total, x.replayed, x.skipped, x.done, x.not_allowed) for x in progress] == [
        (3, 0, 0, False, 4), (3, 2, 0, False, 0), (3, 3, 0, True, 4)]
    assert progress[0].not_allowed_by_rule == progress[-1].not_allowed_by_rule == by_rule
    assert sorted(r.delivery_id for r in p.w.publisher.replays) == sorted([*inside, other])
    assert not {r.delivery_id for r in p.w.publisher.replays} & {*outside, deleted}
    assert all(not p.deliveries.get(ALICE, did).replays for did in [*outside, deleted])  # not audited either


def test_a_window_closing_between_the_two_passes_is_refused_not_skipped(p: Policy) -> None:
    e = create(p.w)
    catalogue(p, "tenant-a", "user.disabled", "1h")
    closing = typed(p, e, 1, "user.disabled", age_ms=H - 10 * S)
    typed(p, e, 2, "invoice.paid")
    stream = p.deliveries.recover(ALICE, e.endpoint_id, p.w.clock.now - DAY_MS, p.w.clock.now + 1)
    first = next(stream)
    assert (first.total, first.not_allowed) == (2, 0)
    p.w.clock.now += 20 * S
    last = list(stream)[-1]
    assert (last.total, last.replayed, last.skipped, last.not_allowed) == (2, 1, 0, 1)
    assert closing not in {r.delivery_id for r in p.w.publisher.replays}


def test_nothing_to_replay_but_refusals_ends_at_once_with_them(p: Policy) -> None:
    e = create(p.w)
    rule(p, "tenant-a", "*", "1h")
    typed(p, e, 1, "user.disabled", age_ms=2 * H)
    progress = list(p.deliveries.recover(ALICE, e.endpoint_id, p.w.clock.now - DAY_MS, p.w.clock.now + 1))
    assert [(x.total, x.done, x.not_allowed, x.not_allowed_by_rule) for x in progress] == [
        (0, True, 1, (("tenant rule *: replay window 1h", 1),))]
    assert not p.w.publisher.replays


def test_a_bulk_recovery_reads_each_types_window_and_the_rules_once(p: Policy) -> None:
    e = create(p.w)
    rule(p, "tenant-a", "user.*", "1h")
    for n in range(1, 8):
        typed(p, e, n, "user.disabled")
    reads: list[str] = []
    real_get, real_rules = p.catalog.get_type, p.catalog.list_replay_rules

    def get_type(tenant_id: str, name: str):  # type: ignore[no-untyped-def]
        reads.append(name)
        return real_get(tenant_id, name)

    def list_rules(tenant_id: str):  # type: ignore[no-untyped-def]
        reads.append("rules")
        return real_rules(tenant_id)

    p.catalog.get_type, p.catalog.list_replay_rules = get_type, list_rules  # type: ignore[method-assign]
    list(p.deliveries.recover(ALICE, e.endpoint_id, p.w.clock.now - DAY_MS, p.w.clock.now + 1))
    assert sorted(reads) == ["rules", "user.disabled"]


# -- the console's delivery page -------------------------------------------------------------------


class _Deliveries:
    def __init__(self, detail: DeliveryDetail, refusal: str) -> None:
        self.detail, self.refusal = detail, refusal

    def get(self, principal: Principal, delivery_id: str) -> DeliveryDetail:
        return self.detail

    def replay_refusal(self, principal: Principal, detail: DeliveryDetail) -> str:
        return self.refusal


def _page(refusal: str) -> str:
    codec = SessionCodec(b"k" * 32)
    now = 1_800_000_000_000
    session = Session(sid="s1", kind=Kind.PORTAL, expires_at_ms=now + 1000, tenant_id="acme", key_id="key_1")
    summary = DeliverySummary("dlv_1", "evt_1", "acme", "ep_1", "user.disabled", DeliveryStatus.FAILED, 1, 500,
                              now - H, None)
    attempt = Attempt(1, "att1", now - H, now - H + 5, 500, 5, "failed", "http_5xx", False, 1, "https://x", (1,),
                      "", "")
    refused = ReplayAudit("dlv_1", "rpl_1/refused", "acme", "key_1", now - 1, "replay not allowed: ...", "refused")
    detail = DeliveryDetail(summary, 1, False, None, None, "http_5xx", (attempt,), (refused,))
    services = SimpleNamespace(now_ms=lambda: now, random_bytes=lambda n: b"r" * n,
                               deliveries=_Deliveries(detail, refusal))
    app = build_app(Console(services, codec, secure_cookies=False))  # type: ignore[arg-type]

    async def get() -> str:
        async with TestClient(TestServer(app)) as client:
            response = await client.get(f"/s/{codec.encode(session)}/deliveries/dlv_1")
            assert response.status == 200
            return await response.text()

    return asyncio.run(get())


def test_the_delivery_page_shows_the_refusal_instead_of_the_replay_form_and_the_whole_history() -> None:
    refusal = "replay not allowed: catalog user.disabled: replay window 1h (closed at 2027-01-15T07:00:00.000Z)"
    html = _page(refusal)
    assert 'id="replay-refused"' in html and refusal in html
    assert 'id="replay"' not in html and "Send again" not in html
    assert 'id="attempts"' in html and "http_5xx" in html  # the history stays visible
    assert "refused" in html.split('id="replays"')[1]  # the job's refusal, in the request audit


def test_the_delivery_page_keeps_the_replay_form_while_the_window_is_open() -> None:
    html = _page("")
    assert 'id="replay"' in html and 'id="replay-refused"' not in html


# -- webhookctl ------------------------------------------------------------------------------------


def test_webhookctl_sets_a_types_window_and_a_tenant_rule() -> None:
    stub = RecordingStub()
    catalog_cli.run(cli.parser().parse_args(["event-types", "update", "user.disabled", "--replay-window", "1h"]),
                    stub)
    catalog_cli.run(cli.parser().parse_args(["event-types", "--tenant", "acme", "replay-rule", "user.*", "never"]),
                    stub)
    [(_, update), (method, rule_request)] = stub.calls
    assert list(update.update_fields) == ["replay_window"] and update.replay_window == "1h"
    assert (method, rule_request.tenant_id, rule_request.pattern, rule_request.replay_window) == (
        "SetReplayRule", "acme", "user.*", "never")
    shown = catalog_cli.render(cpb.CatalogSettings(tenant_id="acme", unknown_types="reject", replay_rules=[
        cpb.ReplayRule(pattern="user.*", replay_window="never", updated_by="key_1")]))
    assert "replay window of user.*: never" in shown
    assert "replay window: 1h" in catalog_cli.render(cpb.CatalogEventType(name="user.disabled", replay_window="1h"))


def test_webhookctl_shows_the_refusal_and_a_recoverys_split(capsys: pytest.CaptureFixture[str]) -> None:
    refusal = "replay not allowed: tenant rule user.*: replay window 1h (closed at 2027-01-15T07:00:00.000Z)"
    shown = deliveries_cli.delivery_detail(pb.DeliveryDetail(delivery=pb.DeliverySummary(delivery_id="d"),
                                                  replay_refusal=refusal))
    assert refusal in shown
    deliveries_cli.ProgressBar().update(pb.RecoverProgress(total=2, replayed=2, done=True, not_allowed=3,
                                                not_allowed_by_rule={"tenant rule user.*: replay window 1h": 3}))
    err = capsys.readouterr().err
    assert "2/2 replayed, 0 skipped, 3 past their replay window" in err
    assert "3 by tenant rule user.*: replay window 1h" in err
