"""Whether the dispatcher is catching up: deliveries reach it already late.

The dispatcher trades a little latency for CPU in two places: how often it looks at an
endpoint's I/O in flight, and how long a history batch waits for more writes. Each look and each
Cassandra request costs the interpreter the same whether it finds one delivery or ten, so
longer waits coalesce the work of several deliveries into one (docs/performance.md). At light
load the waits are kept short: they would be most of a first attempt's latency. When the
dispatcher is behind its input (a burst queued in Kafka, a restore replaying), a delivery
arrives having waited a while already, and ~10 ms more per step is small beside it, while the
work it saves lets the backlog drain sooner.

Behind is judged from what the dispatcher sees: the age of each new delivery when it arrives
(now minus its event's Kafka time, which fan-out stamps as the delivery's creation). One late
arrival starts catch-up; it ends once no late arrival has been seen for ``hold_ms``, so a
backlog draining at full speed does not flap between modes. Producers' and brokers' clocks
skewed against the TaskManager's by less than ``late_ms`` do not move the judgement.
"""

from __future__ import annotations


class CatchUp:
    def __init__(self, late_ms: int, hold_ms: int) -> None:
        if late_ms < 1 or hold_ms < 0:
            raise ValueError("late_ms must be >= 1 and hold_ms >= 0")
        self._late_ms = late_ms
        self._hold_ms = hold_ms
        self._late_seen_at: int | None = None

    def arrived(self, created_at_ms: int, now_ms: int) -> None:
        """A new delivery reached the dispatcher now."""
        if now_ms - created_at_ms >= self._late_ms:
            self._late_seen_at = now_ms

    def behind(self, now_ms: int) -> bool:
        seen = self._late_seen_at
        return seen is not None and now_ms - seen < self._hold_ms
