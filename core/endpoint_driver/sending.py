"""The endpoint driver's send path, in named steps.

One pass of :meth:`SendPath._send`: how many manual requests and automatic deliveries the
breaker would let go (:meth:`_manual_allowance`, :meth:`_auto_allowance`), how many tokens the
endpoint's rate limit has (:meth:`_tokens`), the tenant slots for that many (:meth:`_slots`),
then the sends themselves, manual requests first (:meth:`_send_manual`, :meth:`_send_auto`), and
what the pass leaves: unused slots given back, breaker and bucket stored, the next wake
(:meth:`_settle`). Slots are conserved: asked for only when breaker, bucket and the endpoint's own
in-flight cap would let a request go, and every grant that cannot be used is given back in the
same step.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from typing import TYPE_CHECKING, Literal

from core import breaker as brk
from core import dispatch as d
from core import ratelimit
from core.dispatch import Pending, Stage, replace
from core.endpoint_driver.decision import Decision, Send
from core.endpoint_driver.policy import DriverPolicy
from core.endpoint_store import EndpointStore
from core.fairness import FairScheduler
from core.ordering import KeyQueues
from core.records import EndpointConfig

DueHeap = list[tuple[int, int, int, str]]


class SendPath:
    """The send path of :class:`core.endpoint_driver.EndpointDriver` (its only subclass), which
    owns the state named here."""

    endpoint_id: str
    policy: DriverPolicy
    rng: random.Random
    store: EndpointStore
    scheduler: FairScheduler
    counts: Counter[str]
    config: EndpointConfig | None
    breaker: brk.BreakerState
    bucket: ratelimit.TokenBucket | None
    in_flight: int
    _tenant: str
    _slot_waits: int
    _due: DueHeap
    _readying: set[str]
    _manual: set[str]
    _front_since: dict[str, tuple[int, int]]
    _order: KeyQueues

    if TYPE_CHECKING:  # the driver's index over its memory
        def _top(self, heap: DueHeap) -> Pending | None: ...
        def _put(self, p: Pending) -> None: ...
        def _oldest_manual(self, n: int) -> list[Pending]: ...

    def _send(self, now_ms: int, blocked: str | None, dec: Decision) -> None:
        oldest_manual = self._oldest_manual(1)
        manual_ok = self._manual_allowance(now_ms, blocked, oldest_manual, dec)
        auto_top = self._top(self._due)
        auto_due = auto_top is not None and auto_top.next_attempt_at_ms <= now_ms
        if auto_top is not None and not auto_due and blocked is None:
            dec.wake_at(auto_top.next_attempt_at_ms, "next retry due")
        if (not manual_ok and not auto_due) or blocked is not None:
            self.scheduler.cancel(self.endpoint_id)
            return
        assert self.config is not None
        cap = self.config.max_in_flight or self.policy.default_max_in_flight
        if manual_ok:
            self._front_of_manual_queue(cap, now_ms)
        free = cap - self.in_flight
        if free <= 0:
            # Its own cap is full: a finished request drives the endpoint again.
            self.scheduler.cancel(self.endpoint_id)
            return
        auto_ok = self._auto_allowance(auto_due, free, now_ms, dec)
        tokens = self._tokens(free, now_ms, dec)
        want = min(free, tokens, manual_ok + auto_ok)
        if want <= 0:
            self.scheduler.cancel(self.endpoint_id)
            return
        kind: Literal["new", "retry"] = (
            "new" if manual_ok or (auto_top is not None and auto_top.attempt_count == 0) else "retry")
        since = (oldest_manual[0].manual[0].requested_at_ms if manual_ok
                 else auto_top.next_attempt_at_ms if auto_top else now_ms)
        slots = self._slots(want, kind, since, now_ms, dec)
        if slots == 0:
            return
        breaker, bucket, sent = self._send_manual(min(slots, manual_ok), now_ms, dec)
        breaker, bucket, sent, checks = self._send_auto(auto_ok, slots, sent, breaker, bucket, cap, now_ms, dec)
        self._settle(slots, sent, checks, breaker, bucket, manual_ok, now_ms, dec)

    def _manual_allowance(self, now_ms: int, blocked: str | None, oldest: list[Pending], dec: Decision) -> int:
        """How many waiting manual requests the breaker would let go now."""
        manual_ok = len(self._manual)
        if manual_ok and blocked is None and not brk.allow(self.breaker, now_ms)[0]:
            # A replay checks the endpoint's state first: an open breaker holds manual
            # requests too -- a person's replay would otherwise hammer a receiver known to be
            # down. They wait for the probe, within their own wait (_close_stale_manual), and
            # one may be the probe itself once the breaker half-opens.
            dec.wake_at(probe_at(self.breaker), "breaker probe")
            dec.wake_at(oldest[0].manual[0].requested_at_ms + self.policy.manual_wait_ms, "manual request wait")
            return 0
        if self.breaker.state is not brk.CircuitState.CLOSED:
            return min(manual_ok, 1)  # half-open: one request is the probe
        return manual_ok

    def _front_of_manual_queue(self, cap: int, now_ms: int) -> None:
        """The requests at the front of the manual queue: their wait starts now."""
        for m in self._oldest_manual(cap):
            at = m.manual[0].requested_at_ms
            if self._front_since.get(m.delivery_id, (None,))[0] != at:
                self._front_since[m.delivery_id] = (at, now_ms)

    def _auto_allowance(self, auto_due: bool, free: int, now_ms: int, dec: Decision) -> int:
        """How many automatic deliveries the breaker would let go, before asking for any slot."""
        if not auto_due:
            return 0
        allowed, _ = brk.allow(self.breaker, now_ms)
        if not allowed:
            dec.wake_at(probe_at(self.breaker), "breaker probe")
            return 0
        return 1 if self.breaker.state is not brk.CircuitState.CLOSED else free

    def _tokens(self, free: int, now_ms: int, dec: Decision) -> int:
        """How many requests the endpoint's rate limit lets go now (``free`` without one)."""
        assert self.config is not None
        if self.config.rate_limit_per_s:
            self.bucket = (ratelimit.new_bucket(self.config.rate_limit_per_s, now_ms) if self.bucket is None
                           else ratelimit.reconfigure(self.bucket, self.config.rate_limit_per_s)
                           if self.bucket.rate_per_s != self.config.rate_limit_per_s else self.bucket)
            tokens, wait_ms = ratelimit.available(self.bucket, now_ms)
            if tokens == 0:
                self.counts["throttled_rate_limit"] += 1
                dec.wake_at(now_ms + wait_ms, "rate limit refill")
            return tokens
        if self.bucket is not None:  # the limit was removed: stop taking from the old bucket
            self.bucket = None
            self.store.put_bucket(None)
        return free

    def _slots(self, want: int, kind: Literal["new", "retry"], since_ms: int, now_ms: int, dec: Decision) -> int:
        """Tenant slots for up to ``want`` requests; none: when to ask again."""
        slots = self._take_slots(want, kind, since_ms, now_ms)
        if slots == 0:
            self.counts["throttled_slots"] += 1
            if self.scheduler.next_in_line(self.endpoint_id):
                # A grant may come to it while it sleeps, and nothing but its own timer can wake
                # it (core.fairness): ask again before such a grant would lapse, not after a
                # back-off of up to a second with the slot idle.
                dec.wake_at(now_ms + self.scheduler.grant_pickup_ms, "next in line for a tenant or pool slot")
            else:
                dec.wake_at(now_ms + self._slot_wait_ms(), "waiting for a tenant or pool slot")
            return 0
        self._slot_waits = 0
        return slots

    def _send_manual(self, n: int, now_ms: int,
                     dec: Decision) -> tuple[brk.BreakerState, ratelimit.TokenBucket | None, int]:
        """Send the ``n`` oldest manual requests the breaker lets go; (breaker, bucket, sent) after."""
        sent = 0
        breaker, bucket = self.breaker, self.bucket
        for m in self._oldest_manual(n):
            allowed, after = brk.allow(breaker, now_ms)
            if not allowed:
                break
            breaker = after
            if bucket is not None:
                _, bucket, _ = ratelimit.try_take(bucket, now_ms)
            self._start_send(m, dec)
            sent += 1
        return breaker, bucket, sent

    def _send_auto(self, auto_ok: int, slots: int, sent: int, breaker: brk.BreakerState,
                   bucket: ratelimit.TokenBucket | None, cap: int, now_ms: int,
                   dec: Decision) -> tuple[brk.BreakerState, ratelimit.TokenBucket | None, int, int]:
        """Send the automatic deliveries due, in due order, within the slots left; read restored
        ones ahead of their send. (breaker, bucket, sent, reads started) after."""
        checks = 0
        # Restored deliveries are read ahead of the sends while the breaker is closed (up to four
        # times the endpoint's cap in flight, not one read per slot granted): one read per slot
        # drained a restored backlog at a fraction of the endpoint's capacity (each send waited
        # for its read and reserve). A probing breaker reads only what it may send.
        closed = self.breaker.state is brk.CircuitState.CLOSED
        read_ahead = max(slots, min(self.policy.page_size, 4 * cap)) if closed else slots
        while auto_ok > 0:
            top = self._top(self._due)
            if top is None or top.next_attempt_at_ms > now_ms:
                break
            p = top
            if p.stage is Stage.ADOPTED:
                if len(self._readying) >= read_ahead or (not closed and sent + checks >= slots):
                    break  # enough being read ahead of the sends: no more reads yet
                # Restored and now due: read its durable record first (it may be final already).
                heapq.heappop(self._due)
                self._readying.add(p.delivery_id)
                self._put(replace(p, stage=Stage.CHECK))
                checks += 1
                continue
            if sent >= slots:
                break
            allowed, after = brk.allow(breaker, now_ms)
            if not allowed:
                break
            if bucket is not None:
                ok, bucket, _ = ratelimit.try_take(bucket, now_ms)
                if not ok:
                    break
            breaker = after
            heapq.heappop(self._due)
            self._start_send(p, dec)
            sent += 1
        return breaker, bucket, sent, checks

    def _settle(self, slots: int, sent: int, checks: int, breaker: brk.BreakerState,
                bucket: ratelimit.TokenBucket | None, manual_ok: int, now_ms: int, dec: Decision) -> None:
        """Give back the slots not used, store breaker and bucket, and say when to look again."""
        if slots > sent:
            self.scheduler.release(self._tenant, slots - sent)
        if checks:
            dec.wake_at(now_ms, "restored deliveries due: read their records")
        if breaker != self.breaker:
            self.breaker = breaker
            self.store.put_breaker(breaker)
        if bucket is not self.bucket or (bucket is not None and sent):
            self.bucket = bucket
            self.store.put_bucket(bucket)
        t = self._top(self._due)
        more_auto = t is not None and t.next_attempt_at_ms <= now_ms
        if more_auto and t is not None and t.stage is Stage.ADOPTED and self._readying:
            more_auto = False  # restored work waits for the reads in progress: they drive it
        elif more_auto and not brk.allow(self.breaker, now_ms)[0]:
            more_auto = False  # what is left waits for the breaker, not for a slot
            dec.wake_at(probe_at(self.breaker), "breaker probe")
        if (self._manual and manual_ok) or more_auto:
            # More is due than this step could send: ask again after a short, growing wait.
            dec.wake_at(now_ms + self._slot_wait_ms(), "more due than slots granted")
        else:
            if t is not None and t.next_attempt_at_ms > now_ms:  # the next retry is the reason to wake
                dec.wake_at(t.next_attempt_at_ms, "next retry due")
            self.scheduler.cancel(self.endpoint_id)

    def _take_slots(self, want: int, kind: Literal["new", "retry"], since_ms: int, now_ms: int) -> int:
        got = self.scheduler.acquire_uncontended(self._tenant, want, kind)
        if got:
            return got
        self.scheduler.request(self.endpoint_id, self._tenant, kind, since_ms)
        self.scheduler.grant(now_ms)
        got = self.scheduler.take_grant(self.endpoint_id)
        if got > want:  # granted on two tickets (new and retry) at once
            self.scheduler.release(self._tenant, got - want)
            got = want
        return got

    def _slot_wait_ms(self) -> int:
        self._slot_waits += 1
        wait = min(self.policy.slot_wait_max_ms, self.policy.slot_wait_base_ms * 2 ** min(self._slot_waits - 1, 10))
        return max(1, int(wait * (0.5 + 0.5 * self.rng.random())))

    def _start_send(self, p: Pending, dec: Decision) -> None:
        assert self.config is not None
        if not p.manual:
            self._order.mark_started(p.delivery_id)  # head of its key until it is final
        p = d.start_sending(p)
        self.in_flight += 1
        self._put(p)
        self.counts["attempts"] += 1
        dec.actions.append(Send(p, self.config))


def probe_at(b: brk.BreakerState) -> int | None:
    """When an open breaker lets its probe go, or a half-open one's probe is overdue."""
    if b.state is brk.CircuitState.OPEN:
        return b.open_until_ms
    if b.state is brk.CircuitState.HALF_OPEN and b.probe_started_ms is not None:
        assert b.open_until_ms is not None and b.opened_at_ms is not None
        return b.probe_started_ms + (b.open_until_ms - b.opened_at_ms)
    return None
