"""FairScheduler: starvation, weights, quotas, new-before-retry, pool bound."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.fairness import FairScheduler, TicketKind

NOW = 1_700_000_000_000


def file_tickets(
    s: FairScheduler, tenant: str, n: int, kind: TicketKind = "new", ready: int = NOW
) -> list[str]:
    """n endpoint keys of ``tenant``, each with one ticket of ``kind`` ready since ``ready``."""
    keys = [f"{tenant}/ep{i}/{kind}" for i in range(n)]
    for key in keys:
        s.request(key, tenant, kind, ready)
    return keys


def tenant_of(key: str) -> str:
    return key.split("/")[0]


def test_a_tenant_with_1000_tickets_cannot_starve_one_with_1() -> None:
    s = FairScheduler(pool_size=10, tenant_quota=100)
    file_tickets(s, "big", 1000)
    file_tickets(s, "small", 1)
    assert "small/ep0/new" in s.grant(NOW)


def test_even_with_one_free_slot_the_small_tenant_gets_the_second() -> None:
    s = FairScheduler(pool_size=1, tenant_quota=100)
    file_tickets(s, "big", 1000)
    file_tickets(s, "small", 1)
    order: list[str] = []
    for _ in range(3):
        (key,) = s.grant(NOW)
        order.append(tenant_of(key))
        s.release(tenant_of(key))
    assert order == ["big", "small", "big"]


@pytest.mark.parametrize(
    ("weights", "pool"),
    [
        ({"a": 3.0, "b": 1.0}, 4),
        ({"a": 3.0, "b": 1.0}, 1),  # a turn cut short by a full pool resumes next call
        ({"a": 1.0, "b": 1.0, "c": 2.0}, 7),
        ({"a": 0.5, "b": 1.5}, 3),  # fractional weights keep their ratio
        ({"a": 1e-6, "b": 3e-6}, 2),  # tiny weights neither stall nor spin
    ],
)
def test_weights_are_respected_over_many_grants(weights: dict[str, float], pool: int) -> None:
    s = FairScheduler(pool_size=pool, tenant_quota=1_000, weights=weights)
    for tenant in weights:
        file_tickets(s, tenant, 50)
    served: Counter[str] = Counter()
    for _ in range(2_000):
        for key in s.grant(NOW):
            tenant = tenant_of(key)
            served[tenant] += 1
            assert s.take_grant(key) == 1
            s.release(tenant)
            s.request(key, tenant, "new", NOW)  # still has work: asks again
    total = sum(served.values())
    for tenant, weight in weights.items():
        assert served[tenant] / total == pytest.approx(weight / sum(weights.values()), rel=0.03)


def test_tenant_quota_is_never_exceeded() -> None:
    s = FairScheduler(pool_size=10, tenant_quota=3)
    file_tickets(s, "a", 100)
    file_tickets(s, "b", 1)
    granted = s.grant(NOW)
    assert Counter(map(tenant_of, granted)) == {"a": 3, "b": 1}
    assert s.grant(NOW) == []  # a is at quota: the free pool slots wait
    s.release("a")
    assert list(map(tenant_of, s.grant(NOW))) == ["a"]
    assert s.in_flight("a") == 3


def test_new_work_goes_before_retries() -> None:
    s = FairScheduler(pool_size=2, tenant_quota=10)
    file_tickets(s, "a", 3, kind="retry", ready=NOW - 60_000)  # waiting longer, still second
    file_tickets(s, "b", 2, kind="new")
    assert s.grant(NOW) == ["b/ep0/new", "b/ep1/new"]
    s.release("b", 2)
    assert s.grant(NOW) == ["a/ep0/retry", "a/ep1/retry"]


def test_retries_borrow_capacity_no_new_work_can_use() -> None:
    s = FairScheduler(pool_size=4, tenant_quota=10, retry_headroom=0.0)
    file_tickets(s, "a", 1, kind="new")
    file_tickets(s, "b", 5, kind="retry")
    assert Counter(s.grant(NOW)) == Counter(["a/ep0/new", "b/ep0/retry", "b/ep1/retry", "b/ep2/retry"])


def test_retries_leave_headroom_for_new_work_that_arrives_later() -> None:
    s = FairScheduler(pool_size=20, tenant_quota=100, retry_headroom=0.1)
    file_tickets(s, "a", 30, kind="retry")
    assert len(s.grant(NOW)) == 18  # 10% of the pool stays free for new work
    file_tickets(s, "b", 5, kind="new")
    assert len(s.grant(NOW)) == 2  # new work may use the headroom
    assert s.in_flight_total() == 20


def test_a_tenants_retries_leave_headroom_in_its_quota() -> None:
    s = FairScheduler(pool_size=100, tenant_quota=10, retry_headroom=0.1)
    file_tickets(s, "a", 20, kind="retry")
    assert len(s.grant(NOW)) == 9
    file_tickets(s, "a", 5, kind="new")
    assert s.grant(NOW) == ["a/ep0/new"]


def test_urgent_new_work_jumps_the_weighted_order() -> None:
    # With weights 100:1 and one free slot, DRR alone would give "heavy" 100 turns first.
    s = FairScheduler(pool_size=1, tenant_quota=10, weights={"heavy": 100.0}, new_work_slo_ms=10_000)
    file_tickets(s, "heavy", 200)
    file_tickets(s, "light", 1, ready=NOW - 5_000)  # waited half the objective
    assert s.grant(NOW) == ["light/ep0/new"]


def test_an_old_backlog_gets_one_urgent_slot_per_call_not_the_pool() -> None:
    s = FairScheduler(pool_size=10, tenant_quota=100)
    file_tickets(s, "big", 1000, ready=NOW - 60_000)
    file_tickets(s, "small", 1)
    granted = s.grant(NOW)
    assert "small/ep0/new" in granted and len(granted) == 10


def test_request_is_idempotent_and_keeps_the_oldest_wait() -> None:
    s = FairScheduler(pool_size=1, tenant_quota=10, weights={"heavy": 100.0})
    file_tickets(s, "heavy", 5)
    s.request("light/x", "light", "new", NOW)
    s.request("light/x", "light", "new", NOW - 6_000)  # an older item: the ticket becomes urgent
    s.request("light/x", "light", "new", NOW)  # a newer one changes nothing
    assert s.waiting_count() == 6
    assert s.grant(NOW) == ["light/x"]
    assert s.waiting_count() == 5


def test_take_grant_counts_slots_per_key_and_consumes_them() -> None:
    s = FairScheduler(pool_size=4, tenant_quota=10, retry_headroom=0.0)
    s.request("ep", "a", "new", NOW)
    s.request("ep", "a", "retry", NOW)
    assert not s.has_grant("ep")
    assert s.grant(NOW) == ["ep", "ep"]
    assert s.has_grant("ep")
    assert s.take_grant("ep") == 2
    assert not s.has_grant("ep")
    assert s.take_grant("ep") == 0
    assert s.in_flight("a") == 2  # taken slots stay in flight until released


def test_cancel_drops_tickets_and_returns_untaken_slots() -> None:
    s = FairScheduler(pool_size=1, tenant_quota=10)
    s.request("ep1", "a", "new", NOW)
    s.request("ep2", "a", "new", NOW)
    s.request("ep2", "a", "retry", NOW)
    assert s.grant(NOW) == ["ep1"]
    s.cancel("ep1")  # breaker opened before the key took its slot
    s.cancel("ep2")
    assert (s.in_flight("a"), s.waiting_count(), s.grant(NOW)) == (0, 0, [])


def test_release_more_than_held_is_a_bug() -> None:
    s = FairScheduler(pool_size=1, tenant_quota=1)
    with pytest.raises(ValueError):
        s.release("a")


def test_a_ticket_cannot_change_tenant() -> None:
    s = FairScheduler(pool_size=1, tenant_quota=1)
    s.request("ep", "a", "new", NOW)
    with pytest.raises(ValueError):
        s.request("ep", "b", "new", NOW)


@dataclass(frozen=True)
class Request:
    tenant: str
    n: int
    kind: TicketKind
    age_ms: int


@dataclass(frozen=True)
class Grant:
    pass


@dataclass(frozen=True)
class Take:
    tenant: str
    n: int


@dataclass(frozen=True)
class Release:
    tenant: str
    n: int


@dataclass(frozen=True)
class Cancel:
    tenant: str
    n: int


TENANTS = ["a", "b", "c"]
tenants = st.sampled_from(TENANTS)
operations = st.lists(
    st.one_of(
        st.builds(Request, tenants, st.integers(0, 30), st.sampled_from(["new", "retry"]),
                  st.integers(0, 20_000)),
        st.builds(Grant),
        st.builds(Take, tenants, st.integers(0, 30)),
        st.builds(Release, tenants, st.integers(1, 3)),
        st.builds(Cancel, tenants, st.integers(0, 30)),
    ),
    max_size=120,
)


@settings(max_examples=300)
@given(
    ops=operations,
    pool=st.integers(1, 12),
    quota=st.integers(1, 6),
    headroom=st.sampled_from([0.0, 0.1, 0.5]),
)
def test_pool_and_quotas_are_never_exceeded(
    ops: list[Request | Grant | Take | Release | Cancel], pool: int, quota: int, headroom: float
) -> None:
    s = FairScheduler(
        pool_size=pool, tenant_quota=quota, weights={"a": 2.0, "c": 0.5}, retry_headroom=headroom
    )
    owned: Counter[str] = Counter()  # slots keys have taken and not yet released
    for op in ops:
        if isinstance(op, Request):
            s.request(f"{op.tenant}/{op.n}", op.tenant, op.kind, NOW - op.age_ms)
        elif isinstance(op, Grant):
            waiting_before = s.waiting_count()
            granted = s.grant(NOW)
            assert len(granted) == waiting_before - s.waiting_count()
            assert s.grant(NOW) == []  # one call hands out everything the limits allow
        elif isinstance(op, Take):
            owned[op.tenant] += s.take_grant(f"{op.tenant}/{op.n}")
        elif isinstance(op, Release):
            n = min(owned[op.tenant], op.n)
            if n:
                s.release(op.tenant, n)
                owned[op.tenant] -= n
        else:
            s.cancel(f"{op.tenant}/{op.n}")
        assert s.in_flight_total() <= pool
        assert all(s.in_flight(t) <= quota for t in TENANTS)
        assert s.in_flight_total() == sum(s.in_flight(t) for t in TENANTS)
        assert all(s.in_flight(t) >= owned[t] for t in TENANTS)


def test_uncontended_fast_path_takes_many_slots_but_never_past_quota_or_pool():
    s = FairScheduler(pool_size=10, tenant_quota=6)
    assert s.acquire_uncontended("a", 8) == 6  # the tenant quota caps it
    assert s.acquire_uncontended("b", 8) == 4  # then the pool does
    assert s.in_flight_total() == 10
    assert s.acquire_uncontended("c", 1) == 0


def test_uncontended_fast_path_yields_to_waiting_tickets():
    s = FairScheduler(pool_size=10, tenant_quota=10)
    s.request("k1", "a", "new", 0)
    assert s.acquire_uncontended("b", 3) == 0  # someone is waiting: take a turn instead


def test_a_grant_not_taken_within_the_pickup_interval_lapses_and_its_slot_goes_to_a_caller():
    # a grantee that is not awake must not keep the slot idle
    s = FairScheduler(pool_size=1, tenant_quota=1, grant_pickup_ms=10)
    s.request("a/ep0", "a", "new", NOW)
    assert s.grant(NOW) == ["a/ep0"]
    s.request("b/ep0", "b", "new", NOW + 5)
    assert s.grant(NOW + 10) == []  # within the pickup interval the grant is a's
    assert s.grant(NOW + 11) == ["b/ep0"]  # lapsed: a's next step files its ticket again
    assert not s.has_grant("a/ep0") and s.take_grant("b/ep0") == 1
    assert s.in_flight_total() == 1


def test_uncontended_retries_leave_the_headroom_for_new_work():
    # retries taken without contention leave the share kept for new work
    s = FairScheduler(pool_size=10, tenant_quota=10, retry_headroom=0.1)
    assert s.acquire_uncontended("a", 10, "retry") == 9
    assert s.acquire_uncontended("b", 1, "new") == 1
