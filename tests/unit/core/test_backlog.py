"""The endpoint driver's backlog on its own: a fake memory, an in-memory store, fixed times.

What it promises: fresh deliveries beyond the memory window queue in arrival order and come back
a page at a time with the intent they were queued with; retries leave memory latest-due first,
only when memory is full and earlier-due work waits, and come back once their bucket starts; an
entry a restore finds in either queue, or a copy superseded by one loaded meanwhile, comes back
to be CHECKed, never sendable on a stale intent.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from core import breaker as brk
from core import dispatch as dsp
from core.dispatch import Intent, Pending, Stage, replace
from core.endpoint_driver import Decision, DriverPolicy
from core.endpoint_driver.backlog import Backlog
from core.endpoint_store import InMemoryEndpointStore
from core.fanout import NewDelivery
from core.records import EventRecord
from core.retry import RetrySchedule

T0 = 1_700_000_000_000
DAY_MS = 24 * 3600 * 1000
POLICY = DriverPolicy(
    schedule=RetrySchedule(base_s=5.0, cap_s=3600.0, max_attempts=20, deadline_s=86400.0, max_retry_after_s=3600.0),
    breaker=brk.BreakerConfig(failure_threshold=5, fast_failure_threshold=2, open_s=30.0, max_open_s=600.0),
    default_max_in_flight=8, memory_window=4, page_size=2, retry_bucket_ms=1_000)


@dataclass
class FakeMemory:
    """The driver's side of the backlog (core.endpoint_driver.backlog.Memory), as plain dicts."""

    items: dict[str, Pending] = field(default_factory=dict)
    keyed: set[str] = field(default_factory=set)
    version: int = 0

    @property
    def fresh_count(self) -> int:
        return sum(1 for p in self.items.values() if p.attempt_count == 0)

    def in_key(self, delivery_id: str) -> bool:
        return delivery_id in self.keyed

    def note_version(self, config_version: int) -> None:
        self.version = max(self.version, config_version)

    def page_back(self, p: Pending) -> None:
        self.items[p.delivery_id] = p

    def release(self, delivery_id: str) -> None:
        del self.items[delivery_id]


def fresh(n: int, created: int = T0) -> Pending:
    """A fresh delivery with its first attempt reserved, ready to send."""
    e = EventRecord(event_id=f"evt_{n}", tenant_id="t_1", event_type="invoice.paid", schema_version="1",
                    object_id="", object_version=0, occurred_at_ms=created, payload=b"")
    nd = NewDelivery(delivery_id=f"dlv_{n}", event=e, endpoint_id="ep_1", tenant_id="t_1", endpoint_config_version=1,
                     created_at_ms=created, expires_at_ms=created + DAY_MS)
    p = Pending(delivery=nd, next_attempt_at_ms=created, intent=Intent(1, f"att_{n}"))
    return replace(p, stage=Stage.READY, issued=1)


def retry(n: int, due: int) -> Pending:
    """A retry waiting for its next attempt at ``due``, its attempt row reserved."""
    return replace(fresh(n), attempt_count=1, issued=2, intent=Intent(2, f"att_{n}_2"), next_attempt_at_ms=due)


def backlog(store: InMemoryEndpointStore | None = None,
            memory: FakeMemory | None = None) -> tuple[Backlog, FakeMemory, InMemoryEndpointStore, Counter[str]]:
    store = store if store is not None else InMemoryEndpointStore()
    memory = memory if memory is not None else FakeMemory()
    counts: Counter[str] = Counter()
    return Backlog("ep_1", POLICY, store, counts, memory), memory, store, counts


def hold(memory: FakeMemory, b: Backlog, *ps: Pending) -> None:
    for seq, p in enumerate(ps):
        memory.items[p.delivery_id] = p
        b.offer(p, seq)


def test_fresh_work_overflows_once_memory_holds_a_window_and_queues_behind_the_queue() -> None:
    b, memory, _, _ = backlog()
    hold(memory, b, *(fresh(i) for i in range(4)))
    assert not b.overflowing(fresh(4))  # the window holds four: a fifth may still come in
    hold(memory, b, fresh(4))
    assert b.overflowing(fresh(5))
    b.spill(fresh(5))
    del memory.items["dlv_4"]  # memory has room again, but the queue is not empty: arrival order
    assert b.overflowing(fresh(6))
    assert not b.overflowing(retry(7, T0))  # only fresh work overflows
    assert not b.overflowing(replace(fresh(8), manual=(dsp.ManualRequest("r", "ops", T0, "t_1"),)))


def test_a_page_comes_back_in_arrival_order_with_the_intent_it_was_queued_with() -> None:
    b, memory, store, counts = backlog()
    for i in range(3):
        b.spill(fresh(i))
    assert b.spilled == 3 and store.spill_head_tail == (0, 3) and counts["spilled"] == 3
    dec = Decision()
    b.page_in(T0, dec)
    assert list(memory.items) == ["dlv_0", "dlv_1"]  # a page: min(page_size, window // 2)
    assert all(p.stage is Stage.READY and p.intent is not None for p in memory.items.values())
    assert b.spilled == 1 and store.spill_head_tail == (2, 3) and counts["paged_in"] == 2
    assert dec.wake is not None and dec.wake.reason == "deadline" and dec.wake.at_ms == T0 + DAY_MS


def test_a_restore_finds_the_overflow_queue_and_its_entries_are_checked_first() -> None:
    before, _, store, _ = backlog()
    before.spill(fresh(0))
    b, memory, _, _ = backlog(store)  # a restore: the queue is keyed state, the intent is not ours
    assert b.spilled == 1
    b.page_in(T0, Decision())
    assert memory.items["dlv_0"].stage is Stage.ADOPTED


def test_a_superseded_copy_comes_back_to_be_checked_and_the_loaded_copy_wins() -> None:
    b, memory, _, _ = backlog()
    b.spill(fresh(0))
    b.spill(fresh(1))
    b.supersede("dlv_0")  # a replay loaded it from history meanwhile
    assert not b.overflowing(fresh(0))  # that copy stays in memory
    memory.items["dlv_1"] = loaded = replace(fresh(1), stage=Stage.CHECK)
    b.page_in(T0, Decision())
    assert memory.items["dlv_0"].stage is Stage.ADOPTED
    assert memory.items["dlv_1"] is loaded


def test_memory_full_moves_the_latest_retries_to_the_retry_queue_for_fresh_work() -> None:
    b, memory, store, counts = backlog()
    hold(memory, b, *(retry(i, T0 + (i + 1) * 60_000) for i in range(8)))  # twice the window: full
    b.spill(fresh(100))
    b.spill(fresh(101))
    b.page_in(T0, Decision())
    # Room for a page (two) made from the two retries due latest; the fresh page came in.
    assert b.queued_retries == 2 and counts["retries_queued"] == 2
    assert {"dlv_6", "dlv_7"}.isdisjoint(memory.items) and {"dlv_100", "dlv_101"} <= set(memory.items)
    assert sorted(store.retry_bucket_index) == [T0 + 7 * 60_000, T0 + 8 * 60_000]


def test_retries_due_soon_stay_in_memory_and_key_members_never_leave() -> None:
    b, memory, _, _ = backlog()
    hold(memory, b, *(retry(i, T0 + 500) for i in range(7)))  # due within the bucket
    late = retry(7, T0 + 3_600_000)
    memory.keyed.add(late.delivery_id)  # a member of an ordering key: its order lives in memory
    hold(memory, b, late)
    b.spill(fresh(100))
    b.page_in(T0, Decision())
    assert b.queued_retries == 0 and len(memory.items) == 8 and b.spilled == 1


def test_a_queued_retry_comes_back_when_its_bucket_starts_sendable_with_its_intent() -> None:
    b, memory, _, counts = backlog()
    due = T0 + 10_500
    hold(memory, b, *(retry(i, T0 + 5_000) for i in range(7)), retry(7, due))
    b.spill(fresh(100))
    b.page_in(T0, Decision())
    assert "dlv_7" not in memory.items and b.queued_retries >= 1
    memory.items = {k: v for k, v in memory.items.items() if k == "dlv_100"}  # memory drained meanwhile
    dec = Decision()
    b.page_in_retries(T0 + 9_999, dec)
    assert "dlv_7" not in memory.items and dec.wake is not None and dec.wake.at_ms == T0 + 10_000
    b.page_in_retries(T0 + 10_000, Decision())  # its bucket starts; it is still sent at its own time
    assert memory.items["dlv_7"].stage is Stage.READY and memory.items["dlv_7"].intent == Intent(2, "att_7_2")
    assert memory.items["dlv_7"].next_attempt_at_ms == due and counts["retries_paged_in"] >= 1


def test_a_retry_restored_with_a_copy_queued_goes_back_without_its_intent() -> None:
    store = InMemoryEndpointStore()
    before, memory, _, _ = backlog(store)
    hold(memory, before, *(retry(i, T0 + (i + 1) * 60_000) for i in range(8)))
    before.spill(fresh(100))
    before.spill(fresh(101))
    before.page_in(T0, Decision())
    assert before.queued_retries == 2
    b, memory, _, _ = backlog(store, FakeMemory())  # a restore: the queue holds two of ours
    b.restored("dlv_5")  # restored in memory while a copy may wait in the retry queue
    hold(memory, b, *(retry(i, T0 + (i + 1) * 60_000) for i in range(6)),
         *(retry(200 + i, T0 + 1_000) for i in range(2)))
    b.spill(fresh(300))
    b.spill(fresh(301))
    b.page_in(T0, Decision())
    queued = [t for t in store.retry_queue.values() if t[0] in ("dlv_4", "dlv_5")]
    assert sorted((t[0], len(t) > 2) for t in queued) == [("dlv_4", True), ("dlv_5", False)]  # dlv_5: no intent
