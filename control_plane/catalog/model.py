"""A tenant's event-type catalog as values: a type, its schema versions, their status.

What the catalog's service (:mod:`control_plane.catalog.service`), its store and its exports
(:mod:`control_plane.catalog.export`) all read, kept apart so none of them imports another for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.event_schemas import SchemaVersion

ACTIVE, DEPRECATED = "active", "deprecated"


@dataclass(frozen=True)
class VersionEntry:
    version: SchemaVersion
    schema: Mapping[str, Any]
    examples: tuple[Any, ...]
    created_at_ms: int
    created_by: str
    status: str = ACTIVE
    sunset_at_ms: int | None = None

    def stored(self) -> str:
        """The row's map value (the key is str(version))."""
        return json.dumps({"schema": self.schema, "examples": list(self.examples), "created_at": self.created_at_ms,
                           "created_by": self.created_by, "status": self.status, "sunset_at": self.sunset_at_ms},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_stored(cls, key: str, text: str) -> VersionEntry:
        doc = json.loads(text)
        return cls(SchemaVersion.parse(key), doc["schema"], tuple(doc["examples"]), doc["created_at"],
                   doc["created_by"], doc.get("status", ACTIVE), doc.get("sunset_at"))


@dataclass(frozen=True)
class EventTypeEntry:
    tenant_id: str
    name: str
    description: str
    group: str
    status: str
    sunset_at_ms: int | None
    enforcement: str
    created_at_ms: int
    updated_at_ms: int
    updated_by: str
    revision: int
    versions: tuple[VersionEntry, ...] = ()  # oldest first
    # How long its deliveries may be replayed by hand, from the event's occurrence: a duration
    # or "never" (core/replay_policy.py); "" = the 30-day history.
    replay_window: str = ""

    def version(self, v: SchemaVersion) -> VersionEntry | None:
        return next((e for e in self.versions if e.version == v), None)

    def newest_in_major(self, major: int) -> VersionEntry | None:
        return max((e for e in self.versions if e.version.major == major), key=lambda e: e.version, default=None)


@dataclass(frozen=True)
class ReplayRuleEntry:
    """A tenant's replay window for the types its pattern matches that have none of their own."""

    pattern: str
    window: str
    updated_at_ms: int
    updated_by: str


OPERATIONS_GROUP = "operations"
PLATFORM_ACTOR = "platform"


def operational_entries(tenant_id: str) -> list[EventTypeEntry]:
    """The platform's operational event types (core.operational_events) as catalog entries of
    ``tenant_id``: shown and exported beside the tenant's own, never stored or changed."""
    from core import operational_events as ops

    return [EventTypeEntry(tenant_id, t.name, t.description, OPERATIONS_GROUP, ACTIVE, None, "reject", 0, 0,
                           PLATFORM_ACTOR, 1,
                           (VersionEntry(SchemaVersion.parse(t.version), t.schema, (ops.example(t.name),), 0,
                                         PLATFORM_ACTOR),))
            for t in sorted(ops.CATALOG.values(), key=lambda t: t.name)]
