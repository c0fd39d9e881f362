"""Opaque page cursors: base64url JSON bound to the query that produced them, and signed.

A cursor carries the position plus the identity of the listing (e.g. the endpoint id and
filters); a cursor replayed against another listing is refused instead of silently skipping
rows. It also carries what the first page resolved -- a delivery listing's time range -- and a
forged range spanning years would walk one Cassandra partition per day: so every cursor carries
an HMAC-SHA256 tag (128 bits) under a key derived from the current master key, and one that does
not verify is refused before anything is read. Every control-plane replica derives the same key;
during a master-key rotation tags under the retired keys are accepted too.
Cursors are not secret: they only name positions the caller can already read, and every read
is still tenant-scoped.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from typing import Any

from control_plane.errors import InvalidArgument
from core.secrets import Keyring, derive_key

_TAG_BYTES = 16
_LABEL = b"webhooks.page-cursor/v1"


def not_valid(param: str = "cursor", returned: str = "next_cursor") -> InvalidArgument:
    """The refusal of a cursor, in the names of the request's field and the response's."""
    return InvalidArgument(f"{param} is not valid; pass {returned} from the previous page")


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Cursors:
    def __init__(self, key: bytes, *accepted: bytes) -> None:
        self._key = key
        self._accepted = (key, *accepted)  # during a master-key rotation: tags of the old key too

    @classmethod
    def from_keyring(cls, keyring: Keyring) -> Cursors:
        return cls(derive_key(keyring.current, _LABEL),
                   *(derive_key(k, _LABEL) for i, k in keyring.keys.items() if i != keyring.current_id))

    @staticmethod
    def _tag(key: bytes, body: str) -> str:
        return _b64(hmac.new(key, body.encode(), hashlib.sha256).digest()[:_TAG_BYTES])

    def encode(self, kind: str, **fields: Any) -> str:
        body = _b64(json.dumps({"k": kind, **fields}, separators=(",", ":"), sort_keys=True).encode())
        return f"{body}.{self._tag(self._key, body)}"

    def decode(self, kind: str, cursor: str, names: tuple[str, str] = ("cursor", "next_cursor"),
               **expected: Any) -> dict[str, Any]:
        """The cursor's fields; InvalidArgument if it is garbage, forged, or from a different
        listing. ``names``: the request's cursor field and the response's, for the message."""
        body, _, tag = cursor.partition(".")
        if not any(hmac.compare_digest(tag.encode(), self._tag(k, body).encode()) for k in self._accepted):
            raise not_valid(*names)
        try:
            fields = json.loads(_unb64(body))
        except (binascii.Error, ValueError):
            raise not_valid(*names) from None
        if not isinstance(fields, dict) or fields.get("k") != kind:
            raise InvalidArgument("cursor belongs to a different listing")
        for name, value in expected.items():
            if fields.get(name) != value:
                raise InvalidArgument(f"cursor was issued for a different {name}; start without a cursor")
        return fields
