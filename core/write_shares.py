"""How the operator's budget of Cassandra I/O in flight is shared between endpoints.

``cassandra.max_concurrent_writes`` bounds the history writes and reads one dispatcher has in
flight, for every endpoint it drives. Handed out first come first served, one endpoint with a
storage backlog (a deleted endpoint's 20,000 deliveries ending) took all of it: its writes
finish, its next pass refills the budget before anyone else's back-off timer fires, and another
tenant's first attempts waited seconds for their creation rows.

So the budget is shared like the tenant slots: equally between the tenants contending for it,
and within a tenant equally between its endpoints. An endpoint contends while it has storage
I/O in flight, and for ``want_ttl_ms`` after a pass that used all the budget it was given (it may
want more: its next pass is a back-off away, and meanwhile the others must leave it room). A
share never falls below one, so everyone moves; what is free overall still bounds every grant.
"""

from __future__ import annotations

from collections import deque


class WriteShares:
    def __init__(self, total: int, want_ttl_ms: int) -> None:
        self.total = total
        self.in_flight = 0
        self._want_ttl_ms = want_ttl_ms
        self._by_endpoint: dict[str, int] = {}  # storage I/O in flight
        self._by_tenant: dict[str, int] = {}
        self._wanting: dict[str, int] = {}  # endpoint -> contends until (ms)
        self._expiries: deque[tuple[int, str]] = deque()  # (until, endpoint), in time order
        self._tenant_of: dict[str, str] = {}  # contending endpoints only
        self._contending: dict[str, set[str]] = {}  # tenant -> its contending endpoints

    def budget(self, endpoint_id: str, tenant_id: str, now_ms: int) -> int:
        """How many more storage operations the endpoint may start now (may be <= 0)."""
        self._expire(now_ms)
        tenants = len(self._contending) + (tenant_id not in self._contending)
        tenant_share = max(1, self.total // tenants)
        endpoints = self._contending.get(tenant_id, set())
        endpoint_share = max(1, tenant_share // (len(endpoints) + (endpoint_id not in endpoints)))
        return min(self.total - self.in_flight, tenant_share - self._by_tenant.get(tenant_id, 0),
                   endpoint_share - self._by_endpoint.get(endpoint_id, 0))

    def used(self, endpoint_id: str, tenant_id: str, given: int, used: int, now_ms: int) -> None:
        """After a pass: the endpoint used ``used`` of the ``given`` budget."""
        if used >= given:
            until = now_ms + self._want_ttl_ms
            self._wanting[endpoint_id] = until
            self._expiries.append((until, endpoint_id))
            self._enter(endpoint_id, tenant_id)
        elif endpoint_id in self._wanting:
            del self._wanting[endpoint_id]
            self._leave_if_idle(endpoint_id)

    def started(self, endpoint_id: str, tenant_id: str) -> None:
        self.in_flight += 1
        self._by_endpoint[endpoint_id] = self._by_endpoint.get(endpoint_id, 0) + 1
        self._enter(endpoint_id, tenant_id)
        tenant = self._tenant_of[endpoint_id]
        self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + 1

    def finished(self, endpoint_id: str) -> None:
        self.in_flight -= 1
        tenant = self._tenant_of[endpoint_id]
        left = self._by_tenant[tenant] - 1
        if left:
            self._by_tenant[tenant] = left
        else:
            del self._by_tenant[tenant]
        left = self._by_endpoint[endpoint_id] - 1
        if left:
            self._by_endpoint[endpoint_id] = left
        else:
            del self._by_endpoint[endpoint_id]
            self._leave_if_idle(endpoint_id)

    def _enter(self, endpoint_id: str, tenant_id: str) -> None:
        if endpoint_id not in self._tenant_of:
            # An endpoint keeps the tenant it entered with while it contends (its I/O counts there).
            self._tenant_of[endpoint_id] = tenant_id
            self._contending.setdefault(tenant_id, set()).add(endpoint_id)

    def _leave_if_idle(self, endpoint_id: str) -> None:
        if endpoint_id in self._by_endpoint or endpoint_id in self._wanting:
            return
        tenant = self._tenant_of.pop(endpoint_id, None)
        if tenant is None:
            return
        endpoints = self._contending[tenant]
        endpoints.discard(endpoint_id)
        if not endpoints:
            del self._contending[tenant]

    def _expire(self, now_ms: int) -> None:
        while self._expiries and self._expiries[0][0] <= now_ms:
            until, endpoint_id = self._expiries.popleft()
            if self._wanting.get(endpoint_id) == until:
                del self._wanting[endpoint_id]
                self._leave_if_idle(endpoint_id)
