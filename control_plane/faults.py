"""Fault injection for the crash tests: kill this process at a named point of a request.

``WEBHOOKS_CONTROL_PLANE__KILL_AT=create.stored`` makes the server SIGKILL itself right after an
endpoint's row is stored and before its config is published -- the gap a dual write leaves, which
the durable holds of :mod:`control_plane.publishing.configs` must cover. Empty (the default) = no faults.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

log = logging.getLogger(__name__)

POINTS = frozenset({"create.stored"})


def killer(kill_at: str) -> Callable[[str], None]:
    if not kill_at:
        return lambda point: None
    if kill_at not in POINTS:
        raise ValueError(f"unknown fault point {kill_at!r}; known: {sorted(POINTS)}")

    def fault(point: str) -> None:
        if point == kill_at:
            log.warning("fault injection: SIGKILL at %s", point)
            os.kill(os.getpid(), signal.SIGKILL)

    return fault
