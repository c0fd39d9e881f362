"""core/write_shares.py: the operator's Cassandra I/O budget shared by tenant, then endpoint."""

from __future__ import annotations

from core.write_shares import WriteShares

TTL = 2_000


def shares_with(in_flight: dict[tuple[str, str], int], total: int = 8) -> WriteShares:
    s = WriteShares(total, TTL)
    for (endpoint, tenant), n in in_flight.items():
        for _ in range(n):
            s.started(endpoint, tenant)
    return s


def test_an_endpoint_alone_may_use_the_whole_budget() -> None:
    assert shares_with({}).budget("a", "t1", 0) == 8
    assert shares_with({("a", "t1"): 3}).budget("a", "t1", 0) == 5


def test_an_endpoint_holding_everything_leaves_half_once_another_tenant_waits() -> None:
    s = shares_with({("big", "t1"): 8})
    assert s.budget("small", "t2", 0) == 0  # nothing free
    s.used("small", "t2", given=0, used=0, now_ms=0)  # it may want some: it contends
    for _ in range(8):
        s.finished("big")
    assert s.budget("big", "t1", 5) == 4
    for _ in range(4):
        s.started("big", "t1")
    assert s.budget("small", "t2", 10) == 4


def test_a_tenants_share_is_split_between_its_endpoints() -> None:
    s = shares_with({("a1", "t1"): 1, ("a2", "t1"): 1, ("b", "t2"): 1})
    assert s.budget("a1", "t1", 0) == 1  # t1 has 4, a1's half is 2, one in flight
    assert s.budget("b", "t2", 0) == 3
    assert s.budget("a3", "t1", 0) == 1  # a third endpoint of t1: a third of t1's 4
    assert s.budget("c", "t3", 0) == 2  # a third tenant: a third of 8

def test_contending_without_io_ends_when_a_pass_leaves_budget_unused_or_after_the_ttl() -> None:
    s = shares_with({("big", "t1"): 8})
    s.used("small", "t2", given=0, used=0, now_ms=0)
    for _ in range(8):
        s.finished("big")
    assert s.budget("big", "t1", TTL - 1) == 4
    assert s.budget("big", "t1", TTL) == 8  # small did not ask again within the ttl
    s.used("small", "t2", given=0, used=0, now_ms=TTL)
    s.used("small", "t2", given=4, used=1, now_ms=TTL + 1)  # it had less to do than it could
    assert s.budget("big", "t1", TTL + 2) == 8


def test_shares_never_fall_below_one() -> None:
    s = shares_with({(f"e{n}", f"t{n}"): 0 for n in range(3)}, total=2)
    for n in range(3):
        s.used(f"e{n}", f"t{n}", given=0, used=0, now_ms=0)
    assert s.budget("e0", "t0", 1) == 1
