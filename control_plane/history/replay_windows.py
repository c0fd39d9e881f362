"""The replay windows of a tenant, read from the catalog for the delivery service.

The rule itself is core/replay_policy.py; this module only reads what it needs -- a type's own
window (event_types.replay_window), the tenant's pattern rules (replay_rules) and when events
occurred (the job's events table) -- reading each type and the tenant's rules once per lookup
object, so a bulk recovery over thousands of deliveries reads them once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from control_plane.catalog.model import EventTypeEntry, ReplayRuleEntry
from core import replay_policy
from core.replay_policy import ReplayRule, ReplayWindow, TypeRule

log = logging.getLogger(__name__)


class WindowStore(Protocol):
    def get_type(self, tenant_id: str, name: str) -> EventTypeEntry | None: ...
    def list_replay_rules(self, tenant_id: str) -> list[ReplayRuleEntry]: ...
    def occurred_at_of(self, event_ids: Sequence[str]) -> dict[str, int]: ...


class TenantWindows:
    """One tenant's rules, each type's looked up once."""

    def __init__(self, store: WindowStore, tenant_id: str) -> None:
        self._store = store
        self._tenant_id = tenant_id
        self._rules: tuple[TypeRule, ...] | None = None
        self._by_type: dict[str, ReplayRule | None] = {}

    def rule(self, event_type: str) -> ReplayRule | None:
        if event_type not in self._by_type:
            entry = self._store.get_type(self._tenant_id, event_type)
            own = _parsed(entry.replay_window, f"type {event_type}") if entry is not None else None
            self._by_type[event_type] = replay_policy.rule_for(event_type, own, self._tenant_rules())
        return self._by_type[event_type]

    def occurred_at(self, event_ids: Sequence[str]) -> dict[str, int]:
        return self._store.occurred_at_of(event_ids) if event_ids else {}

    def _tenant_rules(self) -> tuple[TypeRule, ...]:
        if self._rules is None:
            rules = []
            for r in self._store.list_replay_rules(self._tenant_id):
                window = _parsed(r.window, f"rule {r.pattern}")
                if window is not None:
                    rules.append(TypeRule(r.pattern, window))
            self._rules = tuple(rules)
        return self._rules


class CatalogReplayWindows:
    """What the delivery service asks for each replay or bulk recovery."""

    def __init__(self, store: WindowStore) -> None:
        self._store = store

    def for_tenant(self, tenant_id: str) -> TenantWindows:
        return TenantWindows(self._store, tenant_id)


def _parsed(text: str, what: str) -> ReplayWindow | None:
    """A stored window; one that no longer parses (written by hand) counts as ``never``: the
    policy errs on not sending again."""
    try:
        return replay_policy.parse_window(text)
    except replay_policy.WindowError:
        log.error("replay window %r of %s is not valid; replays refused until it is fixed", text, what)
        return ReplayWindow(text, None)
