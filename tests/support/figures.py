"""The figures a fault's verdict is judged by, as pure functions of recorded times, and the bounds
they are held to.

Kept apart from the fixtures that record the times (tests/support/faults.py, cluster_faults.py)
so that tests/unit/support/test_figures.py can pin them with plain numbers.
"""

from __future__ import annotations

from collections.abc import Iterable

# The brief: "99 % of new eligible deliveries start their first attempt within 10 seconds", and a
# fault of one node must not take that from a tenant it does not concern (fair recovery). The
# healthy tenant beside each fault is held to it.
HEALTHY_P99_BOUND_MS = 10_000.0

# A rescale pauses deliveries for seconds, not a minute: what an operator may plan a rescale
# around. The longest time the healthy tenant's endpoint went without a request.
RESCALE_PAUSE_BOUND_S = 15.0


def p99(values: Iterable[float]) -> float | None:
    """The 99th percentile as every verdict of the fault tests computes it (None: no values): the
    sorted values' element at floor(0.99 n) - 1, i.e. of 100 values the 99th smallest, and of
    fewer never the largest unless it is the only one, so one outlier alone is not the figure."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, int(len(ordered) * 0.99) - 1)]


def longest_silence(times: Iterable[float], since: float) -> float | None:
    """The longest gap after ``since`` between two successive ``times`` (requests one endpoint
    received): the pause a fault at ``since`` caused it. A gap that began before ``since`` counts
    from ``since``. None when no request came after ``since``: a silence that never ended is not
    a pause but a loss, which the verdict's counts report."""
    ordered = sorted(times)
    gaps = [b - max(a, since) for a, b in zip(ordered, ordered[1:], strict=False) if b > since]
    return max(gaps) if gaps else None
