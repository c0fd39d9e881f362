"""What a step of the endpoint driver returns: the I/O to start and when to be woken, and why.

Values only. The Flink adapter (:mod:`operators.dispatcher`) turns each action into a history
read or write, an HTTP request or a replay's load, and sets one timer at ``Decision.wake``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from core import ordering
from core.dispatch import Pending
from core.records import EndpointConfig, EndpointSignal


@dataclass(frozen=True)
class Check:
    """Read the delivery's durable record (status, counts, highest attempt number)."""
    p: Pending


@dataclass(frozen=True)
class Persist:
    """Write the creation rows and the reserved attempt row ``p.intent``."""
    p: Pending


@dataclass(frozen=True)
class Reserve:
    """Write the reserved attempt row ``p.intent``."""
    p: Pending


@dataclass(frozen=True)
class Send:
    """Make the HTTP request for ``p.intent`` (manual when ``p.sending_manual``)."""
    p: Pending
    config: EndpointConfig


@dataclass(frozen=True)
class Record:
    """Write ``p.record``; ``p.intent`` (if any) is the next attempt row, reserved in the same write.
    ``key_row``: the head of an ordering key failed (its key is blocked) or is final (free again)."""
    p: Pending
    key_row: ordering.KeyRowChange | None = None


@dataclass(frozen=True)
class Load:
    """Load a delivery this endpoint does not hold, for a replay."""
    delivery_id: str


Action = Check | Persist | Reserve | Send | Record | Load
IoKind = Literal["check", "persist", "reserve", "send", "record", "load"]


@dataclass(frozen=True)
class Wake:
    at_ms: int
    reason: str


@dataclass
class Decision:
    actions: list[Action] = field(default_factory=list)
    signals: list[EndpointSignal] = field(default_factory=list)
    wake: Wake | None = None

    def wake_at(self, at_ms: int | None, reason: str) -> None:
        if at_ms is not None and (self.wake is None or at_ms < self.wake.at_ms):
            self.wake = Wake(at_ms, reason)
