"""Console sessions and CSRF tokens: signed cookies, no server-side session table.

A session is a small JSON document (who, which tenant, until when) with an HMAC-SHA256 tag under
a key derived from the master key, so every control-plane replica reads every replica's cookies
and a tampered cookie is refused before anything else. Nothing secret is inside: a tenant session
names its API key by id (the key itself is never stored, not even in the cookie), and each request
re-checks that the key is not revoked.

Every visitor gets a session, an anonymous one before logging in, so that the login form has a
CSRF token too; logging in replaces it with a new ``sid`` (no session fixation). A CSRF token is
an HMAC of the session's ``sid``: a form rendered for one session is refused for any other.

`now_ms` is an argument everywhere, so the expiry rules are tested with fixed times.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import json
from dataclasses import asdict, dataclass

from core.secrets import constant_time_equals, derive_key

COOKIE_NAME = "webhooks_console"
_LABEL = b"webhooks.console-session/v1"
_TAG_BYTES = 32
SID_BYTES = 16
ANONYMOUS_TTL_MS = 3600 * 1000
LOGIN_TTL_MS = 8 * 3600 * 1000


class Kind(enum.StrEnum):
    ANONYMOUS = "anonymous"
    TENANT = "tenant"  # logged in with a tenant API key
    PORTAL = "portal"  # opened by a one-time portal link: one tenant, no key
    ADMIN = "admin"  # logged in with the admin token: the operator view only


@dataclass(frozen=True)
class Session:
    sid: str
    kind: Kind
    expires_at_ms: int
    tenant_id: str = ""
    key_id: str = ""  # the API key id (tenant), the portal link id (portal), "admin"
    read_only: bool = False

    @property
    def is_tenant(self) -> bool:
        """A tenant's view (API key or portal link): everything inside one tenant."""
        return self.kind in (Kind.TENANT, Kind.PORTAL)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionCodec:
    def __init__(self, master_key: bytes) -> None:
        self._key = derive_key(master_key, _LABEL)

    def encode(self, session: Session) -> str:
        body = _b64(json.dumps(asdict(session), separators=(",", ":"), sort_keys=True).encode())
        return f"{body}.{self._tag(body)}"

    def decode(self, cookie: str, now_ms: int) -> Session | None:
        """The session in a cookie; None if it is malformed, forged or expired."""
        body, _, tag = cookie.partition(".")
        if not body or not constant_time_equals(tag, self._tag(body)):
            return None
        try:
            fields = json.loads(_unb64(body))
            session = Session(sid=str(fields["sid"]), kind=Kind(fields["kind"]),
                              expires_at_ms=int(fields["expires_at_ms"]), tenant_id=str(fields["tenant_id"]),
                              key_id=str(fields["key_id"]), read_only=bool(fields["read_only"]))
        except (binascii.Error, ValueError, KeyError, TypeError):
            return None
        return session if session.expires_at_ms > now_ms else None

    def csrf_token(self, session: Session) -> str:
        return _b64(hmac.new(self._key, b"csrf\n" + session.sid.encode(), hashlib.sha256).digest())

    def csrf_ok(self, session: Session, presented: str) -> bool:
        return bool(presented) and constant_time_equals(presented, self.csrf_token(session))

    def _tag(self, body: str) -> str:
        return _b64(hmac.new(self._key, b"session\n" + body.encode(), hashlib.sha256).digest()[:_TAG_BYTES])


def new_sid(random_bytes: bytes) -> str:
    if len(random_bytes) != SID_BYTES:
        raise ValueError(f"a session id needs {SID_BYTES} random bytes")
    return _b64(random_bytes)
