"""Standard Webhooks signing: pure functions from (id, timestamp, exact body, secrets) to headers.

Two schemes, chosen per endpoint and per key (a rotation may switch): HMAC-SHA256 with a shared
``whsec_`` secret (signature version ``v1``), and ed25519 (``v1a``) with a ``whsk_`` private key the
platform keeps and a ``whpk_`` public key the receiver verifies with -- the receiver then holds
nothing that could forge a webhook.

The signed content is ``f"{webhook-id}.{webhook-timestamp}."`` followed by the body *bytes*
exactly as they go on the wire; we never re-serialise JSON, because a receiver verifies the raw
bytes it got. During a secret rotation every live secret signs, and ``webhook-signature`` lists
one ``v1,<base64>`` per secret separated by spaces, so a receiver holding either the old or the
new secret verifies (https://www.standardwebhooks.com/, "Signature scheme").

Nothing here reads a clock or a random source: the attempt timestamp and the secret's random
bytes are arguments, so fixed vectors pin the output.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from core.timeutil import ms_to_iso

SECRET_PREFIX = "whsec_"
# 32 random bytes = a 256-bit HMAC-SHA256 key; the spec allows 24..64.
SECRET_BYTES = 32
SIGNATURE_VERSION = "v1"

HMAC_SHA256 = "hmac-sha256"
ED25519 = "ed25519"
SCHEMES = (HMAC_SHA256, ED25519)
ED25519_SECRET_PREFIX = "whsk_"  # base64 of the 32-byte seed
ED25519_PUBLIC_PREFIX = "whpk_"  # base64 of the 32-byte public key
ED25519_SIGNATURE_VERSION = "v1a"

# What signs: an HMAC key's bytes, or an ed25519 private key.
SigningMaterial = bytes | Ed25519PrivateKey


def generate_key(scheme: str, rng_bytes: bytes) -> str:
    """A new secret of ``scheme`` from caller-supplied random bytes (32 for either scheme)."""
    if scheme == HMAC_SHA256:
        return generate_secret(rng_bytes)
    if scheme == ED25519:
        if len(rng_bytes) != SECRET_BYTES:
            raise ValueError(f"an ed25519 key needs {SECRET_BYTES} random bytes, got {len(rng_bytes)}")
        return ED25519_SECRET_PREFIX + base64.b64encode(rng_bytes).decode("ascii")
    raise ValueError(f"unknown signature scheme {scheme!r}; known: {', '.join(SCHEMES)}")


def scheme_of(secret: str) -> str:
    return ED25519 if secret.startswith(ED25519_SECRET_PREFIX) else HMAC_SHA256


def _ed25519_private(whsk: str) -> Ed25519PrivateKey:
    try:
        seed = base64.b64decode(whsk[len(ED25519_SECRET_PREFIX):], validate=True)
    except binascii.Error:
        raise ValueError("ed25519 signing key is not valid base64") from None
    if len(seed) != 32:
        raise ValueError("ed25519 signing key must hold a 32-byte seed")
    return Ed25519PrivateKey.from_private_bytes(seed)


def public_key(whsk: str) -> str:
    """The ``whpk_`` public key of a ``whsk_`` private key: what the receiver verifies with."""
    raw = _ed25519_private(whsk).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return ED25519_PUBLIC_PREFIX + base64.b64encode(raw).decode("ascii")


def signing_material(secret: str) -> SigningMaterial:
    """What signs for a stored secret of either scheme (errors never include the secret)."""
    if secret.startswith(ED25519_SECRET_PREFIX):
        return _ed25519_private(secret)
    return secret_bytes(secret)


def generate_secret(rng_bytes: bytes) -> str:
    """Encode caller-supplied random bytes as a ``whsec_`` secret.

    The caller passes ``os.urandom(SECRET_BYTES)``; taking the bytes keeps this function pure and
    its output testable. Anything but exactly 32 bytes is refused rather than silently weakened.
    """
    if len(rng_bytes) != SECRET_BYTES:
        raise ValueError(f"a signing secret needs {SECRET_BYTES} random bytes, got {len(rng_bytes)}")
    return SECRET_PREFIX + base64.b64encode(rng_bytes).decode("ascii")


def secret_bytes(whsec: str) -> bytes:
    """The HMAC key inside a ``whsec_<base64>`` secret.

    Error messages never include the input: it is a secret and errors end up in logs.
    """
    if not whsec.startswith(SECRET_PREFIX):
        raise ValueError(f"signing secret must start with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(whsec[len(SECRET_PREFIX) :], validate=True)
    except binascii.Error:
        raise ValueError("signing secret is not valid base64") from None
    if not key:
        raise ValueError("signing secret is empty")
    return key


def _check_msg_id(msg_id: str) -> None:
    # A header value must not carry CR/LF or spaces, and a "." in the id would make the signed
    # string "id.ts.body" ambiguous about where the id ends. Our ids are "dlv_<hex>".
    if not msg_id:
        raise ValueError("webhook-id must not be empty")
    if "." in msg_id or not all(0x21 <= ord(c) <= 0x7E for c in msg_id):
        raise ValueError("webhook-id must be printable ASCII without spaces or '.'")


def signature(key: SigningMaterial, msg_id: str, timestamp_s: int, body: bytes) -> str:
    """One ``v1,<base64 HMAC-SHA256>`` or ``v1a,<base64 ed25519>`` entry over ``id.timestamp.body``."""
    signed = f"{msg_id}.{timestamp_s}.".encode() + body
    if isinstance(key, Ed25519PrivateKey):
        return f"{ED25519_SIGNATURE_VERSION},{base64.b64encode(key.sign(signed)).decode('ascii')}"
    mac = hmac.new(key, signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(mac).decode('ascii')}"


def _version(key: SigningMaterial) -> str:
    return ED25519_SIGNATURE_VERSION if isinstance(key, Ed25519PrivateKey) else SIGNATURE_VERSION


def sign(
    msg_id: str, timestamp_s: int, body: bytes, secrets: Sequence[tuple[int, SigningMaterial]]
) -> dict[str, str]:
    """The three Standard Webhooks headers for one attempt.

    ``secrets`` are ``(key_version, key_bytes)`` of every live key, newest first; each signs the
    same content and the signatures keep that order. ``timestamp_s`` is this attempt's time in
    unix seconds, so every retry gets a fresh timestamp (receivers reject stale ones) while the id
    and the body stay the same.
    """
    _check_msg_id(msg_id)
    if timestamp_s < 0:
        raise ValueError("webhook-timestamp must not be negative")
    if not secrets:
        raise ValueError("at least one live signing secret is required")
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp_s),
        "webhook-signature": " ".join(
            signature(key, msg_id, timestamp_s, body) for _, key in secrets
        ),
    }


def build_headers(
    msg_id: str,
    timestamp_s: int,
    body: bytes,
    secrets: Sequence[tuple[int, SigningMaterial]],
    *,
    event_type: str,
    event_id: str,
    occurred_at_ms: int,
    schema_version: str,
    object_id: str = "",
    object_version: int | None = None,
    attempt: int | None = None,
    traceparent: str | None = None,
) -> dict[str, str]:
    """Everything an attempt sends besides the user agent: signature headers plus metadata.

    Ordering metadata (the brief's list): ``webhook-timestamp`` is the attempt's time,
    ``webhook-occurred-at`` the event's, ``webhook-object-id``/``-version`` the business object
    and its version (sent when the event names one), ``webhook-attempt`` the attempt number, so a
    receiver can drop an update older than the one it already applied.

    The metadata headers are NOT covered by the Standard Webhooks signature (it covers id,
    timestamp and body only); they help routing and debugging, and a receiver that needs them
    authenticated must read them from the signed body. ``webhook-key-versions`` lists the key
    versions in the same order as the signatures, space-separated like them, so a receiver can
    tell which key signed during a rotation.

    ``traceparent`` (W3C Trace Context, core.trace_context) names this attempt in the delivery's
    trace, so the receiver's spans join it; like the metadata it is not signed.
    """
    headers = sign(msg_id, timestamp_s, body, secrets)
    headers.update(
        {
            "content-type": "application/json",
            "webhook-event-type": event_type,
            "webhook-event-id": event_id,
            "webhook-occurred-at": ms_to_iso(occurred_at_ms),
            "webhook-schema-version": schema_version,
            "webhook-key-versions": " ".join(str(version) for version, _ in secrets),
            # The schemes that signed, in signature order ("v1", "v1a", or both while a rotation
            # moves an endpoint from one to the other).
            "webhook-signature-version": " ".join(dict.fromkeys(_version(key) for _, key in secrets)),
        }
    )
    if object_id:
        headers["webhook-object-id"] = object_id
        headers["webhook-object-version"] = str(object_version or 0)
    if attempt is not None:
        headers["webhook-attempt"] = str(attempt)
    if traceparent is not None:
        headers["traceparent"] = traceparent
    for name, value in headers.items():
        # Event type, ids and versions come from producers; refuse header injection here rather
        # than trusting every producer to have validated them.
        if "\r" in value or "\n" in value:
            raise ValueError(f"header {name} contains a line break")
    return headers
