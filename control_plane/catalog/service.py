"""The event-type catalog: a tenant's published contract of the events its producers emit.

A type (dotted lower-case name, description, group, status active|deprecated with a sunset,
enforcement reject|warn) has schema versions: a JSON Schema 2020-12 document, examples that must
validate, who added it and when. Rules every method keeps:

* Tenancy: a tenant API key reads its own tenant's catalog only; another tenant's id or type is
  NOT_FOUND (existence is not leaked). Changes need a key granted catalog writing, or the admin
  token naming the tenant.
* A version is added only if its examples validate and, within an existing major, the change
  from the newest minor of that major is additive (core.event_schemas.breaking_changes); the
  refusal names the JSON Pointer. Versions are immutable afterwards (deprecation sets only status
  and sunset), so compiled validators may be cached for ever by (tenant, type, version).
* Every change is one conditional write of the type's row (IF revision = the revision read):
  two concurrent additions to one major cannot both be checked against the same predecessor.
* What reaches the delivery job is the stored row, read back after the write, and a change whose
  publish failed is sent by the republisher (control_plane.publishing.catalog): the job never
  keeps a revision older than Cassandra's.
* ``webhook.*`` names are the platform's own events (ping, challenge) and cannot be catalogued;
  ``webhooks.*`` is reserved for its operational events (core.operational_events), catalogued by
  the platform for every tenant.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from control_plane.catalog.export import asyncapi, openapi
from control_plane.catalog.model import (
    ACTIVE,
    DEPRECATED,
    EventTypeEntry,
    ReplayRuleEntry,
    VersionEntry,
    operational_entries,
)
from control_plane.cursor import Cursors
from control_plane.domain import Endpoint, Page, Principal, Tenant
from control_plane.endpoints.schema_pins import SchemaPins
from control_plane.endpoints.service import ADMIN_ACTOR, page_size
from control_plane.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from control_plane.publishing.catalog import PINS, SETTINGS, TYPE, CatalogPublication, Outbox, Reader
from control_plane.store import HistoryStore
from core import identifiers, operational_events, replay_policy
from core.event_schemas import (
    SchemaDocumentError,
    SchemaVersion,
    SchemaVersionError,
    breaking_changes,
    check_schema,
    compile_validator,
)
from core.fanout import filter_accepts
from core.records import CatalogRecord, CatalogSettingsRecord, CatalogTypeRecord, EndpointStatus, SchemaPinsRecord

log = logging.getLogger(__name__)

REJECT, WARN = "reject", "warn"
POLICIES = (REJECT, WARN)
PLATFORM_PREFIX = "webhook."
MAX_SCHEMA_BYTES = 64 * 1024
MAX_EXAMPLES = 10
MAX_VERSIONS_PER_TYPE = 100
MAX_TEXT = 500
RECENT_WINDOW_MS = 7 * 24 * 3600 * 1000
# Deliveries of one endpoint a deprecation report reads at most (newest first); past it the
# report says it was cut short instead of scanning a busy endpoint's whole week.
SCAN_LIMIT_PER_ENDPOINT = 20_000
CONFLICT_RETRIES = 3
UPDATABLE = ("description", "group", "enforcement", "replay_window")
_CURSOR_KIND = "event-types"


@dataclass(frozen=True)
class CatalogSettings:
    tenant_id: str
    unknown_types: str
    is_default: bool
    replay_rules: tuple[ReplayRuleEntry, ...] = ()  # by pattern


@dataclass(frozen=True)
class Caller:
    """Who acts on which tenant's catalog; ``actor`` is what created_by/updated_by record."""

    tenant_id: str
    actor: str
    may_write: bool


@dataclass(frozen=True)
class RecentReceiver:
    endpoint_id: str
    last_delivery_at_ms: int


@dataclass(frozen=True)
class Deprecated:
    entry: EventTypeEntry
    receivers: tuple[RecentReceiver, ...]
    scan_truncated: bool


class CatalogStore(Outbox, Protocol):
    def get_type(self, tenant_id: str, name: str) -> EventTypeEntry | None: ...
    def list_types(self, tenant_id: str, after_name: str, limit: int | None) -> list[EventTypeEntry]: ...

    def insert_type(self, entry: EventTypeEntry) -> bool:
        """Create the row unless the name exists; False if it did."""
        ...

    def replace_type(self, entry: EventTypeEntry, expected_revision: int) -> bool:
        """Write ``entry`` iff the stored revision is still ``expected_revision``."""
        ...

    def read_unknown_types(self, tenant_id: str) -> tuple[str, int] | None:
        """The tenant's stored policy and its revision (the row's write time); None if not set."""
        ...

    def put_unknown_types(self, tenant_id: str, policy: str, at_ms: int, by: str) -> None: ...

    def introduced_at_ms(self) -> int | None:
        """When this keyspace got the catalog (014_event_catalog.cql); None if not recorded."""
        ...

    def is_writer(self, tenant_id: str, key_id: str) -> bool: ...
    def set_writer(self, tenant_id: str, key_id: str, allowed: bool, at_ms: int) -> None: ...

    def schema_versions_of(self, event_ids: Sequence[str]) -> dict[str, str]:
        """The schema_version each stored event was emitted with (the job's events table)."""
        ...

    def put_schema_pins(self, tenant_id: str, endpoint_id: str, majors: tuple[int, ...], at_ms: int,
                        by: str) -> None: ...
    def get_schema_pins(self, tenant_id: str, endpoint_ids: Sequence[str]) -> dict[str, tuple[int, ...]]: ...

    def read_schema_pins(self, tenant_id: str, endpoint_id: str) -> tuple[tuple[int, ...], int] | None:
        """The endpoint's stored pins and their revision (the row's write time); None if never set."""
        ...

    def list_replay_rules(self, tenant_id: str) -> list[ReplayRuleEntry]: ...

    def put_replay_rule(self, tenant_id: str, rule: ReplayRuleEntry) -> None: ...
    def delete_replay_rule(self, tenant_id: str, pattern: str) -> None: ...

    def occurred_at_of(self, event_ids: Sequence[str]) -> dict[str, int]:
        """When each stored event occurred (the job's events table); missing ids are not known."""
        ...


class TenantsAndEndpoints(Protocol):
    def get_tenant(self, tenant_id: str) -> Tenant | None: ...
    def get_endpoint(self, tenant_id: str, endpoint_id: str) -> Endpoint | None: ...
    def list_endpoints(self, tenant_id: str, after_id: str, limit: int) -> list[Endpoint]: ...


@dataclass(frozen=True)
class CatalogDeps:
    catalog: CatalogStore
    tenants: TenantsAndEndpoints
    history: HistoryStore
    cursors: Cursors
    now_ms: Callable[[], int]
    # Sends the stored records of a change to the delivery job (catalog_publication).
    publication: CatalogPublication


class FilterCheck:
    """Subscriptions meet the catalog: once a tenant has catalogued types, an endpoint filter
    (exact type or ``prefix.*``) that matches none of them is refused, naming the close ones
    (a typo would otherwise subscribe to nothing, silently). ``*`` and the platform's own
    ``webhook.*`` events always pass; tenants without a catalog are not checked."""

    def __init__(self, catalog: CatalogStore) -> None:
        self._catalog = catalog

    def __call__(self, tenant_id: str, filters: Sequence[str]) -> None:
        names = [t.name for t in self._catalog.list_types(tenant_id, "", None)]
        if not names:
            return
        refused = [f for f in filters
                   if f != "*" and not f.startswith(PLATFORM_PREFIX) and not _operational_filter(f)
                   and not any(filter_accepts([f], n) for n in names)]
        if not refused:
            return
        prefixes = sorted({n.rsplit(".", 1)[0] + ".*" for n in names if "." in n})
        parts = []
        for f in refused:
            close = difflib.get_close_matches(f, [*names, *prefixes], n=3, cutoff=0.6)
            parts.append(f"{f!r} matches no type in the tenant's event-type catalog"
                         + (f" (close: {', '.join(close)})" if close else f" (catalogued: {', '.join(names[:10])})"))
        raise InvalidArgument("event_types " + "; ".join(parts))


def _operational_filter(f: str) -> bool:
    """A filter that names operational events (``webhooks.*``, ``webhooks.endpoint.*``, a type
    of core.operational_events): checked against the platform's catalog, not the tenant's."""
    return operational_events.is_operational(f) and any(filter_accepts([f], n) for n in operational_events.CATALOG)


def caller_for(principal: Principal | None, tenant_id: str, catalog: CatalogStore, tenants: TenantsAndEndpoints,
               write: bool) -> Caller:
    """The caller of a catalog method: ``principal`` is the tenant key's (None: the admin token,
    already checked). ``tenant_id`` is the request's field."""
    if principal is None:
        if not tenant_id:
            raise InvalidArgument("tenant_id is required with the admin token")
        if tenants.get_tenant(tenant_id) is None:
            raise NotFound(f"tenant {tenant_id} not found")
        return Caller(tenant_id, ADMIN_ACTOR, may_write=True)
    if tenant_id and tenant_id != principal.tenant_id:
        raise NotFound(f"tenant {tenant_id} not found")
    if write:
        if principal.read_only:
            raise PermissionDenied("this API key is read-only; use a read-write key to make changes")
        if not catalog.is_writer(principal.tenant_id, principal.key_id):
            raise PermissionDenied("this API key may not change the event-type catalog; the admin grants it "
                                   "(webhookctl event-types grant-writer)")
    return Caller(principal.tenant_id, principal.key_id, may_write=write)


def _name(name: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 200 or not identifiers.EVENT_TYPE.fullmatch(name):
        raise InvalidArgument(f"name {name!r} must be a dotted lower-case event type, e.g. invoice.paid")
    return name


def _text(field: str, value: str) -> str:
    if len(value) > MAX_TEXT:
        raise InvalidArgument(f"{field} is longer than {MAX_TEXT} characters")
    return value


def _policy(field: str, value: str, default: str | None = None) -> str:
    value = value or (default or "")
    if value not in POLICIES:
        raise InvalidArgument(f"{field} must be reject or warn")
    return value


def _window(text: str) -> str:
    """A replay window's canonical text; "" leaves it unset."""
    try:
        window = replay_policy.parse_window(text)
    except replay_policy.WindowError as exc:
        raise InvalidArgument(str(exc)) from None
    return "" if window is None else window.text


def _version(text: str) -> SchemaVersion:
    try:
        return SchemaVersion.parse(text)
    except SchemaVersionError as exc:
        raise InvalidArgument(str(exc)) from None


def _json(field: str, text: str) -> Any:
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise InvalidArgument(f"{field} is larger than {MAX_SCHEMA_BYTES} bytes")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidArgument(f"{field} is not JSON: {exc}") from None


class CatalogService:
    def __init__(self, deps: CatalogDeps) -> None:
        self._d = deps
        self._pins = SchemaPins(deps.catalog, deps.publication, deps.now_ms)

    # -- reads -----------------------------------------------------------------------------

    def get_type(self, caller: Caller, name: str) -> EventTypeEntry:
        if operational_events.is_operational(name):
            found = [e for e in operational_entries(caller.tenant_id) if e.name == name]
            if not found:
                raise NotFound(f"event type {name} not found (operational types: webhookctl operations types)")
            return found[0]
        entry = self._d.catalog.get_type(caller.tenant_id, _name(name))
        if entry is None:
            raise NotFound(f"event type {name} not found")
        return entry

    def list_types(self, caller: Caller, size: int, cursor: str) -> Page[EventTypeEntry]:
        limit = page_size(size)
        after = self._d.cursors.decode(_CURSOR_KIND, cursor, tenant=caller.tenant_id)["after"] if cursor else ""
        rows = self._d.catalog.list_types(caller.tenant_id, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = self._d.cursors.encode(_CURSOR_KIND, tenant=caller.tenant_id, after=rows[-1].name) if more else ""
        return Page(tuple(rows), next_cursor)

    def catalog(self, caller: Caller) -> tuple[list[EventTypeEntry], CatalogSettings]:
        return self._d.catalog.list_types(caller.tenant_id, "", None), self.settings(caller.tenant_id)

    def settings(self, tenant_id: str) -> CatalogSettings:
        settings = read_settings(self._d.catalog, self._d.tenants, tenant_id)[0]
        rules = sorted(self._d.catalog.list_replay_rules(tenant_id), key=lambda r: r.pattern)
        return replace(settings, replay_rules=tuple(rules))

    def export(self, caller: Caller, fmt: str) -> str:
        # Receivers' documentation: the platform's operational events are theirs to receive too.
        types = [*self._d.catalog.list_types(caller.tenant_id, "", None), *operational_entries(caller.tenant_id)]
        if fmt == "openapi":
            doc = openapi(caller.tenant_id, types)
        elif fmt == "asyncapi":
            doc = asyncapi(caller.tenant_id, types)
        else:
            raise InvalidArgument("format must be openapi or asyncapi")
        return json.dumps(doc, indent=2, sort_keys=False)

    # -- changes ---------------------------------------------------------------------------

    def create_type(self, caller: Caller, name: str, description: str, group: str, enforcement: str) -> EventTypeEntry:
        name = _name(name)
        if name.startswith(PLATFORM_PREFIX):
            raise InvalidArgument(f"{PLATFORM_PREFIX}* types are the platform's own events and cannot be catalogued")
        if operational_events.is_operational(name):
            raise InvalidArgument(f"{operational_events.PREFIX}* is reserved for the platform's operational events "
                                  f"({', '.join(sorted(operational_events.CATALOG))}); choose another name")
        now = self._d.now_ms()
        entry = EventTypeEntry(caller.tenant_id, name, _text("description", description), _text("group", group),
                               ACTIVE, None, _policy("enforcement", enforcement, REJECT), now, now, caller.actor, 1)

        def insert() -> EventTypeEntry:
            if self._d.catalog.insert_type(entry):
                log.info("catalog %s: type %s created by %s", caller.tenant_id, name, caller.actor)
                return entry
            existing = self._d.catalog.get_type(caller.tenant_id, name)
            if existing is not None and (existing.description, existing.group, existing.enforcement) == (
                    entry.description, entry.group, entry.enforcement):
                return existing  # a retried create: published again, as its publish may have failed
            raise FailedPrecondition(f"event type {name} already exists; update it instead")

        return self._d.publication.change(caller.tenant_id, TYPE, name, insert)

    def update_type(self, caller: Caller, name: str, values: Mapping[str, str]) -> EventTypeEntry:
        unknown = set(values) - set(UPDATABLE)
        if unknown or not values:
            raise InvalidArgument(f"update_fields must name some of {', '.join(UPDATABLE)}")
        changes: dict[str, str] = {}
        for field, value in values.items():
            if field == "enforcement":
                changes[field] = _policy(field, value)
            elif field == "replay_window":
                changes[field] = _window(value)
            else:
                changes[field] = _text(field, value)
        return self._change(caller, name, lambda e: replace(e, **changes))  # type: ignore[arg-type]

    def add_version(self, caller: Caller, name: str, version_text: str, schema_json: str,
                    examples_json: Sequence[str]) -> EventTypeEntry:
        version = _version(version_text)
        schema = _json("schema_json", schema_json)
        try:
            check_schema(schema)
        except SchemaDocumentError as exc:
            raise InvalidArgument(f"schema_json is not a JSON Schema 2020-12 document at {exc}") from None
        if not examples_json or len(examples_json) > MAX_EXAMPLES:
            raise InvalidArgument(f"examples_json must hold 1 to {MAX_EXAMPLES} example payloads")
        examples = tuple(_json(f"examples_json[{i}]", text) for i, text in enumerate(examples_json))
        validate = compile_validator(schema)
        for i, example in enumerate(examples):
            invalid = validate(example)
            if invalid is not None:
                raise InvalidArgument(f"examples_json[{i}] does not validate against the schema at {invalid}")

        def add(entry: EventTypeEntry) -> EventTypeEntry:
            existing = entry.version(version)
            if existing is not None:
                if existing.schema == schema and existing.examples == examples:
                    return entry  # a retried addition
                raise FailedPrecondition(f"version {version} of {name} exists; versions never change once added")
            if len(entry.versions) >= MAX_VERSIONS_PER_TYPE:
                raise FailedPrecondition(f"{name} has {MAX_VERSIONS_PER_TYPE} versions; deprecate the type and "
                                         "start a new one")
            before = entry.newest_in_major(version.major)
            if before is not None:
                if version < before.version:
                    raise FailedPrecondition(f"version {version} is older than {before.version}, the newest of "
                                             f"major {version.major}; add a newer minor")
                broken = breaking_changes(before.schema, schema)
                if broken:
                    raise FailedPrecondition(
                        f"version {version} is not compatible with {before.version} at {broken[0].pointer or '/'}: "
                        f"{broken[0].detail} ({broken[0].rule}); within a major only additive changes are allowed "
                        f"-- publish it as {max(_max_major(entry), version.major) + 1}.0"
                        + (f" ({len(broken) - 1} more: {', '.join(b.pointer for b in broken[1:])})"
                           if len(broken) > 1 else ""))
            new = VersionEntry(version, schema, examples, self._d.now_ms(), caller.actor)
            return replace(entry, versions=tuple(sorted((*entry.versions, new), key=lambda v: v.version)))

        return self._change(caller, name, add)

    def deprecate(self, caller: Caller, name: str, version_text: str, sunset_at_ms: int | None) -> Deprecated:
        if sunset_at_ms is None:
            raise InvalidArgument("sunset_at is required: when producers stop emitting it")
        version = _version(version_text) if version_text else None

        def mark(entry: EventTypeEntry) -> EventTypeEntry:
            if version is None:
                return replace(entry, status=DEPRECATED, sunset_at_ms=sunset_at_ms)
            if entry.version(version) is None:
                raise NotFound(f"version {version} of {name} not found")
            return replace(entry, versions=tuple(replace(v, status=DEPRECATED, sunset_at_ms=sunset_at_ms)
                                                 if v.version == version else v for v in entry.versions))

        entry = self._change(caller, name, mark)
        receivers, truncated = self.recent_receivers(caller.tenant_id, entry.name, version)
        log.info("catalog %s: %s %s deprecated by %s (sunset %s); %d endpoint(s) received it in 7 days",
                 caller.tenant_id, name, version or "(all versions)", caller.actor, sunset_at_ms, len(receivers))
        return Deprecated(entry, tuple(receivers), truncated)

    def set_unknown_types(self, caller: Caller, policy: str) -> CatalogSettings:
        if not caller.may_write:
            raise PermissionDenied("this call needs catalog write permission")
        policy = _policy("unknown_types", policy)
        self._d.publication.change(caller.tenant_id, SETTINGS, "", lambda: self._d.catalog.put_unknown_types(
            caller.tenant_id, policy, self._d.now_ms(), caller.actor))
        return self.settings(caller.tenant_id)

    def set_replay_rule(self, caller: Caller, pattern: str, window: str) -> CatalogSettings:
        """Set (window "" removes) the tenant's replay window for types matching ``pattern`` that
        have no window of their own. Applies to replays asked for from now on."""
        if not caller.may_write:
            raise PermissionDenied("this call needs catalog write permission")
        try:
            pattern = replay_policy.check_pattern(pattern)
        except replay_policy.WindowError as exc:
            raise InvalidArgument(str(exc)) from None
        text = _window(window)
        if text:
            self._d.catalog.put_replay_rule(caller.tenant_id, ReplayRuleEntry(pattern, text, self._d.now_ms(),
                                                                              caller.actor))
        else:
            self._d.catalog.delete_replay_rule(caller.tenant_id, pattern)
        log.info("catalog %s: replay rule %s set to %s by %s", caller.tenant_id, pattern, text or "(removed)",
                 caller.actor)
        return self.settings(caller.tenant_id)

    def set_schema_majors(self, principal: Principal, endpoint_id: str, majors: Sequence[int]) -> tuple[int, ...]:
        """Pin an endpoint to schema majors (empty: all), for its tenant's read-write key."""
        if principal.read_only:
            raise PermissionDenied("this API key is read-only; use a read-write key to make changes")
        endpoint = self._d.tenants.get_endpoint(principal.tenant_id, endpoint_id) if identifiers.ID.fullmatch(
            endpoint_id or "") else None
        if endpoint is None or endpoint.status is EndpointStatus.DELETED:
            raise NotFound(f"endpoint {endpoint_id} not found")
        return self._pins.set(principal.tenant_id, endpoint_id, majors, principal.key_id)

    def set_writer(self, tenant_id: str, key_id: str, allowed: bool) -> None:
        if self._d.tenants.get_tenant(tenant_id) is None:
            raise NotFound(f"tenant {tenant_id} not found")
        if not identifiers.ID.fullmatch(key_id or ""):
            raise InvalidArgument("key_id is required")
        self._d.catalog.set_writer(tenant_id, key_id, allowed, self._d.now_ms())

    # -- the deprecation report ------------------------------------------------------------

    def recent_receivers(self, tenant_id: str, name: str,
                         version: SchemaVersion | None) -> tuple[list[RecentReceiver], bool]:
        """Endpoints sent ``name`` (at ``version``; None: any) in the last 7 days, newest first per
        endpoint: the tenant's endpoints whose filter accepts the type, each read from its
        delivery history newest first until the first match."""
        now = self._d.now_ms()
        found: list[RecentReceiver] = []
        truncated = False
        for endpoint in self._subscribers(tenant_id, name):
            deliveries = self._d.history.iter_endpoint_deliveries(
                tenant_id, endpoint.endpoint_id, now - RECENT_WINDOW_MS, now + 1, None)
            hit, cut = self._first_match(_limited(deliveries, SCAN_LIMIT_PER_ENDPOINT), name, version)
            truncated = truncated or cut
            if hit is not None:
                found.append(RecentReceiver(endpoint.endpoint_id, hit))
        return found, truncated

    def _subscribers(self, tenant_id: str, name: str) -> Iterator[Endpoint]:
        after = ""
        while True:
            page = self._d.tenants.list_endpoints(tenant_id, after, 100)
            for e in page:
                if e.status is not EndpointStatus.DELETED and filter_accepts(e.spec.event_types, name):
                    yield e
            if len(page) < 100:
                return
            after = page[-1].endpoint_id

    def _first_match(self, deliveries: Iterator[Any], name: str,
                     version: SchemaVersion | None) -> tuple[int | None, bool]:
        """(creation time of the newest matching delivery, or None; whether the scan was cut
        short before finding one). Versions are looked up a batch of events at a time."""
        batch: list[Any] = []
        for d in deliveries:
            if d is _CUT:
                hit = self._match_version(batch, version)
                return hit, hit is None
            if d.event_type != name:
                continue
            if version is None:
                return int(d.created_at_ms), False
            batch.append(d)
            if len(batch) >= 128:
                hit = self._match_version(batch, version)
                if hit is not None:
                    return hit, False
                batch = []
        return self._match_version(batch, version), False

    def _match_version(self, batch: Sequence[Any], version: SchemaVersion | None) -> int | None:
        if not batch or version is None:
            return None
        emitted = self._d.catalog.schema_versions_of([d.event_id for d in batch])
        for d in batch:  # newest first
            if _same_version(emitted.get(d.event_id), version):
                return int(d.created_at_ms)
        return None

    # -- helpers ---------------------------------------------------------------------------

    def _change(self, caller: Caller, name: str, apply: Callable[[EventTypeEntry], EventTypeEntry]) -> EventTypeEntry:
        if not caller.may_write:
            raise PermissionDenied("this call needs catalog write permission")
        name = _name(name)

        def write() -> EventTypeEntry:
            for _ in range(CONFLICT_RETRIES):
                current = self._d.catalog.get_type(caller.tenant_id, name)
                if current is None:
                    raise NotFound(f"event type {name} not found")
                changed = apply(current)
                if changed == current:
                    return current  # a retry: published again, as the first call's publish may have failed
                changed = replace(changed, updated_at_ms=self._d.now_ms(), updated_by=caller.actor,
                                  revision=current.revision + 1)
                if self._d.catalog.replace_type(changed, current.revision):
                    return changed
            raise Aborted(f"event type {name} kept changing concurrently; retry")

        return self._d.publication.change(caller.tenant_id, TYPE, name, write)


def read_settings(catalog: CatalogStore, tenants: TenantsAndEndpoints, tenant_id: str) -> tuple[CatalogSettings, int]:
    """A tenant's settings and their revision (0 for the default, which never changes)."""
    stored = catalog.read_unknown_types(tenant_id)
    if stored is not None:
        return CatalogSettings(tenant_id, stored[0], is_default=False), stored[1]
    tenant = tenants.get_tenant(tenant_id)
    introduced = catalog.introduced_at_ms()
    # Tenants that existed before the catalog emit uncatalogued events today: warn, so an
    # upgrade drops nothing. Tenants created since start strict.
    existing = tenant is not None and introduced is not None and tenant.created_at_ms < introduced
    return CatalogSettings(tenant_id, WARN if existing else REJECT, is_default=True), 0


def stored_records(catalog: CatalogStore, tenants: TenantsAndEndpoints, now_ms: Callable[[], int]) -> Reader:
    """What is stored of a catalog key, as the records the delivery job reads
    (control_plane.publishing.catalog): a type goes with its tenant's settings, so fan-out has
    both once the tenant has a catalog."""

    def settings_record(tenant_id: str, now: int) -> CatalogSettingsRecord:
        settings, revision = read_settings(catalog, tenants, tenant_id)
        return CatalogSettingsRecord(tenant_id, settings.unknown_types, now, revision)

    def read(tenant_id: str, kind: str, name: str) -> Sequence[CatalogRecord]:
        now = now_ms()
        if kind == TYPE:
            entry = catalog.get_type(tenant_id, name)
            return [] if entry is None else [type_record(entry, now), settings_record(tenant_id, now)]
        if kind == SETTINGS:
            return [settings_record(tenant_id, now)]
        if kind == PINS:
            pins = catalog.read_schema_pins(tenant_id, name)
            return [] if pins is None else [SchemaPinsRecord(tenant_id, name, pins[0], now, pins[1])]
        raise ValueError(f"unknown catalog key kind {kind!r}")

    return read


def type_record(entry: EventTypeEntry, now_ms: int) -> CatalogTypeRecord:
    """What fan-out needs of a type: its enforcement and every version's schema (deprecated
    versions too: their events are still checked until producers stop emitting them)."""
    return CatalogTypeRecord(entry.tenant_id, entry.name, entry.enforcement, entry.revision,
                             {str(v.version): dict(v.schema) for v in entry.versions}, now_ms)


_CUT = object()


def _limited(items: Iterable[Any], limit: int) -> Iterator[Any]:
    """``items`` up to ``limit``, then the marker _CUT if there were more."""
    for i, item in enumerate(items):
        if i >= limit:
            yield _CUT
            return
        yield item


def _same_version(text: str | None, version: SchemaVersion) -> bool:
    try:
        return text is not None and SchemaVersion.parse(text) == version
    except SchemaVersionError:
        return False


def _max_major(entry: EventTypeEntry) -> int:
    return max((v.version.major for v in entry.versions), default=0)
