"""Operational events in core: the catalog, ids, the no-loop rule, breaker episodes, auto-disable."""

from __future__ import annotations

import json

import pytest

from core import breaker as brk
from core import operational_events as ops
from core.event_schemas import SchemaVersion, check_schema, compile_validator
from core.fanout import filter_accepts

CFG = brk.BreakerConfig(failure_threshold=2, fast_failure_threshold=1, open_s=1, max_open_s=8)
DAY_MS = 24 * 3600 * 1000


# -- the no-loop rule ------------------------------------------------------------------------------

@pytest.mark.parametrize(("cause", "emits"), [
    ("invoice.paid", True),
    ("", True),  # no delivery caused it: a person's change
    ("webhook.ping", True),  # the platform's ping is not an operational event
    ("webhooks.endpoint.failing", False),
    ("webhooks.delivery.exhausted", False),
    ("webhooks.endpoint.secret_rotated", False),
    ("webhooksx.other", True),
])
def test_an_observation_caused_by_an_operational_delivery_emits_nothing(cause: str, emits: bool) -> None:
    assert ops.emits_event(cause) is emits


# -- ids -------------------------------------------------------------------------------------------

def test_ids_are_derived_from_what_happened() -> None:
    a = ops.event_id("ep_1", ops.SIGNAL_FAILING, "3")
    assert a == ops.event_id("ep_1", ops.SIGNAL_FAILING, "3")
    assert a.startswith("evt_ops_")
    others = {ops.event_id("ep_1", ops.SIGNAL_FAILING, "4"), ops.event_id("ep_2", ops.SIGNAL_FAILING, "3"),
              ops.event_id("ep_1", ops.SIGNAL_RECOVERED, "3"), ops.event_id("ep_1:f", "ailing", "3")}
    assert a not in others and len(others) == 4


# -- breaker episodes ------------------------------------------------------------------------------

def test_a_breaker_counts_its_failing_episodes_and_keeps_the_count_when_it_closes() -> None:
    s = brk.CLOSED
    s = brk.on_failure(s, 0, False, CFG)
    s = brk.on_failure(s, 1, False, CFG)
    assert s.state is brk.CircuitState.OPEN and s.episodes == 1
    _, s = brk.allow(s, 2_000)
    s = brk.on_failure(s, 2_000, False, CFG)  # a failed probe re-opens: the same episode
    assert s.state is brk.CircuitState.OPEN and s.episodes == 1
    s = brk.on_success(s)
    assert s.state is brk.CircuitState.CLOSED and s.episodes == 1 and s.consecutive_failures == 0
    s = brk.on_failure(brk.on_failure(s, 5_000, False, CFG), 5_001, False, CFG)
    assert s.episodes == 2


@pytest.mark.parametrize(("before", "after", "transition"), [
    (brk.CLOSED, brk.BreakerState(brk.CircuitState.OPEN, 2, 0, 1000, 1, None, 1), ops.SIGNAL_FAILING),
    (brk.BreakerState(brk.CircuitState.OPEN, 2, 0, 1000, 1, None, 1), brk.BreakerState(episodes=1),
     ops.SIGNAL_RECOVERED),
    (brk.BreakerState(brk.CircuitState.HALF_OPEN, 2, 0, 1000, 1, 1000, 1), brk.BreakerState(episodes=1),
     ops.SIGNAL_RECOVERED),
    (brk.BreakerState(brk.CircuitState.HALF_OPEN, 2, 0, 1000, 1, 1000, 1),
     brk.BreakerState(brk.CircuitState.OPEN, 3, 2000, 4000, 2, None, 1), None),
    (brk.CLOSED, brk.BreakerState(consecutive_failures=1), None),
    (brk.BreakerState(consecutive_failures=1), brk.CLOSED, None),
])
def test_breaker_transitions(before: brk.BreakerState, after: brk.BreakerState, transition: str | None) -> None:
    assert ops.breaker_transition(before, after) == transition


# -- the catalog -----------------------------------------------------------------------------------

def test_the_catalog_has_every_type_under_the_reserved_prefix() -> None:
    assert set(ops.CATALOG) == {ops.ENDPOINT_FAILING, ops.ENDPOINT_RECOVERED, ops.ENDPOINT_DISABLED,
                                ops.ENDPOINT_ENABLED, ops.DELIVERY_EXHAUSTED, ops.SECRET_ROTATED}
    assert all(ops.is_operational(name) for name in ops.CATALOG)


@pytest.mark.parametrize("name", sorted(ops.CATALOG))
def test_each_type_has_a_valid_schema_a_version_and_an_example_that_validates(name: str) -> None:
    t = ops.CATALOG[name]
    check_schema(t.schema)
    SchemaVersion.parse(t.version)
    assert compile_validator(t.schema)(ops.example(name)) is None


@pytest.mark.parametrize("name", sorted(ops.CATALOG))
def test_a_built_event_validates_against_its_schema(name: str) -> None:
    event = ops.build(name, "t_1", "ep_1", "evt_ops_x", 1_000, ops.CATALOG[name].example_data)
    body = json.loads(event.payload)
    assert compile_validator(ops.CATALOG[name].schema)(body) is None
    assert (event.event_type, event.tenant_id, event.object_id, event.event_id) == (name, "t_1", "ep_1", "evt_ops_x")
    assert body["occurred_at"] == "1970-01-01T00:00:01.000Z"


def test_an_unknown_type_is_refused() -> None:
    with pytest.raises(ValueError):
        ops.build("webhooks.nope", "t", "e", "i", 0, {})


@pytest.mark.parametrize(("filters", "accepted"), [
    (["*"], False),  # operational events are asked for by name
    (["webhooks.*"], True),
    (["webhooks.endpoint.*"], True),
    (["webhooks.endpoint.failing"], True),
    (["invoice.*"], False),
])
def test_operational_types_need_an_explicit_subscription(filters: list[str], accepted: bool) -> None:
    assert filter_accepts(filters, ops.ENDPOINT_FAILING) is accepted
    assert filter_accepts(["*"], "invoice.paid")


# -- auto-disable ----------------------------------------------------------------------------------

POLICY = ops.AutoDisablePolicy(window_s=100, warn_at=(0.5, 0.7, 0.9))
CLOCK = ops.FailingClock("t_1", "ep_1", since_ms=1_000_000, episode=1)


@pytest.mark.parametrize(("elapsed_s", "warned", "expected"), [
    (0, 0, None),
    (49.999, 0, None),
    (50, 0, ops.Warn(0.5, 1, 1_100_000)),
    (60, 1, None),
    (70, 1, ops.Warn(0.7, 2, 1_100_000)),
    (95, 1, ops.Warn(0.9, 3, 1_100_000)),  # the highest share crossed; 0.7 is skipped
    (95, 3, None),
    (99.999, 3, None),
    (100, 3, ops.Disable(False)),
    (100, 0, ops.Disable(False)),  # a control plane down all along disables at once
    (500, 3, ops.Disable(False)),
])
def test_what_is_due_for_a_failing_endpoint(elapsed_s: float, warned: int, expected: object) -> None:
    clock = ops.FailingClock(CLOCK.tenant_id, CLOCK.endpoint_id, CLOCK.since_ms, 1, warned)
    assert ops.due(clock, POLICY, CLOCK.since_ms + int(elapsed_s * 1000)) == expected


def test_dry_run_only_warns_and_an_ended_clock_says_nothing_more() -> None:
    dry = ops.AutoDisablePolicy(window_s=100, dry_run=True)
    assert ops.due(CLOCK, dry, CLOCK.since_ms + 100_000) == ops.Disable(dry_run=True)
    ended = ops.FailingClock("t_1", "ep_1", CLOCK.since_ms, 1, 3, ended=True)
    assert ops.due(ended, dry, CLOCK.since_ms + 500_000) is None
    assert ops.next_due_ms(ended, dry) is None


def test_auto_disable_turned_off_says_nothing() -> None:
    off = ops.AutoDisablePolicy(enabled=False)
    assert ops.due(CLOCK, off, CLOCK.since_ms + 10 * DAY_MS) is None
    assert ops.next_due_ms(CLOCK, off) is None


@pytest.mark.parametrize(("warned", "expected"), [(0, 1_050_000), (1, 1_070_000), (3, 1_100_000)])
def test_next_due(warned: int, expected: int) -> None:
    clock = ops.FailingClock("t_1", "ep_1", CLOCK.since_ms, 1, warned)
    assert ops.next_due_ms(clock, POLICY) == expected


def test_enabling_again_restarts_the_clock() -> None:
    ended = ops.FailingClock("t_1", "ep_1", CLOCK.since_ms, 4, warned=3, ended=True, quiet=True)
    fresh = ops.restarted(ended, 5_000_000)
    assert fresh == ops.FailingClock("t_1", "ep_1", 5_000_000, 4, 0, False, True)
    assert ops.due(fresh, POLICY, 5_000_000 + 49_000) is None
    assert ops.due(fresh, POLICY, 5_000_000 + 100_000) == ops.Disable(False)


def test_the_default_policy_is_five_days_warning_at_half_and_more() -> None:
    p = ops.AutoDisablePolicy()
    assert (p.window_s, p.warn_at, p.dry_run) == (5 * 24 * 3600, (0.5, 0.7, 0.9), False)


@pytest.mark.parametrize("kwargs", [
    {"window_s": 0}, {"window_s": 91 * 24 * 3600}, {"warn_at": (0.0,)}, {"warn_at": (1.0,)},
    {"warn_at": (0.7, 0.5)}, {"warn_at": (0.5, 0.5)}, {"warn_at": tuple(i / 20 for i in range(1, 13))},
])
def test_a_bad_policy_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ops.AutoDisablePolicy(**kwargs)  # type: ignore[arg-type]


# -- the events of a person's change, owed until Kafka confirms them ---------------------------------

MARK = ops.ChangeMark(config_version=5, changed_by="key_a", change="disable")


@pytest.mark.parametrize(("latest", "written", "expected"), [
    (None, None, ops.PendingVerdict.DROP),  # no endpoint row at all: nothing was changed
    (4, None, ops.PendingVerdict.WAIT),  # the write has not applied (yet): a Paxos round may finish it
    (5, MARK, ops.PendingVerdict.PUBLISH),  # the row is the announced write
    (7, MARK, ops.PendingVerdict.PUBLISH),  # changed again since: its audit row is the announced write
    (5, ops.ChangeMark(5, "key_b", "disable"), ops.PendingVerdict.DROP),  # another writer took v5
    (5, ops.ChangeMark(5, "key_a", "enable"), ops.PendingVerdict.DROP),
    (5, ops.ChangeMark(5, "auto-disable", "disable: auto_disabled ..."), ops.PendingVerdict.DROP),
    (5, ops.ChangeMark(5, "key_a", "disable"), ops.PendingVerdict.PUBLISH),  # a concurrent twin: the same event
    (7, None, ops.PendingVerdict.WAIT),  # v5's audit row not readable: not decided on a missing row
])
def test_what_a_sweep_does_with_a_pending_event(latest: int | None, written: ops.ChangeMark | None,
                                                expected: ops.PendingVerdict) -> None:
    assert ops.pending_verdict(MARK, latest, written) is expected
