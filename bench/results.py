"""What one benchmark phase measured and what the full-speed phase cost: the values bench.run
produces and bench.report_md renders, apart from both so neither imports the other."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench import raw_http
from bench.raw_http import percentile
from stack import cpu


@dataclass
class PhaseResult:
    expected: int
    delivered: int  # distinct expected webhook-ids seen
    duplicates: int  # requests beyond the first per webhook-id (retries, re-sends)
    latencies_s: list[float]  # first attempt, sorted
    arrivals: list[float]  # first attempt times, sorted
    produce_s: float
    latencies_by_tenant: dict[str, list[float]]
    pairs: list[tuple[float, float, str]] = field(default_factory=list)  # (produced, arrived, tenant)
    usage: cpu.Usage = field(default_factory=cpu.Usage)  # what the stack's processes spent meanwhile

    def p(self, q: float, tenant: str | None = None) -> float:
        lat = self.latencies_s if tenant is None else sorted(self.latencies_by_tenant.get(tenant, []))
        return percentile(lat, q) * 1000

    @property
    def end_to_end_per_s(self) -> float:
        """Deliveries over first produce -> last arrival."""
        if not self.arrivals or not self.latencies_s:
            return 0.0
        span = self.arrivals[-1] - (self.arrivals[0] - self.latencies_s[0])
        return self.delivered / span if span > 0 else 0.0

    @property
    def sustained_per_s(self) -> float:
        """Rate over the middle 80% of arrivals: leaves out ramp-up and the tail."""
        n = len(self.arrivals)
        if n < 10:
            return 0.0
        lo, hi = int(n * 0.1), int(n * 0.9) - 1
        span = self.arrivals[hi] - self.arrivals[lo]
        return (hi - lo) / span if span > 0 else 0.0


@dataclass(frozen=True)
class Costs:
    """What the full-speed phase cost per delivery beyond its rate and latency, against what one
    raw aiohttp request costs, and what the stack costs with no traffic."""
    deliveries: int
    cpu_s: float  # the delivery path's processes over the full-speed phase
    client_cpu_ms_per_request: float  # the raw phase's aiohttp client
    writes_by_table: dict[str, int] | None  # Cassandra's count over the phase; None: not read
    idle: cpu.Usage | None  # None: --idle-seconds 0

    @classmethod
    def of(cls, full: PhaseResult, raw: raw_http.Result, writes_by_table: dict[str, int] | None,
           idle: cpu.Usage | None) -> Costs:
        return cls(full.delivered, full.usage.total_cpu_s, raw.client_cpu_ms_per_request, writes_by_table, idle)

    @property
    def cpu_ms_per_delivery(self) -> float:
        return self.cpu_s * 1000 / self.deliveries if self.deliveries else 0.0

    @property
    def cpu_per_client_request(self) -> float:
        if not self.client_cpu_ms_per_request:
            return math.nan
        return self.cpu_ms_per_delivery / self.client_cpu_ms_per_request

    @property
    def cassandra_writes(self) -> int | None:
        return None if self.writes_by_table is None else sum(self.writes_by_table.values())

    @property
    def cassandra_writes_per_delivery(self) -> float:
        writes = self.cassandra_writes
        return writes / self.deliveries if writes is not None and self.deliveries else math.nan

    @property
    def idle_cores(self) -> float:
        return self.idle.cores if self.idle is not None else math.nan
