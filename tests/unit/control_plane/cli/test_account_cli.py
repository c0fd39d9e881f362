"""webhookctl account: the request's window, the rendering, the exit status, and the servicer's
conversion of the domain account (control_plane.rpc.account_servicer)."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from control_plane.cli import account_cli
from control_plane.cli.main import parser
from control_plane.rpc.account_servicer import account_pb
from core import account as acc

NOW = 1_800_000_000_000  # 2027-01-15T08:00:00Z
HOUR = 3_600_000


def args(*argv: str) -> argparse.Namespace:
    return parser().parse_args(["account", *argv])


@pytest.mark.parametrize(("argv", "since", "until"), [
    ((), "2027-01-15T07:00:00Z", "2027-01-15T08:00:00Z"),
    (("--hours", "24"), "2027-01-14T08:00:00Z", "2027-01-15T08:00:00Z"),
    (("--since", "2027-01-15T06:00:00Z", "--until", "2027-01-15T06:30:00Z"), "2027-01-15T06:00:00Z",
     "2027-01-15T06:30:00Z"),
    (("--since", "2027-01-15T06:00:00"), "2027-01-15T06:00:00Z", "2027-01-15T08:00:00Z"),  # no zone: UTC
    (("--until", "2027-01-15T06:00:00Z", "--hours", "2"), "2027-01-15T04:00:00Z", "2027-01-15T06:00:00Z"),
])
def test_the_window_defaults_to_the_last_hours_ending_now(argv: tuple[str, ...], since: str, until: str) -> None:
    r = account_cli.request(args(*argv), NOW)
    assert (r.start_time.ToJsonString(), r.end_time.ToJsonString()) == (since, until)


def sample(unaccounted: bool) -> acc.Account:
    paid = acc.TypeAccount("invoice.paid", accepted=4, fanned_out=2, no_subscriber=1,
                           dead_lettered=Counter({"schema_invalid": 1}),
                           deliveries=Counter({"succeeded": 2, "failed": 1, "missing": 1 if unaccounted else 0}),
                           skipped=Counter({"schema_major_not_accepted": 1}))
    listed = [acc.Unaccounted("evt_1", "invoice.paid", acc.DELIVERY_MISSING, "dlv_1", "no row")] if unaccounted else []
    return acc.Account("acme", NOW - HOUR, NOW, [paid], listed)


def test_the_servicer_carries_every_figure_of_the_account() -> None:
    m = account_pb(sample(unaccounted=True))
    assert (m.tenant_id, m.balanced, m.start_time.ToMilliseconds(), m.end_time.ToMilliseconds()) == \
        ("acme", False, NOW - HOUR, NOW)
    t = m.event_types[0]
    assert (t.event_type, t.accepted, t.fanned_out, t.no_subscriber, dict(t.dead_lettered), t.balanced) == \
        ("invoice.paid", 4, 2, 1, {"schema_invalid": 1}, True)
    assert (t.deliveries.succeeded, t.deliveries.failed, t.deliveries.missing, dict(t.skipped)) == \
        (2, 1, 1, {"schema_major_not_accepted": 1})
    assert m.total.accepted == 4
    assert [(u.event_id, u.kind, u.delivery_id) for u in m.unaccounted] == [("evt_1", "delivery_missing", "dlv_1")]


@pytest.mark.parametrize("unaccounted", [False, True])
def test_the_rendering_names_the_balance_the_reasons_and_each_unaccounted_event(unaccounted: bool) -> None:
    text = account_cli.render(account_pb(sample(unaccounted)))
    assert ("1 not accounted for" if unaccounted else "every event accounted for") in text
    assert "schema_invalid 1" in text and "schema_major_not_accepted 1" in text
    assert ("evt_1" in text and "dlv_1" in text) == unaccounted
    lines = text.splitlines()
    assert any(line.startswith("invoice.paid") for line in lines) and any(line.startswith("ALL") for line in lines)


def test_without_an_api_key_it_says_which_variable_to_set(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("WEBHOOKCTL_API_KEY", raising=False)
    assert account_cli.main(args()) == 2
    assert "WEBHOOKCTL_API_KEY" in capsys.readouterr().err
