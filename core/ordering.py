"""Ordering keys: one active delivery per key on an endpoint that asks for it.

The brief: "partition that subscription by an ordering key and allow only one active sequence
per key; an earlier failing item blocks later ones on that key". Off by default. An endpoint's
``ordering_key`` says where the key comes from:

* ``""`` -- no ordering (default): deliveries go as concurrently as the endpoint allows.
* ``object_id`` -- the event's object id (an invoice's updates go one at a time, in version order).
* a JSON Pointer (``/customer/id``) -- a string or number member of the payload; an event without
  it falls back to its object id, so it is still ordered with the object it changes.

An event whose key comes out empty (no object id, no member) is not ordered.

:class:`KeyQueues` is the sequencing the endpoint driver keeps: per key, the members it holds in
memory sorted by ``(object_version, created_at, delivery_id)``; the head is the lowest, and once
the head has been sent it stays head until its delivery is final (succeeded, failed, expired, or
skipped by an operator), even if a lower version arrives meanwhile -- that one is sent next, late,
and carries ``webhook-object-version`` for the receiver to drop if it is stale. Only the head of a
key is sent automatically; manual replays are a person's explicit choice and are not held.

The price is the trade-off the brief names: a head that keeps failing holds every later delivery
of its key for up to the 24 h retry window (other keys flow). The API lists blocked keys and lets
an operator skip a head (it ends ``failed``, with who skipped it in its history).
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field

from core.minimise import InvalidAllowList, parse_pointer

NONE = ""
OBJECT_ID = "object_id"


class InvalidOrderingKey(ValueError):
    """An ordering key setting that cannot be applied; the message says why."""


def check(setting: str) -> str:
    """The setting, or InvalidOrderingKey."""
    if setting in (NONE, OBJECT_ID):
        return setting
    if not setting.startswith("/"):
        raise InvalidOrderingKey(
            f"ordering key {setting!r}: use {OBJECT_ID!r}, a JSON Pointer into the payload such as "
            "'/customer/id', or '' for no ordering")
    try:
        parse_pointer(setting)
    except InvalidAllowList as exc:
        raise InvalidOrderingKey(f"ordering key: {exc}") from None
    return setting


def key_for(setting: str, object_id: str, payload: bytes) -> str:
    """The ordering key of one event for an endpoint with ``setting`` ("" = not ordered)."""
    if setting == NONE:
        return ""
    if setting == OBJECT_ID:
        return object_id
    try:
        node = json.loads(payload)
        for token in parse_pointer(setting):
            if not isinstance(node, dict) or token not in node:
                return object_id
            node = node[token]
    except (ValueError, InvalidAllowList):
        return object_id
    if isinstance(node, bool) or not isinstance(node, str | int | float):
        return object_id  # an object, array, null or boolean is not a key
    return str(node)


@dataclass(frozen=True)
class KeyRowChange:
    """What the history store does to a key's row in ``blocked_ordering_keys`` with a head's
    record: ``blocked`` (upsert: the head failed and will retry) or not (delete: it is final)."""

    key: str
    blocked: bool
    waiting: int = 0  # members behind the head when written
    first_failure: bool = False  # the head's first failure: the row's blocked_since is set


@dataclass
class _Key:
    heap: list[tuple[int, int, str]] = field(default_factory=list)
    count: int = 0  # members (the heap may also hold removed ones until they reach its top)
    started: str | None = None  # the member that has been sent: head until it is final


class KeyQueues:
    """Per ordering key, which held delivery may be sent automatically (pure, no I/O)."""

    def __init__(self) -> None:
        self._keys: dict[str, _Key] = {}
        self._member: dict[str, tuple[str, tuple[int, int, str]]] = {}  # did -> (key, sort entry)

    def add(self, did: str, key: str, object_version: int, created_at_ms: int, started: bool = False) -> None:
        """Hold ``did`` under ``key``. A lower version than an unsent head becomes the head: the
        displaced one stops being ``is_head`` (the driver's due index checks that when it pops)."""
        if not key or did in self._member:
            return
        entry = (object_version, created_at_ms, did)
        k = self._keys.setdefault(key, _Key())
        heapq.heappush(k.heap, entry)
        k.count += 1
        self._member[did] = (key, entry)
        if started:
            self.mark_started(did)

    def remove(self, did: str) -> str | None:
        """Forget ``did``; returns the key's new head when ``did`` was its head, else None."""
        got = self._member.pop(did, None)
        if got is None:
            return None
        key, _ = got
        k = self._keys[key]
        was_head = k.started == did or (k.started is None and k.heap and k.heap[0][2] == did)
        if k.started == did:
            k.started = None
        k.count -= 1
        if k.count == 0:
            del self._keys[key]
            return None
        return self.head(key) if was_head else None

    def mark_started(self, did: str) -> None:
        """``did`` has been sent: it stays head of its key until removed. Keeps the lowest when a
        restore finds several started members (deliveries from before ordering was turned on)."""
        got = self._member.get(did)
        if got is None:
            return
        key, entry = got
        k = self._keys[key]
        if k.started is None or entry < self._member[k.started][1]:
            k.started = did

    def key_of(self, did: str) -> str:
        got = self._member.get(did)
        return got[0] if got is not None else ""

    def head(self, key: str) -> str | None:
        k = self._keys.get(key)
        if k is None:
            return None
        if k.started is not None:
            return k.started
        return k.heap[0][2] if self._clean(k) else None

    def is_head(self, did: str) -> bool:
        """Whether ``did`` may be sent automatically: it is unordered or its key's head."""
        got = self._member.get(did)
        return got is None or self.head(got[0]) == did

    def waiting(self, key: str) -> int:
        """Members of ``key`` behind its head."""
        k = self._keys.get(key)
        return 0 if k is None else k.count - 1

    def __len__(self) -> int:
        return len(self._member)

    def _clean(self, k: _Key) -> bool:
        """Drop removed members from the top of the heap; False when the key holds nothing."""
        while k.heap:
            entry = k.heap[0]
            got = self._member.get(entry[2])
            if got is not None and got[1] == entry:
                return True
            heapq.heappop(k.heap)
        return False
