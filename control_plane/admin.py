"""Tenants and their API keys; callable only with the admin credential (checked by the servicer)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from control_plane import validation
from control_plane.auth import API_KEY_BYTES, hash_api_key, new_api_key
from control_plane.domain import ApiKey, Tenant
from control_plane.errors import AlreadyExists, InvalidArgument, NotFound
from control_plane.store import EndpointStore
from core import identifiers
from core.fanout import filter_covered
from core.records import EndpointStatus

log = logging.getLogger(__name__)

_TENANT_ID = identifiers.TENANT_ID
MAX_NAME_CHARS = 200


@dataclass(frozen=True)
class IssuedKey:
    key: ApiKey
    plaintext: str


class AdminService:
    def __init__(
        self,
        store: EndpointStore,
        now_ms: Callable[[], int],
        random_bytes: Callable[[int], bytes],
        verify_endpoints_by_default: bool = False,
    ) -> None:
        self._store = store
        self._now_ms = now_ms
        self._random = random_bytes
        # Production mode: new tenants' endpoints answer an ownership challenge unless told otherwise.
        self._verify_default = verify_endpoints_by_default

    def create_tenant(self, tenant_id: str, name: str, verify_endpoints: bool | None = None) -> Tenant:
        tenant_id = tenant_id or "t_" + uuid.UUID(bytes=self._random(16)).hex[:20]
        if not _TENANT_ID.fullmatch(tenant_id):
            raise InvalidArgument(
                "tenant_id must be 3-64 characters: lowercase letters, digits, '_' or '-', "
                "starting with a letter or digit"
            )
        if len(name) > MAX_NAME_CHARS:
            raise InvalidArgument(f"name is longer than {MAX_NAME_CHARS} characters")
        verify = self._verify_default if verify_endpoints is None else verify_endpoints
        tenant = Tenant(tenant_id, name, self._now_ms(), verify_endpoints=verify)
        if not self._store.create_tenant(tenant):
            raise AlreadyExists(f"tenant {tenant_id} already exists")
        log.info("tenant %s created", tenant_id)
        return tenant

    def create_api_key(self, tenant_id: str, description: str, read_only: bool) -> IssuedKey:
        if not tenant_id or self._store.get_tenant(tenant_id) is None:
            raise NotFound(f"tenant {tenant_id or '(empty)'} not found")
        if len(description) > MAX_NAME_CHARS:
            raise InvalidArgument(f"description is longer than {MAX_NAME_CHARS} characters")
        plaintext = new_api_key(self._random(API_KEY_BYTES))
        key = ApiKey(
            key_id="key_" + uuid.UUID(bytes=self._random(16)).hex[:20],
            tenant_id=tenant_id,
            key_hash=hash_api_key(plaintext),
            description=description,
            read_only=read_only,
            created_at_ms=self._now_ms(),
        )
        self._store.put_api_key(key)
        log.info("api key %s issued for tenant %s (read_only=%s)", key.key_id, tenant_id, read_only)
        return IssuedKey(key, plaintext)

    def set_event_types(self, tenant_id: str, types: Sequence[str], unrestricted: bool) -> tuple[Tenant, list[str]]:
        """Restrict the event types the tenant's endpoints may subscribe to (or lift the
        restriction). Endpoints are checked when created or changed; the ones whose filters the
        new list no longer covers are returned, for the admin to follow up -- they are not changed."""
        if unrestricted and types:
            raise InvalidArgument("give allowed_event_types or unrestricted, not both")
        allowed = None if unrestricted else validation.event_types(types)
        if not tenant_id or not self._store.set_allowed_event_types(tenant_id, allowed):
            raise NotFound(f"tenant {tenant_id or '(empty)'} not found")
        tenant = self._store.get_tenant(tenant_id)
        assert tenant is not None
        outside: list[str] = []
        after = ""
        while allowed is not None and (batch := self._store.list_endpoints(tenant_id, after, 100)):
            after = batch[-1].endpoint_id
            outside += [e.endpoint_id for e in batch if e.status is not EndpointStatus.DELETED
                        and not all(filter_covered(f, allowed) for f in e.spec.event_types)]
        log.info("tenant %s event types %s; %d endpoint(s) outside them", tenant_id,
                 "unrestricted" if allowed is None else ",".join(allowed), len(outside))
        return tenant, outside

    def revoke_api_key(self, tenant_id: str, key_id: str) -> None:
        key = self._store.get_api_key_by_id(tenant_id, key_id) if tenant_id and key_id else None
        if key is None:
            raise NotFound(f"api key {key_id or '(empty)'} of tenant {tenant_id or '(empty)'} not found")
        if key.revoked_at_ms is None:
            self._store.revoke_api_key(key, self._now_ms())
            log.info("api key %s of tenant %s revoked", key_id, tenant_id)
