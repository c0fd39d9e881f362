"""Fair hand-out of one dispatcher instance's in-flight slots across tenants.

The dispatcher is keyed by endpoint, but its HTTP pool (``pool_size`` requests in flight) is
shared by every endpoint the instance owns. Each endpoint key that has work and may send (its own
in-flight cap, token bucket and breaker allow it) files a *ticket*: "key K of tenant T has a new
(or retry) request waiting since t". ``grant(now_ms)`` turns free slots into grants; the key
picks its grants up with ``take_grant`` in its own keyed context, sends, and calls ``release``
when each request finishes. A ticket is a claim for one slot: a key with more work files again,
so a key with a thousand queued deliveries takes turns like everyone else.

Algorithm, per ``grant`` call, while slots are free:

1. **Urgent new work.** Each tenant whose oldest new ticket has waited half the latency
   objective (``new_work_slo_ms``) gets one slot, round robin. Weighted shares bound throughput,
   not latency: with weights 100:1 and a busy pool the light tenant could wait a hundred turns.
   One slot per tenant per call keeps this lane from becoming a way around fairness.
2. **New work, weighted deficit round robin (DRR).** Tenants with tickets sit in a ring. The
   tenant at the head earns credit in proportion to its weight (the lightest earns 1); each
   grant spends 1; when its credit is below 1 (or its quota is full) the turn passes. Over many
   grants each tenant's share follows its weight, and a tenant with 1000 tickets gets the same
   turns as one with a single ticket.
   Within a tenant the oldest ticket goes first. A tenant that runs out of tickets leaves the
   ring and drops its credit, as in classic DRR, so idleness cannot be banked.
3. **Retries, DRR again, on capacity no new work could use.** Retries only borrow what is left
   after steps 1-2, so they are never granted ahead of waiting new work (urgent or not). They may
   not take the last ``retry_headroom`` fraction of the pool or of a tenant's quota: a retry can
   hold its slot for a whole HTTP timeout, and new deliveries arriving meanwhile must find room
   to start within their objective.

Every grant honours the tenant quota (slots in flight per tenant, new and retry together) and
the pool size. The scheduler is in memory only: after a restore the dispatcher re-files tickets
for its pending work, and requests that were in flight are gone, so their slots are too.

**Grants must be picked up promptly.** A grant goes to a key that is not running: the adapter can
only run a key's pass inside that key's own timer or element, and no key can set a timer for
another. So a granted slot is idle until its grantee wakes. Two rules bound that:

* a grant not taken within ``grant_pickup_ms`` (the dispatcher's harvest interval) *lapses*: its
  slot goes back to the pool and the next caller's ``grant`` hands it on. The lapsed key lost its
  ticket with the grant; its next step files it again with the same ready-since time, so it keeps
  its seniority (and the urgent lane its latency bound);
* the keys a grant will go to next are awake: ``next_in_line`` tells a waiting key whether its
  ticket is its tenant's oldest and its tenant is among the next ``pool_size`` turns of the ring;
  such a key waits only ``grant_pickup_ms`` before asking again, every other waiting key backs
  off (up to ~1 s). Only those few keys poll quickly -- at most two per tenant near the head of
  the ring, however many endpoints wait -- and a grant to anyone else lapses.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Mapping
from typing import Literal

TicketKind = Literal["new", "retry"]

# A new ticket counts as urgent once it has waited this fraction of the latency objective:
# half leaves the other half for the request to actually start after it is granted.
_URGENT_FRACTION = 0.5


class _Waiting:
    """Waiting tickets of one kind: per-tenant oldest-first heaps plus the DRR ring and credit."""

    def __init__(self) -> None:
        self._seq = itertools.count()
        # key -> (tenant, ready_since_ms, seq); heap entries whose seq differs are stale.
        self._entries: dict[str, tuple[str, int, int]] = {}
        self._heaps: dict[str, list[tuple[int, int, str]]] = {}
        self._counts: dict[str, int] = {}
        self.ring: deque[str] = deque()
        self.credit: dict[str, float] = {}
        # Whether the head tenant already earned its credit for the current turn; a turn cut
        # short by a full pool resumes on the next grant call without earning twice.
        self.head_charged = False

    def __len__(self) -> int:
        return len(self._entries)

    def tenant_of(self, key: str) -> str | None:
        entry = self._entries.get(key)
        return entry[0] if entry is not None else None

    def has_tenant(self, tenant: str) -> bool:
        return tenant in self._counts

    def add(self, key: str, tenant: str, ready_since_ms: int) -> None:
        current = self._entries.get(key)
        if current is not None:
            if current[0] != tenant:
                raise ValueError(f"ticket {key!r} belongs to tenant {current[0]!r}, not {tenant!r}")
            if current[1] <= ready_since_ms:
                return  # idempotent: the older wait is the one that matters
        elif tenant not in self._counts:
            self._counts[tenant] = 0
            self._heaps[tenant] = []
            self.credit[tenant] = 0.0
            self.ring.append(tenant)
        if current is None:
            self._counts[tenant] += 1
        seq = next(self._seq)
        self._entries[key] = (tenant, ready_since_ms, seq)
        heapq.heappush(self._heaps[tenant], (ready_since_ms, seq, key))

    def remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        tenant = entry[0]
        self._counts[tenant] -= 1
        if self._counts[tenant] == 0:
            self._drop_tenant(tenant)

    def oldest(self, tenant: str) -> tuple[int, str] | None:
        """(ready_since_ms, key) of the tenant's oldest ticket, or None if it has none."""
        heap = self._heaps.get(tenant)
        if heap is None:
            return None
        while heap:
            ready_since_ms, seq, key = heap[0]
            entry = self._entries.get(key)
            if entry is not None and entry[2] == seq:
                return ready_since_ms, key
            heapq.heappop(heap)  # superseded by an older ready_since, granted or cancelled
        return None

    def rotate(self) -> None:
        self.ring.rotate(-1)
        self.head_charged = False

    def _drop_tenant(self, tenant: str) -> None:
        if self.ring and self.ring[0] == tenant:
            self.head_charged = False
        self.ring.remove(tenant)
        del self._counts[tenant], self._heaps[tenant], self.credit[tenant]


class FairScheduler:
    def __init__(
        self,
        pool_size: int,
        tenant_quota: int,
        weights: Mapping[str, float] | None = None,
        new_work_slo_ms: int = 10_000,
        retry_headroom: float = 0.1,
        grant_pickup_ms: int = 10,
    ) -> None:
        if pool_size < 1 or tenant_quota < 1:
            raise ValueError("pool_size and tenant_quota must be >= 1")
        if weights and min(weights.values()) <= 0:
            raise ValueError("tenant weights must be > 0")
        if not 0 <= retry_headroom < 1:
            raise ValueError("retry_headroom must be in [0, 1)")
        if grant_pickup_ms < 1:
            raise ValueError("grant_pickup_ms must be >= 1")
        self.grant_pickup_ms = grant_pickup_ms
        self._pool_size = pool_size
        self._quota = tenant_quota
        # DRR credit per turn, scaled so the lightest tenant (default weight 1) earns a whole
        # slot each turn: shares keep their ratios, and no turn passes without a grant, so a
        # tiny weight cannot make one grant call spin through thousands of empty turns.
        lightest = min([1.0, *(weights or {}).values()])
        self._quantum = {tenant: w / lightest for tenant, w in (weights or {}).items()}
        self._default_quantum = 1.0 / lightest
        self._urgent_after_ms = int(new_work_slo_ms * _URGENT_FRACTION)
        # Floors, so a small pool or quota keeps no headroom rather than refusing all retries.
        self._retry_pool_limit = pool_size - int(pool_size * retry_headroom)
        self._retry_quota = tenant_quota - int(tenant_quota * retry_headroom)
        self._waiting: dict[TicketKind, _Waiting] = {"new": _Waiting(), "retry": _Waiting()}
        self._in_flight: dict[str, int] = {}
        self._in_flight_total = 0
        # Granted but not yet taken: key -> (tenant, slots), and when the first of them was given.
        self._grants: dict[str, tuple[str, int]] = {}
        self._granted_at: dict[str, int] = {}

    # -- the dispatcher's side --------------------------------------------------------------

    def request(self, ticket_key: str, tenant: str, kind: TicketKind, ready_since_ms: int) -> None:
        """Key ``ticket_key`` has ``kind`` work waiting since ``ready_since_ms``. Idempotent."""
        self._waiting[kind].add(ticket_key, tenant, ready_since_ms)

    def acquire_uncontended(self, tenant: str, n: int, kind: TicketKind = "new") -> int:
        """Work-conserving fast path: when no ticket of any tenant is waiting, fairness has
        nothing to arbitrate, so take up to ``n`` free slots at once (within the pool and the
        tenant's quota) without a ticket. Returns the slots taken (0 when others are waiting);
        the caller then files a ticket like everyone else. Retries stop short of the headroom
        kept for new work here too: new work that arrives a moment later has no ticket to
        compete with yet, and a retry may hold its slot for a whole HTTP timeout."""
        if n <= 0 or self.waiting_count() > 0:
            return 0
        held = self._in_flight.get(tenant, 0)
        pool, quota = (self._pool_size, self._quota) if kind == "new" else (self._retry_pool_limit, self._retry_quota)
        take = min(n, pool - self._in_flight_total, quota - held)
        if take <= 0:
            return 0
        self._in_flight[tenant] = held + take
        self._in_flight_total += take
        return take

    def grant(self, now_ms: int) -> list[str]:
        """Hand out free slots; returns the granted keys in order (a key appears once per slot).
        Grants not taken within ``grant_pickup_ms`` lapse first, and their slots are handed on."""
        for key, at in list(self._granted_at.items()):
            if now_ms - at > self.grant_pickup_ms:
                self._drop_grant(key)
        granted = self._grant_urgent(now_ms, now_ms - self._urgent_after_ms)
        granted += self._grant_drr(
            now_ms, self._waiting["new"], self._pool_size - self._in_flight_total, self._quota
        )
        granted += self._grant_drr(
            now_ms,
            self._waiting["retry"],
            self._retry_pool_limit - self._in_flight_total,
            self._retry_quota,
        )
        return granted

    def has_grant(self, ticket_key: str) -> bool:
        """Whether slots were granted to this key and not yet taken."""
        return ticket_key in self._grants

    def take_grant(self, ticket_key: str) -> int:
        """Slots granted to this key since it last asked; the key now owns them."""
        self._granted_at.pop(ticket_key, None)
        return self._grants.pop(ticket_key, ("", 0))[1]

    def release(self, tenant: str, n: int = 1) -> None:
        """``n`` requests of ``tenant`` finished (or a taken slot went unused). Only for slots
        taken with ``take_grant``; untaken ones come back through ``cancel``."""
        held = self._in_flight.get(tenant, 0)
        if not 0 < n <= held:
            raise ValueError(f"tenant {tenant!r} holds {held} slots, cannot release {n}")
        if held == n:
            del self._in_flight[tenant]
        else:
            self._in_flight[tenant] = held - n
        self._in_flight_total -= n

    def cancel(self, ticket_key: str) -> None:
        """The key no longer wants slots (breaker opened, endpoint disabled): drop its tickets
        and give back any grant it has not taken."""
        for waiting in self._waiting.values():
            waiting.remove(ticket_key)
        self._drop_grant(ticket_key)

    def next_in_line(self, ticket_key: str) -> bool:
        """Whether a grant may come to this key soon: its ticket is its tenant's oldest (of
        either kind) and its tenant is among the next ``pool_size`` turns of that kind's ring.
        Such a key should ask again within ``grant_pickup_ms``; others may back off."""
        for waiting in self._waiting.values():
            tenant = waiting.tenant_of(ticket_key)
            if tenant is None:
                continue
            oldest = waiting.oldest(tenant)
            if (oldest is not None and oldest[1] == ticket_key
                    and tenant in itertools.islice(waiting.ring, self._pool_size)):
                return True
        return False

    # -- observation ------------------------------------------------------------------------

    def in_flight(self, tenant: str) -> int:
        return self._in_flight.get(tenant, 0)

    def tenants_at_quota(self) -> int:
        """Tenants using every slot of their quota: the ones being throttled now."""
        return sum(1 for n in self._in_flight.values() if n >= self._quota)

    def at_quota(self, tenant: str) -> bool:
        """Whether the tenant uses every slot of its quota now."""
        return self._in_flight.get(tenant, 0) >= self._quota

    def in_flight_total(self) -> int:
        return self._in_flight_total

    def waiting_count(self) -> int:
        return sum(len(waiting) for waiting in self._waiting.values())

    # -- internals --------------------------------------------------------------------------

    def _drop_grant(self, key: str) -> None:
        self._granted_at.pop(key, None)
        tenant, slots = self._grants.pop(key, ("", 0))
        if slots:
            self.release(tenant, slots)

    def _give(self, waiting: _Waiting, tenant: str, key: str, now_ms: int) -> None:
        waiting.remove(key)
        self._in_flight[tenant] = self._in_flight.get(tenant, 0) + 1
        self._in_flight_total += 1
        slots = self._grants.get(key, (tenant, 0))[1]
        self._grants[key] = (tenant, slots + 1)
        self._granted_at.setdefault(key, now_ms)

    def _grant_urgent(self, now_ms: int, cutoff_ms: int) -> list[str]:
        waiting = self._waiting["new"]
        granted: list[str] = []
        for tenant in list(waiting.ring):
            if self._in_flight_total >= self._pool_size:
                break
            oldest = waiting.oldest(tenant)
            if oldest is None or oldest[0] > cutoff_ms or self.in_flight(tenant) >= self._quota:
                continue
            self._give(waiting, tenant, oldest[1], now_ms)
            granted.append(oldest[1])
        return granted

    def _grant_drr(self, now_ms: int, waiting: _Waiting, budget: int, tenant_limit: int) -> list[str]:
        granted: list[str] = []
        blocked_in_a_row = 0  # tenants passed over for a full quota; a whole ring of them = done
        while budget > 0 and waiting.ring and blocked_in_a_row < len(waiting.ring):
            tenant = waiting.ring[0]
            if self.in_flight(tenant) >= tenant_limit:
                waiting.rotate()
                blocked_in_a_row += 1
                continue
            blocked_in_a_row = 0
            quantum = self._quantum.get(tenant, self._default_quantum)
            if not waiting.head_charged:
                waiting.credit[tenant] += quantum
                waiting.head_charged = True
            while budget > 0 and waiting.credit[tenant] >= 1 and self.in_flight(tenant) < tenant_limit:
                oldest = waiting.oldest(tenant)
                assert oldest is not None  # a tenant in the ring has tickets
                waiting.credit[tenant] -= 1
                self._give(waiting, tenant, oldest[1], now_ms)
                granted.append(oldest[1])
                budget -= 1
                if not waiting.has_tenant(tenant):
                    break  # its last ticket: it left the ring and the turn moved on
            if not waiting.has_tenant(tenant):
                continue
            if budget == 0 and waiting.credit[tenant] >= 1 and self.in_flight(tenant) < tenant_limit:
                break  # pool full mid-turn: resume this tenant's turn on the next call
            # A turn cut short by the quota must not bank credit for a burst later.
            waiting.credit[tenant] = min(waiting.credit[tenant], quantum)
            waiting.rotate()
        return granted
