"""The console's event-catalog pages: the tenant's event types, their versions, schemas and
examples, deprecations, and which of them its endpoints (the portal's receivers too) may
subscribe to. Read-only, for the session's tenant only: the catalog is read under the
principal's tenant id, never one from the request."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web

from control_plane import errors
from control_plane.catalog.model import DEPRECATED, EventTypeEntry
from control_plane.catalog.service import CatalogStore
from control_plane.console.context import CONSOLE, blocking
from core.fanout import filter_accepts

TYPES_SHOWN = 500


@dataclass(frozen=True)
class TypeRow:
    name: str
    group: str
    status: str  # active | deprecated
    versions: tuple[str, ...]  # oldest first
    deprecated_versions: tuple[str, ...]
    sunset_at_ms: int | None
    subscribable: bool  # the tenant's endpoints may subscribe to it (admin's allowed list)


def subscribable(name: str, allowed: Sequence[str] | None) -> bool:
    """None: the admin set no restriction."""
    return allowed is None or filter_accepts(list(allowed), name)


def rows(types: Sequence[EventTypeEntry], allowed: Sequence[str] | None) -> list[TypeRow]:
    return [TypeRow(t.name, t.group, t.status, tuple(str(v.version) for v in t.versions),
                    tuple(str(v.version) for v in t.versions if v.status == DEPRECATED), t.sunset_at_ms,
                    subscribable(t.name, allowed))
            for t in sorted(types, key=lambda t: t.name)]


def pretty(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


def add_routes(app: web.Application, base: str) -> None:
    app.router.add_get(f"{base}/event-types", _types)
    app.router.add_get(f"{base}/event-types/{{name}}", _type)


def _store(request: web.Request) -> CatalogStore:
    store = request.app[CONSOLE].services.catalog
    if store is None:
        raise errors.Unavailable("the event catalog is not available on this console")
    return store


async def _types(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    store = _store(request)
    types = await blocking(store.list_types, principal.tenant_id, "", TYPES_SHOWN + 1)
    tenant = await blocking(c.services.store.get_tenant, principal.tenant_id)
    allowed = tenant.allowed_event_types if tenant is not None else None
    return c.render(request, "event_types.html", types=rows(types[:TYPES_SHOWN], allowed),
                    more=len(types) > TYPES_SHOWN, allowed=allowed)


async def _type(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    store = _store(request)
    name = request.match_info["name"]
    entry = await blocking(store.get_type, principal.tenant_id, name)
    if entry is None:
        raise errors.NotFound(f"event type {name} not found")
    tenant = await blocking(c.services.store.get_tenant, principal.tenant_id)
    allowed = tenant.allowed_event_types if tenant is not None else None
    versions = [{"version": str(v.version), "status": v.status, "sunset_at_ms": v.sunset_at_ms,
                 "created_at_ms": v.created_at_ms, "created_by": v.created_by, "schema": pretty(v.schema),
                 "examples": [pretty(e) for e in v.examples]} for v in reversed(entry.versions)]
    return c.render(request, "event_type.html", t=entry, versions=versions,
                    subscribable=subscribable(entry.name, allowed))
