"""Credentials: tenant API keys and the admin token.

An API key is ``whk_`` + 32 random bytes (base64url). Only its SHA-256 is stored: a 256-bit
random key needs no slow hash, and a database leak does not yield usable keys. The lookup is by
hash, and the stored hash is compared again in constant time so no code path compares a secret
with ``==``. Keys travel in gRPC metadata as ``authorization: Bearer <key>``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable

from control_plane.domain import Principal
from control_plane.errors import PermissionDenied, Unauthenticated
from control_plane.store import EndpointStore
from core.secrets import constant_time_equals

API_KEY_PREFIX = "whk_"
API_KEY_BYTES = 32
ADMIN_PRINCIPAL = "admin"


def new_api_key(random_bytes: bytes) -> str:
    if len(random_bytes) != API_KEY_BYTES:
        raise ValueError(f"an API key needs {API_KEY_BYTES} random bytes")
    return API_KEY_PREFIX + base64.urlsafe_b64encode(random_bytes).decode().rstrip("=")


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str:
    """The token of the ``authorization: Bearer ...`` header; Unauthenticated if missing."""
    for name, value in metadata:
        if name.lower() != "authorization":
            continue
        text = value.decode() if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        break
    raise Unauthenticated("missing credential: send metadata 'authorization: Bearer <api key>'")


class Authenticator:
    def __init__(self, store: EndpointStore, admin_token: str) -> None:
        self._store = store
        self._admin_token = admin_token

    def _is_admin(self, token: str) -> bool:
        return constant_time_equals(token, self._admin_token)

    def admin(self, metadata: Iterable[tuple[str, str | bytes]]) -> None:
        token = bearer_token(metadata)
        if self._is_admin(token):
            return
        if self._tenant_key(token) is not None:
            raise PermissionDenied("this call needs the admin credential, not a tenant API key")
        raise Unauthenticated("unknown or revoked credential")

    def tenant(self, metadata: Iterable[tuple[str, str | bytes]]) -> Principal:
        token = bearer_token(metadata)
        principal = self._tenant_key(token)
        if principal is not None:
            return principal
        if self._is_admin(token):
            # Admin acts on tenants and keys, never inside a tenant: that needs the tenant's key.
            raise PermissionDenied("the admin credential cannot call tenant APIs; use an API key")
        raise Unauthenticated("unknown or revoked API key")

    def _tenant_key(self, token: str) -> Principal | None:
        if not token.startswith(API_KEY_PREFIX):
            return None
        presented = hash_api_key(token)
        key = self._store.get_api_key(presented)
        if key is None or not constant_time_equals(key.key_hash, presented):
            return None
        if key.revoked_at_ms is not None:
            return None
        return Principal(tenant_id=key.tenant_id, key_id=key.key_id, read_only=key.read_only)
