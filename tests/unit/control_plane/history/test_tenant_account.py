"""control_plane.history.account: the account is always the caller's tenant's; dead letters and
skipped rows are placed by event id with their reasons."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from control_plane.domain import DeliveryStatus, Page, Principal
from control_plane.errors import InvalidArgument
from control_plane.history import account as ta
from core import reconcile as rc
from core.fanout import FanoutSnapshot
from core.records import EventRecord, delivery_id_for

NOW = 1_700_000_000_000
MIN = 60_000
ME = Principal("t_me", "key_1", True)  # a read-only key may read its account


def event(event_id: str = "e1", tenant: str = "t_me") -> EventRecord:
    return EventRecord(event_id=event_id, tenant_id=tenant, event_type="invoice.paid", schema_version="1.0",
                       object_id="", object_version=0, occurred_at_ms=NOW, payload=b"{}")


def letter(reason: str, extra: dict[str, str] | None = None, original: bytes = b"") -> bytes:
    return json.dumps({"reason": reason, "detail": "", "original_base64": base64.b64encode(original).decode(),
                       "source_topic": "webhooks.events", "refused_at_ms": NOW, "extra": extra or {}}).encode()


@pytest.mark.parametrize(("case", "value", "want"), [
    ("schema letter names its event in extra", letter("schema_invalid", {"event_id": "e1", "tenant_id": "t_me"}),
     ("e1", "t_me", "schema_invalid")),
    ("conflict letter carries the event as parsed", letter("event_id_conflict", original=event("e2").to_json()),
     ("e2", "t_me", "event_id_conflict")),
    ("an unparseable record names nobody", letter("invalid_json", original=b"{nope"), None),
    ("not json", b"\x00\x01", None),
    ("json without a reason", b'{"x": 1}', None),
    ("a list", b"[1]", None),
])
def test_a_dead_letter_names_its_event_and_tenant(case: str, value: bytes, want: Any) -> None:
    assert ta.letter_event(value, 1 << 20) == want, case


@dataclass
class FakeWindow:
    asked: list[tuple[int, int, str]] = field(default_factory=list)

    def tenant_window(self, since_ms: int, until_ms: int, tenant_id: str) -> tuple[rc.Inputs, rc.Report,
                                                                                    dict[str, str]]:
        self.asked.append((since_ms, until_ms, tenant_id))
        snaps = [FanoutSnapshot("e1", tenant_id, NOW - MIN, ()), FanoutSnapshot("e2", tenant_id, NOW - MIN, ())]
        inputs = rc.Inputs([rc.TopicEvent(e, tenant_id, NOW - MIN) for e in ("e1", "e2", "e3")], 0, snaps, {}, {})
        report = rc.reconcile(inputs, since_ms, until_ms, tenant_id, NOW, 15 * MIN)
        return inputs, report, {"e1": "invoice.paid", "e2": "invoice.paid", "e3": "user.created"}


@dataclass
class FakeEndpoints:
    ids: list[str]

    def list(self, principal: Principal, size: int, cursor: str) -> Page[Any]:
        assert principal == ME
        return Page(tuple(SimpleNamespace(endpoint_id=e) for e in self.ids), "")


@dataclass
class FakeDeliveries:
    skipped: dict[str, list[str]]  # endpoint -> event ids skipped there
    asked: list[Any] = field(default_factory=list)

    def list(self, principal: Principal, endpoint_id: str, statuses: list[DeliveryStatus], since: int | None,
             until: int | None, limit: int, cursor: str) -> Page[Any]:
        assert principal == ME
        self.asked.append((endpoint_id, statuses, since, until))
        return Page(tuple(SimpleNamespace(delivery_id=delivery_id_for(e, endpoint_id), event_id=e)
                          for e in self.skipped.get(endpoint_id, [])), "")

    def get(self, principal: Principal, delivery_id: str) -> Any:
        return SimpleNamespace(last_error_class="schema_major_not_accepted")


def service(letters: dict[str, str] | None = None) -> tuple[ta.TenantAccountService, FakeWindow, list[Any]]:
    window = FakeWindow()
    asked: list[Any] = []

    def dead_letters(tenant: str, since: int, until: int) -> dict[str, str]:
        asked.append((tenant, since, until))
        return letters or {}
    s = ta.TenantAccountService(window, FakeEndpoints(["ep_a", "ep_b"]),  # type: ignore[arg-type]
                                FakeDeliveries({"ep_b": ["e2"]}), dead_letters)  # type: ignore[arg-type]
    return s, window, asked


def test_the_account_is_the_principals_tenants_and_places_every_source() -> None:
    s, window, letters_asked = service({"e3": "schema_invalid"})
    a = s.account(ME, NOW - 60 * MIN, NOW)
    assert window.asked == [(NOW - 60 * MIN, NOW, "t_me")]
    assert letters_asked == [("t_me", NOW - 60 * MIN, NOW)]
    by = {t.event_type: t for t in a.types}
    assert (by["invoice.paid"].no_subscriber, by["invoice.paid"].fanned_out) == (1, 1)  # e2 skipped on ep_b
    assert dict(by["invoice.paid"].skipped) == {"schema_major_not_accepted": 1}
    assert dict(by["user.created"].dead_lettered) == {"schema_invalid": 1}
    assert a.balanced and a.tenant_id == "t_me"
    d = ta.as_dict(a)
    assert d["total"]["accepted"] == 3 and d["balanced"] is True
    json.dumps(d)  # plain data


@pytest.mark.parametrize(("since", "until", "message"), [
    (None, NOW, "required"), (NOW, None, "required"), (NOW, NOW, "before"), (NOW, NOW - 1, "before"),
    (NOW - ta.MAX_WINDOW_MS - 1, NOW, "7 days"),
])
def test_a_window_out_of_bounds_is_refused_before_anything_is_read(since: int | None, until: int | None,
                                                                     message: str) -> None:
    s, window, letters = service()
    with pytest.raises(InvalidArgument, match=message):
        s.account(ME, since, until)
    assert window.asked == [] and letters == []


def test_an_event_that_was_never_fanned_out_nor_dead_lettered_is_listed() -> None:
    s, _, _ = service()
    a = s.account(ME, NOW - 60 * MIN, NOW)
    assert [(u.event_id, u.kind) for u in a.unaccounted] == [("e3", "event_not_fanned_out")]
    assert not a.balanced
