"""Opaque page cursors: base64url JSON, bound to the query that produced them.

A cursor carries the position plus the identity of the listing (e.g. the endpoint id and
filters); a cursor replayed against another listing is refused instead of silently skipping
rows. Cursors are not secret and not signed: they only name positions the caller can already
read, and every read is still tenant-scoped.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from control_plane.errors import InvalidArgument


def encode(kind: str, **fields: Any) -> str:
    raw = json.dumps({"k": kind, **fields}, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(kind: str, cursor: str, **expected: Any) -> dict[str, Any]:
    """The cursor's fields; InvalidArgument if it is garbage or from a different listing."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        fields = json.loads(raw)
    except (binascii.Error, ValueError):
        raise InvalidArgument("cursor is not valid; pass next_cursor from the previous page") from None
    if not isinstance(fields, dict) or fields.get("k") != kind:
        raise InvalidArgument("cursor belongs to a different listing")
    for name, value in expected.items():
        if fields.get(name) != value:
            raise InvalidArgument(f"cursor was issued for a different {name}; start without a cursor")
    return fields
