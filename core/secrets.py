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
import hmac
import json
import re
from typing import Generic, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MASTER_KEY_BYTES = 32
NONCE_BYTES = 12
# First byte of every ciphertext: lets a later format (or a master-key id) be told apart.
_FORMAT_V1 = b"\x01"
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
    master_key: bytes,
    secret: str,
    *,
    tenant_id: str,
    endpoint_id: str,
    key_version: int,
    nonce: bytes,
) -> str:
    """Base64 text of ``format || nonce || AES-GCM(secret) || tag`` bound to the endpoint key."""
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be {NONCE_BYTES} bytes, got {len(nonce)}")
    sealed = _cipher(master_key).encrypt(
        nonce, secret.encode(), _associated_data(tenant_id, endpoint_id, key_version)
    )
    return base64.b64encode(_FORMAT_V1 + nonce + sealed).decode("ascii")


def decrypt_secret(
    master_key: bytes,
    ciphertext_b64: str,
    *,
    tenant_id: str,
    endpoint_id: str,
    key_version: int,
) -> str:
    """The plaintext secret, or :class:`SecretDecryptError` (wrong key, binding, or tampering)."""
    cipher = _cipher(master_key)
    try:
        raw = base64.b64decode(ciphertext_b64, validate=True)
    except binascii.Error:
        raise SecretDecryptError("signing-secret ciphertext is not base64") from None
    if raw[:1] != _FORMAT_V1 or len(raw) < 1 + NONCE_BYTES + 16:
        raise SecretDecryptError("signing-secret ciphertext has an unknown format")
    nonce, sealed = raw[1 : 1 + NONCE_BYTES], raw[1 + NONCE_BYTES :]
    try:
        plain = cipher.decrypt(nonce, sealed, _associated_data(tenant_id, endpoint_id, key_version))
    except InvalidTag:
        # One message for every cause, so the error does not tell an attacker which part is wrong.
        raise SecretDecryptError(
            f"signing secret v{key_version} of endpoint {endpoint_id} does not decrypt "
            "under this master key and binding"
        ) from None
    return plain.decode()


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
