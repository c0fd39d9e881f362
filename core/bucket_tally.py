"""Latency-bucket counts kept in the task thread and handed to Flink's counters in batches.

Every ``counter.inc()`` is a call from Python into the JVM (pemja), and a cumulative histogram
(:func:`core.telemetry.bucket_labels`) moves every bucket at or above the value: fan-out's lag
histogram cost up to 14 such calls per event. A tally counts per bucket locally and hands over
the cumulative increments when the operator publishes (at most every few hundred ms): one call
per bucket that moved, per publication, whatever the event rate.
"""

from __future__ import annotations

import bisect

from core.telemetry import BUCKET_LABELS, LATENCY_BUCKETS_MS


class BucketTally:
    __slots__ = ("_counts",)

    def __init__(self) -> None:
        # _counts[i]: values in bucket i alone (the last one is "inf" alone), since the last drain.
        self._counts = [0] * len(BUCKET_LABELS)

    def observe(self, value_ms: float) -> None:
        self._counts[bisect.bisect_left(LATENCY_BUCKETS_MS, value_ms)] += 1

    def drain(self) -> list[tuple[str, int]]:
        """(label, increment) of every cumulative bucket that moved since the last drain: the
        same totals as incrementing every label of ``bucket_labels(value)`` per value."""
        moved = []
        running = 0
        for label, n in zip(BUCKET_LABELS, self._counts, strict=True):
            running += n
            if running:
                moved.append((label, running))
        self._counts = [0] * len(BUCKET_LABELS)
        return moved
