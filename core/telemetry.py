"""What the job measures, as pure functions the Flink operators export (operators/job_metrics.py).

The brief's signals: lag from event to fan-out, the oldest ages of new and retry deliveries,
first-attempt latency, success per status class, retry amplification, circuit state, tenant
throttling and replay outcomes. Everything here is bounded in cardinality: per operator instance,
per status class, per latency bucket -- never per endpoint or per tenant (those are
`webhookctl deliveries` and Cassandra's job).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from core.breaker import CircuitState
from core.outcomes import ErrorClass, HttpResult

# Latency buckets (ms) of the exported histograms; upper bounds, Prometheus `le` style. The 10 s
# bucket is the first-attempt objective's, so "how many within the objective" is one series.
LATENCY_BUCKETS_MS: tuple[int, ...] = (10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
                                       300_000)
BUCKET_LABELS: tuple[str, ...] = (*(str(b) for b in LATENCY_BUCKETS_MS), "inf")

STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "timeout", "network", "tls", "refused", "internal")

_NETWORK = {ErrorClass.CONNECT, ErrorClass.RESET, ErrorClass.DNS, ErrorClass.PROTOCOL}


def status_class(result: HttpResult) -> str:
    """The class of one finished try: its status family when the endpoint answered, else why not."""
    if result.status is not None:
        return f"{min(max(result.status // 100, 2), 5)}xx"
    error = result.error
    if error is ErrorClass.TIMEOUT:
        return "timeout"
    if error is ErrorClass.TLS:
        return "tls"
    if error is ErrorClass.EGRESS_REFUSED:
        return "refused"
    if error in _NETWORK:
        return "network"
    return "internal"


def bucket_labels(value_ms: float) -> tuple[str, ...]:
    """The labels of every bucket whose upper bound holds the value, "inf" included: buckets are
    cumulative, as Prometheus histograms are, so `histogram_quantile` reads them as they are
    (the rules only rename the label to `le`)."""
    return BUCKET_LABELS[bisect.bisect_left(LATENCY_BUCKETS_MS, value_ms):]


@dataclass(frozen=True)
class PendingView:
    """What the gauges need of one pending delivery."""

    created_at_ms: int
    attempted: bool  # at least one automatic attempt made: a retry, not new work


@dataclass(frozen=True)
class EndpointView:
    """What the gauges need of one endpoint a dispatcher instance holds."""

    pending: tuple[PendingView, ...]
    spilled: int  # in the overflow queue (keyed state only; counted as new)
    spilled_oldest_ms: int | None  # arrival of the overflow queue's head, when known
    breaker: CircuitState
    parked: bool  # held back: breaker open, disabled, gone, or an internal-error hold
    consecutive_failures: int = 0


@dataclass(frozen=True)
class DispatcherGauges:
    pending_new: int = 0
    pending_retry: int = 0
    # Arrival (ms) of the oldest delivery not yet attempted on an endpoint free to send -- the
    # platform's own lag, which the first-attempt objective is about -- and of the oldest one
    # parked behind an endpoint that may not be sent to (its receiver's problem, not ours).
    oldest_new_ms: int | None = None
    oldest_parked_new_ms: int | None = None
    oldest_retry_ms: int | None = None
    endpoints: int = 0
    breakers_open: int = 0
    breakers_half_open: int = 0
    endpoints_parked: int = 0
    tenants_at_quota: int = 0

    @property
    def ageing(self) -> bool:
        """Whether any "oldest ... age" is non-zero: it grows while nothing else happens."""
        return not (self.oldest_new_ms is None and self.oldest_parked_new_ms is None and self.oldest_retry_ms is None)

    def age_ms(self, created_ms: int | None, now_ms: int) -> int:
        """Age at read time, so a gauge keeps growing while nothing happens (0: none)."""
        return max(0, now_ms - created_ms) if created_ms is not None else 0


def _older(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


@dataclass(frozen=True)
class EndpointSummary:
    """One endpoint's part of the gauges: its deliveries reduced to counts and oldest arrivals,
    so the operator can keep it until a pass changes the endpoint instead of walking every held
    delivery at each refresh."""

    new: int = 0  # not yet attempted, the overflow queue's included
    retry: int = 0
    oldest_new_ms: int | None = None
    oldest_retry_ms: int | None = None
    breaker: CircuitState = CircuitState.CLOSED
    parked: bool = False
    consecutive_failures: int = 0
    held: int = 0  # in memory and in the overflow queue


def summarize(ep: EndpointView) -> EndpointSummary:
    new, retry = ep.spilled, 0
    oldest_new = ep.spilled_oldest_ms if ep.spilled else None
    oldest_retry: int | None = None
    for p in ep.pending:
        if p.attempted:
            retry += 1
            oldest_retry = _older(oldest_retry, p.created_at_ms)
        else:
            new += 1
            oldest_new = _older(oldest_new, p.created_at_ms)
    return EndpointSummary(new=new, retry=retry, oldest_new_ms=oldest_new, oldest_retry_ms=oldest_retry,
                           breaker=ep.breaker, parked=ep.parked, consecutive_failures=ep.consecutive_failures,
                           held=len(ep.pending) + ep.spilled)


def aggregate(endpoints: Iterable[EndpointSummary], tenants_at_quota: int) -> DispatcherGauges:
    """One dispatcher instance's gauges from its endpoints' summaries. Ages run from the event's
    arrival on the events topic (the delivery's created_at)."""
    new = retry = n = opened = half = parked = 0
    oldest_new: int | None = None
    oldest_parked: int | None = None
    oldest_retry: int | None = None
    for ep in endpoints:
        n += 1
        opened += ep.breaker is CircuitState.OPEN
        half += ep.breaker is CircuitState.HALF_OPEN
        parked += ep.parked
        new += ep.new
        retry += ep.retry
        oldest_retry = _older(oldest_retry, ep.oldest_retry_ms)
        if ep.parked:
            oldest_parked = _older(oldest_parked, ep.oldest_new_ms)
        else:
            oldest_new = _older(oldest_new, ep.oldest_new_ms)
    return DispatcherGauges(
        pending_new=new, pending_retry=retry, oldest_new_ms=oldest_new, oldest_parked_new_ms=oldest_parked,
        oldest_retry_ms=oldest_retry, endpoints=n, breakers_open=opened, breakers_half_open=half,
        endpoints_parked=parked, tenants_at_quota=tenants_at_quota)
