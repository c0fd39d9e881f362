"""The endpoint driver's policy: the bounds and waits one operator gives all its drivers.

Plain data, set once by the adapter from :class:`core.settings.Settings`; the driver and its
backlog (:mod:`core.endpoint_driver.backlog`) read it and never change it.
"""

from __future__ import annotations

from dataclasses import dataclass

from core import breaker as brk
from core.retry import RetrySchedule


@dataclass(frozen=True)
class DriverPolicy:
    schedule: RetrySchedule
    breaker: brk.BreakerConfig
    default_max_in_flight: int
    # Deliveries created before this (Kafka time) may have been handled by an earlier
    # incarnation (the topic is re-read from the last checkpoint after a restore): they CHECK
    # their durable record before anything else. The operator sets it to its start time plus a
    # margin for clock skew between the brokers and the TaskManagers.
    check_created_before_ms: int = 0
    # Deliveries older than this are re-creations (topic re-read, re-snapshot): CHECK them too.
    fresh_window_ms: int = 10 * 60_000
    # Fan-out's dedupe window: an event whose own time is older than this may have been fanned
    # out before fan-out forgot it, and a record published again (a relay re-snapshot) carries a
    # fresh Kafka time -- so its delivery CHECKs too; final in history means it is not re-sent.
    dedupe_window_ms: int = 7 * 24 * 3_600_000
    # How long a manual replay may wait for its endpoint before it ends visibly as not sent.
    manual_wait_ms: int = 60_000
    # Expiries written per step; the rest follow at once in the next step.
    max_expiries_per_step: int = 500
    # After an internal error (a signing key that does not decrypt, a bug) the endpoint is held
    # for a doubling period; everything else keeps flowing.
    hold_base_ms: int = 1_000
    hold_max_ms: int = 300_000
    # Slot back-off while the pool or the tenant quota is full: doubling from here to ~1 s,
    # jittered, so a thousand endpoints that started waiting together do not wake together.
    slot_wait_base_ms: int = 10
    slot_wait_max_ms: int = 1_000
    # Storage work that did not fit the operator's write budget is retried this much later,
    # doubling while it keeps waiting (up to slot_wait_max_ms).
    write_budget_wait_ms: int = 10
    # A replay's load that failed is retried after 1 s, doubling up to this.
    load_retry_max_ms: int = 300_000
    # Fresh deliveries (never attempted) one endpoint keeps in memory; fresh waiting ones beyond it
    # go to the overflow queue in keyed state (core.endpoint_store) and come back a page at a
    # time, so a backlog of millions behind a failing endpoint costs memory for the window only.
    # Memory as a whole holds twice the window, and it holds the work due soonest: when it is full
    # and fresh work or a queued retry that is due waits for it, the retries in memory whose next
    # attempt is latest go to the retry queue in keyed state (ordered by due time) and come back
    # when they are due. So retries the receiver keeps refusing, however many, never keep a fresh
    # delivery out of memory while the receiver accepts others; they cost keyed state, not memory.
    memory_window: int = 20_000
    page_size: int = 1_000
    # The retry queue's buckets: retries due within the same bucket_ms share one (a FIFO), so the
    # queue's index in memory is one entry per bucket that holds retries -- bounded by the longest
    # back-off, not by how many retries wait. A bucket comes back when it starts; each retry in it
    # is still sent at its own time.
    retry_bucket_ms: int = 1_000
    # A delivery whose history write or read has kept failing this long, and is this far past its
    # deadline, is let go from memory (counted ``expired_unrecorded``): its row stays pending, past
    # due, and reconciliation names it orphaned and redrives it -- checked first, so it expires
    # there once Cassandra takes the write. Without a bound it was retried for ever, held for good.
    storage_give_up_ms: int = 3_600_000
    # A delivery whose own write was refused for its values (core.dispatch.WriteRejected) this
    # many times, each after some other write succeeded, ends failed with a record that carries
    # none of those values (dispatch.end_rejected): a few seconds of back-off, well within its deadline.
    rejected_write_tries: int = 3


@dataclass
class StorageHealth:
    """When a history write last succeeded, over every endpoint that shares it (the operator gives
    all its drivers one): what tells one delivery's poison write from a fault of every write."""
    last_ok_ms: int | None = None

