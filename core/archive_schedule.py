"""When the archive audit runs by itself (``python -m control_plane.archive.audit --every 3600``): at each
boundary of its period plus a margin, without cron.

Boundaries are counted from the epoch, so ``--every 3600`` runs at the top of each UTC hour plus
the margin -- the moment an hour closes -- whenever the process started, and several
processes wake together. The margin lets the hour's last writes (batched by the job)
land first. Nothing is owed for a missed boundary: each run audits every hour due not yet
audited, so a run that failed or was skipped is made up by the next. Pure: the clock, the
waiting and the run are passed in (tests/unit/core/test_archive_schedule.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


def next_run_ms(now_ms: int, every_ms: int, margin_ms: int) -> int:
    """The first boundary (a multiple of ``every_ms``) plus ``margin_ms`` strictly after ``now_ms``."""
    if not 0 <= margin_ms < every_ms:
        raise ValueError(f"margin {margin_ms} ms must be at least 0 and less than the period {every_ms} ms")
    return (now_ms - margin_ms) // every_ms * every_ms + every_ms + margin_ms


class Schedule:
    """Waits for each due time and runs; a failed run is logged and counted, and the loop goes on.

    ``wait(seconds)`` returns True when the process was asked to stop (SIGTERM), which ends the
    loop at once -- also mid-wait; ``run`` gets the same question to stop between hours."""

    def __init__(self, every_s: int, margin_s: int, clock_ms: Callable[[], int], wait: Callable[[float], bool],
                 run: Callable[[], object]) -> None:
        next_run_ms(0, every_s * 1000, margin_s * 1000)  # the same check at start-up
        self._every_ms = every_s * 1000
        self._margin_ms = margin_s * 1000
        self._clock_ms = clock_ms
        self._wait = wait
        self._run = run
        self.runs = 0
        self.failures = 0

    def loop(self) -> None:
        while True:
            now = self._clock_ms()
            due = next_run_ms(now, self._every_ms, self._margin_ms)
            if self._wait((due - now) / 1000):
                return
            self.runs += 1
            try:
                self._run()
            except Exception:  # noqa: BLE001 -- one failed run must not end the schedule; the next one retries
                self.failures += 1
                log.exception("archive audit run %d failed; the next run at the next boundary retries", self.runs)
