"""Payload minimisation per endpoint: what an endpoint is sent of an event.

* ``full`` (default) -- the event's exact payload bytes, untouched.
* ``fields`` -- only the members an allow-list of JSON Pointers (RFC 6901) names, at the same
  paths, in allow-list order; a pointer that names nothing in this event contributes nothing. A
  pointer selects object members: one that would pass through an array selects nothing (name
  the array itself to send it whole).
* ``thin`` -- no business data at all: the event type, ids and a reference to the object, which
  the receiver fetches from the product's API with its own credentials.

The signed bytes are the minimised bytes (the receiver verifies what it got); the event row in
history keeps the original. Pure: bytes and the event's identity in, bytes out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from core.timeutil import ms_to_iso

FULL = "full"
FIELDS = "fields"
THIN = "thin"
MODES = (FULL, FIELDS, THIN)
MAX_FIELDS = 50
MAX_POINTER_CHARS = 256


class InvalidAllowList(ValueError):
    """A mode or allow-list that cannot be applied; the message says which entry and why."""


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """The reference tokens of a JSON Pointer ("/a/b~1c" -> ("a", "b/c"))."""
    if not pointer.startswith("/"):
        raise InvalidAllowList(f"{pointer!r} is not a JSON Pointer: it must start with '/'")
    if len(pointer) > MAX_POINTER_CHARS:
        raise InvalidAllowList(f"JSON Pointer longer than {MAX_POINTER_CHARS} characters")
    tokens = []
    for raw in pointer[1:].split("/"):
        if "~" in raw.replace("~0", "").replace("~1", ""):
            raise InvalidAllowList(f"{pointer!r}: '~' must be escaped as ~0 (and '/' as ~1)")
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    return tuple(tokens)


def check(mode: str, fields: Sequence[str]) -> None:
    """Refuse what cannot be applied, before it is stored."""
    if mode not in MODES:
        raise InvalidAllowList(f"unknown payload mode {mode!r}; use one of: {', '.join(MODES)}")
    if mode != FIELDS and fields:
        raise InvalidAllowList(f"payload fields are only used with payload mode {FIELDS!r}")
    if mode == FIELDS:
        if not fields:
            raise InvalidAllowList(f"payload mode {FIELDS!r} needs at least one JSON Pointer")
        if len(fields) > MAX_FIELDS:
            raise InvalidAllowList(f"at most {MAX_FIELDS} payload fields, got {len(fields)}")
        if len(set(fields)) != len(fields):
            raise InvalidAllowList("payload fields repeat a pointer")
        for f in fields:
            if f == "":
                raise InvalidAllowList("the empty pointer selects the whole payload: use payload mode 'full'")
            parse_pointer(f)


def minimise(payload: bytes, mode: str, fields: Sequence[str], *, event_type: str, event_id: str,
             object_id: str, object_version: int | None, occurred_at_ms: int) -> bytes:
    if mode == FULL:
        return payload
    if mode == THIN:
        return _dumps({"type": event_type, "event_id": event_id, "occurred_at": ms_to_iso(occurred_at_ms),
                       "object": {"id": object_id, "version": object_version} if object_id else None,
                       "thin": True})
    if mode == FIELDS:
        try:
            source = json.loads(payload)
        except ValueError:
            source = None
        out: dict[str, Any] = {}
        for pointer in fields:
            _copy(source, out, parse_pointer(pointer))
        return _dumps(out)
    raise InvalidAllowList(f"unknown payload mode {mode!r}")


def _copy(source: Any, out: dict[str, Any], path: tuple[str, ...]) -> None:
    node = source
    for token in path:
        if not isinstance(node, dict) or token not in node:
            return
        node = node[token]
    target = out
    for token in path[:-1]:
        nxt = target.get(token)
        if not isinstance(nxt, dict):
            nxt = target[token] = {}
        target = nxt
    target[path[-1]] = node


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
