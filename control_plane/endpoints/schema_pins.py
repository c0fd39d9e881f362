"""An endpoint's schema pins: the majors of its event types it accepts (empty: every major).

The one rule and the one path for every way pins are set -- EventCatalog.SetEndpointSchemaMajors
and an endpoint's create/update (``schema_majors``): normalised by ``pinned_majors``, stored in
endpoint_schema_pins (cassandra/schema/014_event_catalog.cql) and published to the delivery job as
a SchemaPinsRecord, whose fan-out leaves the endpoint out of events of other majors
(core.fanout.leave_out_pinned). Pins live beside the endpoint's row, not in it: they do not
change its config_version. The record published is the row as read back, its revision the row's
write time (control_plane.publishing.catalog): of two concurrent settings, the job ends on the
one Cassandra kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from control_plane.errors import InvalidArgument
from control_plane.publishing.catalog import PINS, CatalogPublication

MAX_PINNED_MAJORS = 10
MAX_MAJOR = 999_999


class PinStore(Protocol):
    def put_schema_pins(self, tenant_id: str, endpoint_id: str, majors: tuple[int, ...], at_ms: int,
                        by: str) -> None: ...

    def get_schema_pins(self, tenant_id: str, endpoint_ids: Sequence[str]) -> dict[str, tuple[int, ...]]:
        """The pins of those of ``endpoint_ids`` that have any (an endpoint never pinned is absent)."""
        ...


def pinned_majors(majors: Iterable[int]) -> tuple[int, ...]:
    """The pins as stored and published: each major once, ascending."""
    pinned = tuple(sorted(set(majors)))
    if len(pinned) > MAX_PINNED_MAJORS or any(not 1 <= m <= MAX_MAJOR for m in pinned):
        raise InvalidArgument(f"schema_majors must hold at most {MAX_PINNED_MAJORS} majors from 1 to {MAX_MAJOR}")
    return pinned


class SchemaPins:
    """Callers check that the endpoint is the caller's and may be changed; this stores and publishes."""

    def __init__(self, store: PinStore, publication: CatalogPublication, now_ms: Callable[[], int]) -> None:
        self._store = store
        self._publication = publication  # returns once the delivery job counts the stored pins
        self._now_ms = now_ms

    def set(self, tenant_id: str, endpoint_id: str, majors: Iterable[int], actor: str) -> tuple[int, ...]:
        pinned = pinned_majors(majors)
        self._publication.change(tenant_id, PINS, endpoint_id, lambda: self._store.put_schema_pins(
            tenant_id, endpoint_id, pinned, self._now_ms(), actor))
        return pinned

    def of(self, tenant_id: str, endpoint_ids: Sequence[str]) -> dict[str, tuple[int, ...]]:
        return self._store.get_schema_pins(tenant_id, endpoint_ids) if endpoint_ids else {}
