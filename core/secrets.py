"""Signing secrets at rest, comparison and redaction.

A signing secret (``whsec_...``) leaves the platform exactly once, in the response that creates
or rotates it. Everywhere else -- Cassandra, the compacted endpoints topic, Flink state -- it is
AES-256-GCM ciphertext under the master key. The associated data binds each ciphertext to its
(tenant_id, endpoint_id, key_version): copying one endpoint's ciphertext onto another endpoint, or
replaying an old version as the current one, fails authentication instead of signing with the
wrong key.

Pure apart from the ``cryptography`` primitive: the nonce is an argument (callers pass
``os.urandom(NONCE_BYTES)``), so tests pin the output. Random 96-bit nonces are safe for far more
secrets than one master key will ever encrypt (NIST SP 800-38D's 2**32 bound).

(The module shadows nothing: it is ``core.secrets``, and absolute imports still reach the
standard library's ``secrets``.)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MASTER_KEY_BYTES = 32
NONCE_BYTES = 12
# First byte of every ciphertext. v1: no key id (sealed before master keys had ids); v2: the id
# of the master key that sealed it follows, so a keyring of several keys decrypts it directly.
_FORMAT_V1 = b"\x01"
_FORMAT_V2 = b"\x02"
_KEY_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


@dataclass(frozen=True)
class Keyring:
    """The master keys by id: ``current_id`` seals new secrets; the others (retired, being
    rotated away from) only open what they sealed, until `webhookctl master-key reencrypt` has
    moved every secret to the current key and they are removed from the settings."""

    current_id: str
    keys: Mapping[str, bytes]

    def __post_init__(self) -> None:
        for key_id, key in self.keys.items():
            if not _KEY_ID.fullmatch(key_id):
                raise ValueError(f"master key id {key_id!r}: 1-32 of a-z, 0-9, '_' or '-'")
            if len(key) != MASTER_KEY_BYTES:
                raise ValueError(f"master key {key_id!r} must be {MASTER_KEY_BYTES} bytes, got {len(key)}")
        if self.current_id not in self.keys:
            raise ValueError(f"current master key id {self.current_id!r} is not in the keyring")

    @classmethod
    def single(cls, key: bytes, key_id: str = "k1") -> Keyring:
        return cls(key_id, {key_id: key})

    @property
    def current(self) -> bytes:
        return self.keys[self.current_id]

    def __repr__(self) -> str:  # never the keys
        return f"Keyring(current_id={self.current_id!r}, ids={sorted(self.keys)})"


def derive_key(master_key: bytes, label: bytes) -> bytes:
    """A key of its own for one purpose (page cursors, target proofs, challenges), HMAC-SHA256 of
    a label under the master key: what it signs never reveals anything about the master key."""
    return hmac.new(master_key, label, hashlib.sha256).digest()


def sealed_with(ciphertext_b64: str) -> str | None:
    """The id of the master key a ciphertext was sealed with; None for one sealed before ids."""
    try:
        raw = base64.b64decode(ciphertext_b64, validate=True)
    except binascii.Error:
        return None
    if raw[:1] != _FORMAT_V2 or len(raw) < 2:
        return None
    return raw[2:2 + raw[1]].decode("ascii", "replace")
_AAD_LABEL = "webhooks.signing-secret/v1"

# Standard and URL-safe base64 alphabets; a secret cut mid-way (e.g. in a truncated log line) is
# still masked because the match needs no particular length.
_WHSEC = re.compile(r"whsec_[A-Za-z0-9+/_=-]*")
REDACTED = "whsec_[REDACTED]"


class SecretDecryptError(ValueError):
    """The ciphertext is malformed, or does not authenticate under this key and binding."""


def _associated_data(tenant_id: str, endpoint_id: str, key_version: int) -> bytes:
    # JSON of a list is unambiguous: ("a,b", "c") and ("a", "b,c") encode differently.
    return json.dumps([_AAD_LABEL, tenant_id, endpoint_id, key_version]).encode()


def _cipher(master_key: bytes) -> AESGCM:
    if len(master_key) != MASTER_KEY_BYTES:
        raise ValueError(f"master key must be {MASTER_KEY_BYTES} bytes, got {len(master_key)}")
    return AESGCM(master_key)


def encrypt_secret(
    master_key: bytes | Keyring,
    secret: str,
    *,
    tenant_id: str,
    endpoint_id: str,
    key_version: int,
    nonce: bytes,
) -> str:
    """Base64 text of ``format || [key id] || nonce || AES-GCM(secret) || tag`` bound to the
    endpoint key. A keyring seals with its current key and records its id (v2); a bare key
    writes the v1 format."""
    return _seal(master_key, secret, _associated_data(tenant_id, endpoint_id, key_version), nonce)


def decrypt_secret(
    master_key: bytes | Keyring,
    ciphertext_b64: str,
    *,
    tenant_id: str,
    endpoint_id: str,
    key_version: int,
) -> str:
    """The plaintext secret, or :class:`SecretDecryptError` (wrong key, binding, or tampering).
    A v2 ciphertext names its master key; a v1 one is tried under each key of the keyring,
    the current one first (AES-GCM authenticates: a wrong key fails, it never decrypts wrongly)."""
    return _open(master_key, ciphertext_b64, _associated_data(tenant_id, endpoint_id, key_version),
                 f"signing secret v{key_version} of endpoint {endpoint_id}")


_HEADER_AAD_LABEL = "webhooks.custom-header/v1"


def _header_associated_data(tenant_id: str, endpoint_id: str, name: str) -> bytes:
    # Header names are case-insensitive: the binding is to the name, not to how it was typed.
    return json.dumps([_HEADER_AAD_LABEL, tenant_id, endpoint_id, name.lower()]).encode()


def seal_header_value(
    master_key: Keyring, value: str, *, tenant_id: str, endpoint_id: str, name: str, nonce: bytes
) -> str:
    """A secret custom-header value sealed like a signing secret (same format, same keyring),
    bound to (tenant, endpoint, header name): a ciphertext copied onto another endpoint or
    another header does not open."""
    return _seal(master_key, value, _header_associated_data(tenant_id, endpoint_id, name), nonce)


def open_header_value(master_key: Keyring, ciphertext_b64: str, *, tenant_id: str, endpoint_id: str,
                      name: str) -> str:
    """The plaintext of :func:`seal_header_value`, or :class:`SecretDecryptError`."""
    return _open(master_key, ciphertext_b64, _header_associated_data(tenant_id, endpoint_id, name),
                 f"custom header {name!r} of endpoint {endpoint_id}")


def _seal(master_key: bytes | Keyring, plaintext: str, aad: bytes, nonce: bytes) -> str:
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")
    key = master_key.current if isinstance(master_key, Keyring) else master_key
    sealed = _cipher(key).encrypt(nonce, plaintext.encode(), aad)
    if isinstance(master_key, Keyring):
        key_id = master_key.current_id.encode("ascii")
        return base64.b64encode(_FORMAT_V2 + bytes([len(key_id)]) + key_id + nonce + sealed).decode("ascii")
    return base64.b64encode(_FORMAT_V1 + nonce + sealed).decode("ascii")


def _open(master_key: bytes | Keyring, ciphertext_b64: str, aad: bytes, what: str) -> str:
    """``what`` names the sealed thing in errors (never its value)."""
    keyring = master_key if isinstance(master_key, Keyring) else None
    try:
        raw = base64.b64decode(ciphertext_b64, validate=True)
    except binascii.Error:
        raise SecretDecryptError(f"{what}: ciphertext is not base64") from None
    if raw[:1] == _FORMAT_V2 and len(raw) >= 2:
        key_id, body = raw[2 : 2 + raw[1]].decode("ascii", "replace"), raw[2 + raw[1] :]
        if keyring is None or key_id not in keyring.keys:
            raise SecretDecryptError(f"{what} is sealed under master key {key_id!r}, which is not configured")
        candidates = [keyring.keys[key_id]]
    elif raw[:1] == _FORMAT_V1:
        body = raw[1:]
        candidates = ([keyring.current, *(k for i, k in keyring.keys.items() if i != keyring.current_id)]
                      if keyring is not None else [master_key])  # type: ignore[list-item]
    else:
        raise SecretDecryptError(f"{what}: ciphertext has an unknown format")
    if len(body) < NONCE_BYTES + 16:
        raise SecretDecryptError(f"{what}: ciphertext has an unknown format")
    nonce, sealed = body[:NONCE_BYTES], body[NONCE_BYTES:]
    for key in candidates:
        try:
            return _cipher(key).decrypt(nonce, sealed, aad).decode()
        except InvalidTag:
            continue
    # One message for every cause, so the error does not tell an attacker which part is wrong.
    raise SecretDecryptError(f"{what} does not decrypt under this master key and binding") from None


def constant_time_equals(a: str | bytes, b: str | bytes) -> bool:
    """Compare secrets or signatures without leaking where they first differ."""
    left = a.encode() if isinstance(a, str) else a
    right = b.encode() if isinstance(b, str) else b
    return hmac.compare_digest(left, right)


def redact(text: str) -> str:
    """Mask anything that looks like a ``whsec_`` secret before it reaches a log or an error."""
    return _WHSEC.sub(REDACTED, text)


T = TypeVar("T")


class Redacted(Generic[T]):
    """Carries a secret through code that may log or repr it; only :meth:`reveal` gives it back."""

    __slots__ = ("_value",)

    def __init__(self, value: T) -> None:
        self._value = value

    def reveal(self) -> T:
        return self._value

    def __repr__(self) -> str:
        return "Redacted('[REDACTED]')"

    __str__ = __repr__
