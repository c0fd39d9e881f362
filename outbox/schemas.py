"""Validate an event against its tenant's event-type catalog before its outbox row is written.

::

    from outbox.catalog_client import GrpcCatalog
    schemas = SchemaGuard(GrpcCatalog("cp.internal:50051", api_key=os.environ["WEBHOOKS_API_KEY"]))
    with psycopg.connect(dsn) as conn:
        write_event(conn, "acme", "invoice.paid", payload, schema_version="2.1", schemas=schemas)

**Where the catalog comes from.** The control plane's ``EventCatalog.GetCatalog`` (gRPC, the
tenant's API key; reading needs no catalog permission): one call returns every type, version and
schema of the tenant. A producer never reads the control plane's Cassandra tables -- they are
its private storage and the API is where tenancy is enforced.

**How a producer learns of new versions.** Each tenant's catalog is cached for ``ttl_s`` (30 s)
and refetched after it; an event whose type or version is not in the cached copy refetches at
once (at most once per ``miss_refetch_s``, 1 s), so a version added a moment ago is usable by the
next event rather than 30 s later. Versions never change once added, so a compiled validator is
kept for the life of the process (core.event_schemas.ValidatorCache).

**What is refused** (:class:`~outbox.producer.OutboxError`, before any SQL): a payload that does
not match its version's schema when the type's enforcement is ``reject`` (the message names the
JSON Pointer); a type or version missing from the catalog when the tenant's ``unknown_types`` is
``reject``; a payload that is not strict JSON (core.strict_json), whatever the enforcement.
With ``warn`` the event is written and a warning logged (the job delivers it and counts it).
``webhook.*`` types are the platform's own and are not checked, and neither are the events of a
tenant with no catalog yet (no type, no stored setting), which the job sends unchecked.

**When the control plane cannot be reached** the last fetched catalog keeps being used; with
none at all the event is written unchecked and a warning logged: producers keep committing while
the control plane is down (as they do while Kafka is), and the delivery job validates every
event again at fan-out, so nothing invalid reaches a receiver either way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from core import strict_json
from core.event_schemas import SchemaVersion, SchemaVersionError, ValidatorCache

log = logging.getLogger(__name__)

PLATFORM_PREFIX = "webhook."


class SchemaRefused(ValueError):
    """The catalog refuses the event (outbox.producer turns it into OutboxError)."""


class CatalogUnavailable(Exception):
    """The catalog could not be fetched."""


@dataclass(frozen=True)
class CatalogType:
    enforcement: str  # reject | warn
    schemas: Mapping[SchemaVersion, Mapping[str, Any]]


@dataclass(frozen=True)
class TenantCatalog:
    types: Mapping[str, CatalogType]
    unknown_types: str  # reject | warn
    # False while the tenant has no type and no stored setting: the job then has no catalog for it
    # and sends its events unchecked (core.schema_check), so nothing is refused here either.
    published: bool = True


class CatalogSource(Protocol):
    def fetch(self, tenant_id: str) -> TenantCatalog:
        """The tenant's whole catalog; CatalogUnavailable if it cannot be had now."""
        ...


@dataclass
class _Cached:
    tenant_id: str
    catalog: TenantCatalog | None
    fetched_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)


class SchemaGuard:
    """Checks events against their tenant's catalog; thread-safe, one per producer process."""

    def __init__(self, source: CatalogSource, *, ttl_s: float = 30.0, miss_refetch_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._ttl_s = ttl_s
        self._miss_refetch_s = miss_refetch_s
        self._clock = clock
        self._validators = ValidatorCache()
        self._tenants: dict[str, _Cached] = {}
        self._lock = threading.Lock()

    def check(self, tenant_id: str, event_type: str, schema_version: str, payload: bytes) -> None:
        """Raise SchemaRefused if the catalog refuses the event; return if it may be written."""
        if event_type.startswith(PLATFORM_PREFIX):
            return
        try:
            version = SchemaVersion.parse(schema_version)
        except SchemaVersionError:
            version = None
        entry = self._entry(tenant_id)
        catalog = self._catalog(entry, force=False)
        if catalog is not None and not _known(catalog, event_type, version):
            catalog = self._catalog(entry, force=True)  # maybe added a moment ago
        if catalog is None:
            log.warning("event-type catalog of %s unavailable and never fetched: %s %s written unchecked "
                        "(the delivery job validates it)", tenant_id, event_type, schema_version)
            return
        if not catalog.published:
            return
        kind = catalog.types.get(event_type)
        if kind is None or version is None or version not in kind.schemas:
            what = (f"event type {event_type!r}" if kind is None else f"schema version {schema_version!r} of "
                    f"{event_type}" + ("" if version is not None else " (not MAJOR or MAJOR.MINOR)"))
            self._refuse_or_warn(catalog.unknown_types, f"{what} is not in the catalog of tenant {tenant_id}")
            return
        try:
            doc = strict_json.loads(payload)
        except strict_json.NotStrictJson as exc:
            # Whatever the enforcement: the job dead-letters it at ingest, before any catalog check.
            raise SchemaRefused(f"payload is not strict JSON: {exc}") from None
        invalid = self._validators.get((tenant_id, event_type, version), kind.schemas[version])(doc)
        if invalid is not None:
            self._refuse_or_warn(kind.enforcement, f"payload does not match {event_type} {version} at "
                                                   f"{invalid.pointer or '/'}: {invalid.message}")

    @staticmethod
    def _refuse_or_warn(policy: str, message: str) -> None:
        if policy == "warn":
            log.warning("%s (written: the catalog says warn)", message)
            return
        raise SchemaRefused(message)

    def _entry(self, tenant_id: str) -> _Cached:
        with self._lock:
            entry = self._tenants.get(tenant_id)
            if entry is None:
                entry = self._tenants[tenant_id] = _Cached(tenant_id, None, float("-inf"))
            return entry

    def _catalog(self, entry: _Cached, force: bool) -> TenantCatalog | None:
        with entry.lock:
            age = self._clock() - entry.fetched_at
            if age < (self._miss_refetch_s if force else self._ttl_s):
                return entry.catalog
            try:
                entry.catalog = self._source.fetch(entry.tenant_id)
            except CatalogUnavailable as exc:
                log.warning("event-type catalog of %s not refreshed (%s); using the last copy", entry.tenant_id, exc)
            entry.fetched_at = self._clock()
            return entry.catalog


def _known(catalog: TenantCatalog, event_type: str, version: SchemaVersion | None) -> bool:
    kind = catalog.types.get(event_type)
    return kind is not None and version is not None and version in kind.schemas
