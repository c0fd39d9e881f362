"""How long a delivery may be replayed by hand: a window per event type, pure.

The history keeps every delivery 30 days, and by default each may be replayed for as long as it
is kept. Some events must not reach a receiver again after a shorter business deadline (a
``user.disabled`` sent a month later lands on newer state), while their records stay visible.
So a tenant may set a **replay window**: a duration (``90s``, ``15m``, ``1h``, ``7d``) or
``never``, counted from the event's occurrence.

Where the window comes from, first found wins:

1. the catalogued type's own window (the catalog field ``replay_window``);
2. the tenant's rule whose type pattern is the most specific match (``user.disabled`` before
   ``user.*`` before ``*``; a longer prefix before a shorter one), for types without a window
   of their own -- uncatalogued types, and tenants without a catalog;
3. none: the 30-day history.

The window governs manual replays only (a single replay, a bulk recovery, and the job reading a
replay request queued before the window closed); automatic retries keep their own deadline.
Nothing here reads a clock: ``now_ms`` is always an argument.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from core.fanout import filter_accepts
from core.identifiers import EVENT_TYPE
from core.timeutil import ms_to_iso

HISTORY_MS = 30 * 24 * 3600 * 1000
NEVER = "never"
CATALOG, TENANT = "catalog", "tenant rule"

_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"([1-9][0-9]{0,6})([smhd])")


class WindowError(ValueError):
    """A window or pattern that cannot be a rule; the message says what is accepted."""


@dataclass(frozen=True)
class ReplayWindow:
    """A parsed window: ``ms`` is None for ``never``. ``text`` is its canonical spelling."""

    text: str
    ms: int | None


def parse_window(text: str) -> ReplayWindow | None:
    """``never``, or a whole number of s/m/h/d up to the 30-day history; ``""``: not set (None)."""
    text = (text or "").strip().lower()
    if not text:
        return None
    if text == NEVER:
        return ReplayWindow(NEVER, None)
    m = _DURATION.fullmatch(text)
    if m is None:
        raise WindowError(f"replay window {text!r} must be never or a duration such as 90s, 15m, 1h or 7d")
    ms = int(m.group(1)) * _UNITS_MS[m.group(2)]
    if ms > HISTORY_MS:
        raise WindowError(f"replay window {text!r} is longer than the 30-day history; leave it unset for 30 days")
    return ReplayWindow(f"{int(m.group(1))}{m.group(2)}", ms)


def check_pattern(pattern: str) -> str:
    """A tenant rule's type pattern: an exact type, ``prefix.*``, or ``*``."""
    base = pattern[:-2] if pattern.endswith(".*") else pattern
    if pattern != "*" and not (1 <= len(pattern) <= 200 and EVENT_TYPE.fullmatch(base)):
        raise WindowError(f"pattern {pattern!r} must be an event type, a prefix such as user.*, or *")
    return pattern


@dataclass(frozen=True)
class TypeRule:
    """A tenant's window for the event types its pattern matches."""

    pattern: str
    window: ReplayWindow


@dataclass(frozen=True)
class ReplayRule:
    """The rule that governs one delivery's replays: where it comes from, for which types."""

    source: str  # CATALOG | TENANT
    pattern: str  # the catalogued type, or the tenant rule's pattern
    window: ReplayWindow

    @property
    def name(self) -> str:
        """What a refusal, the console and a bulk recovery's report call it."""
        return f"{self.source} {self.pattern}: replay window {self.window.text}"


def _specificity(pattern: str) -> tuple[int, int]:
    """Exact types first, then the longest prefix; ``*`` last."""
    if pattern == "*":
        return (0, 0)
    if pattern.endswith(".*"):
        return (1, len(pattern))
    return (2, len(pattern))


def rule_for(event_type: str, catalog_window: ReplayWindow | None,
             tenant_rules: Iterable[TypeRule]) -> ReplayRule | None:
    """The rule for ``event_type``: its catalogued window, else the tenant's most specific
    matching rule, else None (the 30-day history)."""
    if catalog_window is not None:
        return ReplayRule(CATALOG, event_type, catalog_window)
    matching = [r for r in tenant_rules if filter_accepts([r.pattern], event_type)]
    if not matching:
        return None
    best = max(matching, key=lambda r: _specificity(r.pattern))
    return ReplayRule(TENANT, best.pattern, best.window)


def window_start_ms(occurred_at_ms: int | None, created_at_ms: int) -> int:
    """When a delivery's window opens: the event's occurrence. The delivery's creation bounds
    it, as the producer's clock may run ahead: a future occurrence cannot lengthen a window."""
    return created_at_ms if occurred_at_ms is None else min(occurred_at_ms, created_at_ms)


def closes_at_ms(rule: ReplayRule, start_ms: int) -> int:
    """When the window closes; a ``never`` window is closed from the start."""
    return start_ms + (rule.window.ms or 0)


@dataclass(frozen=True)
class ReplayDecision:
    """May the delivery be replayed at ``now``; ``rule`` None: only the history limits it."""

    allowed: bool
    rule: ReplayRule | None
    closes_at_ms: int | None

    @property
    def refusal(self) -> str:
        """The FAILED_PRECONDITION text of a refusal (empty when allowed)."""
        if self.allowed or self.rule is None or self.closes_at_ms is None:
            return ""
        return refusal_text(self.rule.name, self.closes_at_ms)


def decide(rule: ReplayRule | None, start_ms: int, now_ms: int) -> ReplayDecision:
    """The replay decision at ``now_ms`` for a delivery whose window opened at ``start_ms``."""
    if rule is None:
        return ReplayDecision(True, None, None)
    closes = closes_at_ms(rule, start_ms)
    return ReplayDecision(is_open(closes, now_ms), rule, closes)


def is_open(closes_at: int | None, now_ms: int) -> bool:
    """Whether a window closing at ``closes_at`` (None: no window) is still open at ``now_ms``.
    The job asks this of a replay request, which carries the closing time it was queued with."""
    return closes_at is None or now_ms < closes_at


def refusal_text(rule_name: str, closed_at_ms: int) -> str:
    return f"replay not allowed: {rule_name} (closed at {ms_to_iso(closed_at_ms)})"
