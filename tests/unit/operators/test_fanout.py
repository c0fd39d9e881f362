"""core/fanout.py: filter matching, endpoint selection, config versions, the clock, new deliveries."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.fanout import (
    DEGRADED,
    HOLD,
    RELEASE,
    ClockFollower,
    NewDelivery,
    SkippedDelivery,
    deliveries_for,
    filter_accepts,
    leave_out_pinned,
    newer,
    select_endpoints,
    snapshot_for,
    tick_covers,
)
from core.records import EndpointConfig, EndpointStatus, EventRecord, delivery_id_for

NOW = 1_700_000_000_000
DAY_MS = 24 * 3600 * 1000

EVENT = EventRecord(
    event_id="evt_1", tenant_id="t_1", event_type="invoice.paid", schema_version="2026-01-01",
    object_id="inv_9", object_version=3, occurred_at_ms=NOW - 5000, payload=b"{}",
)


def endpoint(
    endpoint_id: str,
    event_types: tuple[str, ...] = ("*",),
    tenant_id: str = "t_1",
    status: EndpointStatus = EndpointStatus.ACTIVE,
    config_version: int = 1,
) -> EndpointConfig:
    return EndpointConfig(
        endpoint_id=endpoint_id, tenant_id=tenant_id, config_version=config_version,
        url=f"https://example.com/{endpoint_id}", status=status, event_types=event_types,
        signing_keys=(), published_at_ms=NOW,
    )


# -- filters -------------------------------------------------------------------------------------

FILTER_TABLE = [
    # filters                          event type              accepted
    (["invoice.paid"], "invoice.paid", True),
    (["invoice.paid"], "invoice.paid.late", False),
    (["invoice.paid"], "invoice.pai", False),
    (["invoice.paid"], "Invoice.paid", False),  # case matters
    (["invoice.*"], "invoice.paid", True),
    (["invoice.*"], "invoice.line.added", True),
    (["invoice.*"], "invoice", False),  # the wildcard needs a segment after the dot
    (["invoice.*"], "invoice.", False),
    (["invoice.*"], "invoicex.paid", False),
    (["invoice.*"], "customer.invoice.paid", False),
    (["invoice.line.*"], "invoice.line.added", True),
    (["invoice.line.*"], "invoice.paid", False),
    (["*"], "invoice.paid", True),
    (["*"], "webhook.ping", True),
    (["customer.created", "invoice.*"], "invoice.paid", True),  # any entry may accept
    (["customer.created", "invoice.*"], "customer.deleted", False),
    ([], "invoice.paid", False),  # no subscriptions, no events
    (["invoice*"], "invoice.paid", False),  # only ".*" is a wildcard
]


@pytest.mark.parametrize(("filters", "event_type", "accepted"), FILTER_TABLE)
def test_filter_accepts(filters: list[str], event_type: str, accepted: bool) -> None:
    assert filter_accepts(filters, event_type) is accepted


def test_filter_accepts_any_iterable() -> None:
    assert filter_accepts(iter(("x", "invoice.*")), "invoice.paid")


# -- which endpoints an event goes to ------------------------------------------------------------

SELECT_TABLE = [
    # endpoints                                                          event        -> chosen ids
    ([endpoint("ep_1")], EVENT, ["ep_1"]),
    ([endpoint("ep_1", tenant_id="t_2")], EVENT, []),  # another tenant's endpoint
    ([endpoint("ep_1", status=EndpointStatus.DISABLED)], EVENT, []),
    ([endpoint("ep_1", status=EndpointStatus.DELETED)], EVENT, []),
    ([endpoint("ep_1", ("customer.*",))], EVENT, []),  # filter does not match
    ([endpoint("ep_1", ("invoice.*",)), endpoint("ep_2", ("invoice.paid",)), endpoint("ep_3", ("x",))],
     EVENT, ["ep_1", "ep_2"]),
    # a test event targets one endpoint whatever its filter, and only it
    ([endpoint("ep_1", ("x",)), endpoint("ep_2")], replace(EVENT, target_endpoint_id="ep_1"), ["ep_1"]),
    ([endpoint("ep_1", ())], replace(EVENT, target_endpoint_id="ep_1"), ["ep_1"]),
    # ...but still only an active endpoint of the event's own tenant
    ([endpoint("ep_1", tenant_id="t_2")], replace(EVENT, target_endpoint_id="ep_1"), []),
    ([endpoint("ep_1", status=EndpointStatus.DISABLED)], replace(EVENT, target_endpoint_id="ep_1"), []),
    ([endpoint("ep_2")], replace(EVENT, target_endpoint_id="ep_1"), []),
    # an endpoint awaiting its ownership challenge gets the (targeted) challenge and nothing else
    ([endpoint("ep_1", status=EndpointStatus.PENDING_VERIFICATION)], replace(EVENT, target_endpoint_id="ep_1"),
     ["ep_1"]),
    ([endpoint("ep_1", status=EndpointStatus.PENDING_VERIFICATION), endpoint("ep_2")], EVENT, ["ep_2"]),
    ([], EVENT, []),
]


@pytest.mark.parametrize(("configs", "event", "chosen"), SELECT_TABLE)
def test_select_endpoints(configs: list[EndpointConfig], event: EventRecord, chosen: list[str]) -> None:
    assert [c.endpoint_id for c in select_endpoints(event, configs)] == chosen


def test_select_endpoints_order_is_stable_whatever_the_input_order() -> None:
    configs = [endpoint(f"ep_{i}") for i in (3, 1, 4, 10, 5, 9, 2)]
    expected = sorted(c.endpoint_id for c in configs)
    assert [c.endpoint_id for c in select_endpoints(EVENT, configs)] == expected
    assert [c.endpoint_id for c in select_endpoints(EVENT, reversed(configs))] == expected


# -- config versions and the config clock --------------------------------------------------------

NEWER_TABLE = [
    # current version   incoming version   -> replace
    (None, 1, True),
    (1, 2, True),
    (2, 2, True),  # a re-publish of the same version is harmless
    (3, 2, False),  # an old version replayed from the topic never wins
]


@pytest.mark.parametrize(("current", "incoming", "replace_it"), NEWER_TABLE)
def test_newer_keeps_the_highest_config_version(current: int | None, incoming: int, replace_it: bool) -> None:
    current_cfg = None if current is None else endpoint("ep_1", config_version=current)
    assert newer(current_cfg, endpoint("ep_1", config_version=incoming)) is replace_it


COVER_TABLE = [
    # horizon (value + lease)  arrival  skew -> covered
    (None, NOW, 0, False),  # no tick read yet: hold the event
    (NOW + 1, NOW, 0, True),
    (NOW, NOW, 0, False),  # a change acknowledged at the horizon itself may not have been read
    (NOW + 100, NOW, 100, False),  # the skew margin comes off the horizon
    (NOW + 101, NOW, 100, True),
]


@pytest.mark.parametrize(("horizon_ms", "arrived_ms", "skew_ms", "covered"), COVER_TABLE)
def test_tick_covers(horizon_ms: int | None, arrived_ms: int, skew_ms: int, covered: bool) -> None:
    assert tick_covers(horizon_ms, arrived_ms, skew_ms) is covered


def follower(started_at_ms: int = 0) -> ClockFollower:
    """Ticks every 250 ms (hint), 100 ms skew margin, stale after 5 s."""
    return ClockFollower(interval_hint_ms=250, skew_ms=100, stale_after_ms=5_000, started_at_ms=started_at_ms)


def test_a_fresh_leased_tick_covers_every_event_without_holding() -> None:
    f = follower()
    assert f.observe(value_ms=1_000, lease_ms=1_000, now_ms=1_020)  # a 20 ms trip
    assert f.horizon_ms == 2_000
    # Until the next tick is due (1_270) and well past it, every event arriving goes at once.
    for arrived in (0, 1_000, 1_270, 1_899):
        assert f.decide(arrived, now_ms=max(arrived, 1_020)).verdict == RELEASE
    assert f.decide(1_900, now_ms=1_900).verdict == HOLD  # only once ticks are ~900 ms late


def after_a_slow_tick() -> ClockFollower:
    """Tick value 1_000 (lease 1 s: horizon 2_000) read only at 1_800 -- an 800 ms trip."""
    f = follower()
    assert f.observe(1_000, 1_000, 1_800)
    return f


FOLLOW_TABLE = [
    # arrival  now     -> verdict   recheck at   why
    (1_899, 1_900, RELEASE, None),  # before the horizon less the skew
    (1_950, 1_960, HOLD, 2_051),  # the next tick (horizon ~2_250) is read at ~2_050
    (2_400, 2_410, HOLD, 2_551),  # three ticks ahead
    (1_950, 2_100, HOLD, 2_132),  # the predicted tick is late: recheck after period/8
    (1_950, 6_799, HOLD, 6_800),  # never past the moment the clock goes stale
    (1_950, 6_800, DEGRADED, None),  # no tick for stale_after_ms: release with what is known
]


@pytest.mark.parametrize(("arrived_ms", "now_ms", "verdict", "recheck_at_ms"), FOLLOW_TABLE)
def test_clock_follower_predicts_the_tick_that_covers_a_held_event(
    arrived_ms: int, now_ms: int, verdict: str, recheck_at_ms: int | None
) -> None:
    d = after_a_slow_tick().decide(arrived_ms, now_ms)
    assert (d.verdict, d.recheck_at_ms) == (verdict, recheck_at_ms)


def test_clock_follower_without_a_tick_holds_for_stale_after_from_its_start() -> None:
    f = follower(started_at_ms=1_000)
    f.restored(1_900)  # a checkpoint's horizon: it counts, but its tick was not read in this run
    assert f.decide(1_799, 1_001).verdict == RELEASE
    d = f.decide(1_800, 1_001)
    assert (d.verdict, d.recheck_at_ms) == (HOLD, 1_252)
    assert f.age_ms(3_000) == 2_000
    assert f.decide(1_800, 6_000).verdict == DEGRADED


def test_a_tick_without_a_lease_covers_only_what_arrived_before_its_value() -> None:
    f = follower()
    f.observe(1_000, 0, 1_010)  # a control plane from before leases: acknowledged at once
    assert f.decide(899, 1_010).verdict == RELEASE
    assert f.decide(900, 1_010).verdict == HOLD


def test_the_horizon_never_goes_back() -> None:
    f = follower()
    f.observe(1_000, 1_000, 1_010)
    f.observe(1_100, 0, 1_110)  # a newer tick with a shorter lease (another replica, another setting)
    assert (f.value_ms, f.horizon_ms) == (1_100, 2_000)  # the first tick's promise still holds
    f.restored(1_500)  # an older checkpoint's horizon is no news either
    assert f.horizon_ms == 2_000


def test_clock_follower_ignores_ticks_that_do_not_move_it_and_learns_the_tick_spacing() -> None:
    f = ClockFollower(interval_hint_ms=100, skew_ms=0, stale_after_ms=5_000, started_at_ms=0)
    assert f.observe(1_000, 1_000, 1_010)
    assert not f.observe(1_000, 1_000, 2_000)  # a re-read tick is not a sign of life
    assert f.age_ms(2_000) == 990
    for k in range(1, 40):  # the control plane ticks every 50 ms, not the 100 ms hint
        assert f.observe(1_000 + 50 * k, 1_000, 1_010 + 50 * k)
    assert 49 <= f.period_ms <= 51
    # One long step (a tick held back by an unpublished config) barely moves the estimate.
    assert f.value_ms is not None and f.read_at_ms is not None
    f.observe(f.value_ms + 5_000, 1_000, f.read_at_ms + 5_000)
    assert f.period_ms < 0.8 * 51 + 0.2 * 400 + 1


# -- new deliveries ------------------------------------------------------------------------------


def test_deliveries_for() -> None:
    endpoints = [endpoint("ep_1", config_version=4), endpoint("ep_2", config_version=9)]
    assert deliveries_for(EVENT, endpoints, created_at_ms=NOW, deadline_ms=DAY_MS) == [
        NewDelivery(delivery_id=delivery_id_for("evt_1", "ep_1"), event=EVENT, endpoint_id="ep_1",
                    tenant_id="t_1", endpoint_config_version=4, created_at_ms=NOW, expires_at_ms=NOW + DAY_MS),
        NewDelivery(delivery_id=delivery_id_for("evt_1", "ep_2"), event=EVENT, endpoint_id="ep_2",
                    tenant_id="t_1", endpoint_config_version=9, created_at_ms=NOW, expires_at_ms=NOW + DAY_MS),
    ]


def test_reprocessing_an_event_yields_identical_deliveries() -> None:
    # Same event, same arrival time, configs read back in another order (e.g. after a restore).
    configs = [endpoint("ep_2"), endpoint("ep_1"), endpoint("ep_3", ("customer.*",))]
    first = deliveries_for(EVENT, select_endpoints(EVENT, configs), created_at_ms=NOW, deadline_ms=DAY_MS)
    again = deliveries_for(EVENT, select_endpoints(EVENT, configs[::-1]), created_at_ms=NOW, deadline_ms=DAY_MS)
    assert first == again
    assert [d.endpoint_id for d in first] == ["ep_1", "ep_2"]


def test_no_endpoints_no_deliveries() -> None:
    assert deliveries_for(EVENT, [], created_at_ms=NOW, deadline_ms=DAY_MS) == []


def test_the_dedupe_state_expires_on_rocksdb_too() -> None:
    """The production backend (RocksDB) reclaims expired event ids with its
    compaction filter; heap keeps its incremental cleanup; expired entries are never returned.
    (Before, only the heap strategy was set: RocksDB kept every id for good.) The conversion to
    Java runs inside the TaskManager on every job start (the integration suite runs RocksDB)."""
    from pyflink.datastream.state import StateTtlConfig

    from operators.fanout import dedupe_ttl

    cfg = dedupe_ttl(7 * 24 * 3600)
    assert cfg.get_ttl().to_milliseconds() == 7 * 24 * 3600 * 1000
    assert cfg.get_state_visibility() == StateTtlConfig.StateVisibility.NeverReturnExpired
    strategies = cfg.get_cleanup_strategies()
    rocksdb = strategies.get_rocksdb_compact_filter_cleanup_strategy()
    assert rocksdb is not None and rocksdb.get_query_time_after_num_entries() == 1000
    assert strategies.get_incremental_cleanup_strategy().get_cleanup_size() == 10



@pytest.mark.parametrize(("f", "allowed", "covered"), [
    ("invoice.paid", ["invoice.paid"], True),
    ("invoice.paid", ["invoice.*"], True),
    ("invoice.paid", ["*"], True),
    ("invoice.*", ["invoice.*"], True),
    ("invoice.paid.*", ["invoice.*"], True),
    ("invoice.*", ["invoice.paid"], False),       # a prefix needs an equal or wider prefix
    ("invoice.*", ["invoice.paid.*"], False),
    ("*", ["invoice.*", "order.*"], False),        # `*` only where `*` is allowed
    ("*", ["*"], True),
    ("order.shipped", ["invoice.*"], False),
    ("invoices.paid", ["invoice.*"], False),       # a prefix is a dotted segment, not a string prefix
])
def test_filter_covered(f: str, allowed: list[str], covered: bool) -> None:
    from core.fanout import filter_covered

    assert filter_covered(f, allowed) is covered


def test_pinned_endpoints_of_other_majors_are_left_out_with_their_reason_and_named_in_the_snapshot() -> None:
    v1 = replace(EVENT, schema_version="1.2")
    pins = {"ep_v2": (2,), "ep_v1": (1,)}
    chosen, skipped = leave_out_pinned(v1, [endpoint("ep_any"), endpoint("ep_v2", config_version=4),
                                            endpoint("ep_v1")], lambda e: pins.get(e, ()))
    assert [c.endpoint_id for c in chosen] == ["ep_any", "ep_v1"]
    assert skipped == [SkippedDelivery(delivery_id_for("evt_1", "ep_v2"), "ep_v2", 4, "invoice.paid",
                                       "schema major 1 not accepted (pinned: 2)")]
    snap = snapshot_for(v1, chosen, NOW, skipped=skipped)
    assert snap.skipped == tuple(skipped)
    assert set(snap.delivery_ids().values()) == {"ep_any", "ep_v1"}  # what reconciliation expects
