"""What fan-out does with an event given its tenant's event-type catalog: pure decisions.

The catalog reaches the job on the endpoints topic (core.records: CatalogTypeRecord,
CatalogSettingsRecord, SchemaPinsRecord), so it is read in order with configs and clock ticks.

=============================================  ============================================
event                                           decision
=============================================  ============================================
``webhook.*`` (the platform's ping, challenge)  sent, never checked
``webhooks.*`` (operational events)             sent: the platform's own catalog
                                                (core.operational_events), not the tenant's
tenant without a catalog on the topic           sent unchecked, as before the catalog
type or version not in the catalog              tenant's ``unknown_types``: ``reject`` ->
                                                dead letter ``schema_unknown``; ``warn`` ->
                                                sent, counted
payload fails its version's schema              type's ``enforcement``: ``reject`` -> dead
                                                letter ``schema_invalid`` with the JSON
                                                Pointer and version; ``warn`` -> sent, counted
payload matches                                 sent
=============================================  ============================================

A dead-lettered event reaches no receiver; fan-out keeps running. Per endpoint, schema pins
(``schema_majors``) leave out the endpoints that do not accept the event's major
(:func:`accepts_major`); :func:`skip_reason` says why, for the skipped delivery the endpoint's
history lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from core import strict_json
from core.event_schemas import SchemaVersion, SchemaVersionError, ValidatorCache
from core.operational_events import is_operational
from core.records import CatalogRecord, CatalogSettingsRecord, CatalogTypeRecord, EventRecord, SchemaPinsRecord

PLATFORM_PREFIX = "webhook."
REJECT, WARN = "reject", "warn"
SCHEMA_INVALID = "schema_invalid"
SCHEMA_UNKNOWN = "schema_unknown"


@dataclass(frozen=True)
class Send:
    """Fan the event out; ``warning`` (schema_invalid / schema_unknown) says it was let through
    by a ``warn`` setting, and is what gets counted."""

    warning: str = ""


@dataclass(frozen=True)
class Refuse:
    """Dead-letter the event instead of fanning it out."""

    reason: str  # schema_invalid | schema_unknown
    detail: str
    pointer: str  # into the payload ("" for the whole document, or for schema_unknown)
    schema_version: str


SEND = Send()


@dataclass
class TenantCatalog:
    """A tenant's catalog as fan-out has read it from the topic."""

    types: dict[str, CatalogTypeRecord]
    settings: CatalogSettingsRecord | None = None

    @property
    def unknown_types(self) -> str:
        # Settings are published with the first type; a type seen before them is let through
        # (warn): dropping events for want of a record that is on its way would lose them.
        return self.settings.unknown_types if self.settings is not None else WARN


def supersedes(current: CatalogRecord | None, incoming: CatalogRecord) -> bool:
    """Whether ``incoming`` replaces ``current`` (the record of the same key read before).

    Records of one key reach the job in any order of revisions -- two control-plane replicas, a
    retried call racing a change, the republisher -- so the higher revision is kept whatever
    came last: going back would check events against a catalog the control plane no longer
    holds. The same revision again is the same record (a republish)."""
    return current is None or incoming.revision >= current.revision


class CatalogIndex:
    """Every tenant's catalog and every endpoint's pins as fan-out has read them, by tenant and by
    endpoint (fan-out rebuilds it from its broadcast state after a restore). A record older than
    the one held for its key is ignored (:func:`supersedes`)."""

    def __init__(self) -> None:
        self._tenants: dict[str, TenantCatalog] = {}
        self._pins: dict[str, SchemaPinsRecord] = {}

    def add(self, record: CatalogRecord) -> bool:
        """Hold ``record`` unless a newer one of its key is held; whether it was taken."""
        if isinstance(record, SchemaPinsRecord):
            if not supersedes(self._pins.get(record.endpoint_id), record):
                return False
            self._pins[record.endpoint_id] = record
            return True
        catalog = self._tenants.setdefault(record.tenant_id, TenantCatalog({}))
        if isinstance(record, CatalogTypeRecord):
            if not supersedes(catalog.types.get(record.event_type), record):
                return False
            catalog.types[record.event_type] = record
        else:
            if not supersedes(catalog.settings, record):
                return False
            catalog.settings = record
        return True

    def tenant(self, tenant_id: str) -> TenantCatalog | None:
        return self._tenants.get(tenant_id)

    def pins(self, endpoint_id: str) -> tuple[int, ...]:
        record = self._pins.get(endpoint_id)
        return record.schema_majors if record is not None else ()


def _version(text: str) -> SchemaVersion | None:
    try:
        return SchemaVersion.parse(text)
    except SchemaVersionError:
        return None


def check_event(event: EventRecord, catalog: TenantCatalog | None, validators: ValidatorCache) -> Send | Refuse:
    if event.event_type.startswith(PLATFORM_PREFIX) or is_operational(event.event_type) or catalog is None:
        return SEND
    kind = catalog.types.get(event.event_type)
    version = _version(event.schema_version)
    schema: Mapping[str, object] | None = None
    if kind is not None and version is not None:
        schema = kind.versions.get(str(version))
    if kind is None or version is None or schema is None:
        what = (f"event type {event.event_type!r}" if kind is None
                else f"schema version {event.schema_version!r} of {event.event_type}")
        if catalog.unknown_types == WARN:
            return Send(SCHEMA_UNKNOWN)
        return Refuse(SCHEMA_UNKNOWN, f"{what} is not in the event-type catalog of tenant {event.tenant_id}",
                      "", event.schema_version)
    try:
        doc = strict_json.loads(event.payload)  # as ingest does: judge only what receivers read alike
    except strict_json.NotStrictJson as exc:
        invalid_pointer, message = "", f"the payload is not strict JSON: {exc}"
    else:
        invalid = validators.get((event.tenant_id, event.event_type, version), schema)(doc)
        if invalid is None:
            return SEND
        invalid_pointer, message = invalid.pointer, invalid.message
    if kind.enforcement == WARN:
        return Send(SCHEMA_INVALID)
    return Refuse(SCHEMA_INVALID, f"payload does not match {event.event_type} {version} at "
                                  f"{invalid_pointer or '/'}: {message}", invalid_pointer, str(version))


def accepts_major(schema_majors: tuple[int, ...], event: EventRecord) -> bool:
    """Whether an endpoint pinned to ``schema_majors`` (empty: any) is sent this event. The
    platform's own events always go; an event whose version is not MAJOR[.MINOR] cannot be shown
    to be of an accepted major, so a pinned endpoint is not sent it."""
    if not schema_majors or event.event_type.startswith(PLATFORM_PREFIX):
        return True
    version = _version(event.schema_version)
    return version is not None and version.major in schema_majors


def skip_reason(schema_majors: tuple[int, ...], event: EventRecord) -> str:
    """Why an endpoint pinned to ``schema_majors`` is not sent this event ("" when it is): the
    reason its history shows for the skipped delivery."""
    if accepts_major(schema_majors, event):
        return ""
    pinned = ", ".join(str(m) for m in sorted(schema_majors))
    version = _version(event.schema_version)
    if version is None:
        return f"schema version {event.schema_version!r} has no major (pinned: {pinned})"
    return f"schema major {version.major} not accepted (pinned: {pinned})"
