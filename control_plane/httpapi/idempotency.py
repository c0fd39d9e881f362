"""Idempotency-Key on the HTTP API's POST and PATCH: the same key and request answer the first response.

A key is scoped to the credential that sent it (the SHA-256 of the bearer token), so two tenants'
keys never meet. The request is fingerprinted (verb, path, query, body); the first one to arrive
runs and its answer is kept for ``ttl_s``:

* the same key and fingerprint again: the kept answer, byte for byte, marked
  ``Idempotency-Replayed: true``; nothing runs a second time;
* the same key with another fingerprint: refused (422, idempotency-key-reused);
* the same key while the first still runs: refused (409, idempotency-key-in-progress; retry).

Answers that say nothing happened and a retry may succeed (401, 403, 409 aborted, 5xx) are not
kept: the key is free again. Where an RPC has a ``request_id`` (CreateEndpoint, ReplayDelivery,
SkipOrderingHead) the key is also that request id, which the services keep durably in Cassandra:
a create retried on another replica, or after this memory forgot it, still creates one endpoint.
The memory here is per replica and bounded (the oldest entries go first).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from core import identifiers

# A key is also the RPC's request_id where it has one, which is an id: 1-128 of A-Z a-z 0-9 _ -.
IDEMPOTENCY_KEY_FORM = identifiers.ID


@dataclass(frozen=True)
class Kept:
    """A kept answer."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True)
class Run:
    """The first request with this key: run it, then ``finish`` or ``abandon``."""


@dataclass(frozen=True)
class Replay:
    kept: Kept


@dataclass(frozen=True)
class Reused:
    """The key was used for another request."""


@dataclass(frozen=True)
class InProgress:
    pass


Begin = Run | Replay | Reused | InProgress


def fingerprint(verb: str, path: str, query: Sequence[tuple[str, str]], body: bytes) -> str:
    h = hashlib.sha256()
    for part in (verb.encode(), path.encode(), repr(sorted(query)).encode(), body):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def scope_of(authorization: str) -> str:
    """The credential's scope, without keeping the credential."""
    return hashlib.sha256(authorization.encode()).hexdigest()


class IdempotencyStore(Protocol):
    def begin(self, scope: str, key: str, print_: str) -> Begin: ...
    def finish(self, scope: str, key: str, kept: Kept) -> None: ...
    def abandon(self, scope: str, key: str) -> None: ...


@dataclass
class _Entry:
    print_: str
    at_s: float
    kept: Kept | None = None  # None: still running


class MemoryIdempotency:
    """In-process, bounded, thread-safe (handlers run on worker threads)."""

    def __init__(self, ttl_s: float, max_entries: int, now_s: Callable[[], float]) -> None:
        self._ttl_s = ttl_s
        self._max = max_entries
        self._now_s = now_s
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry.at_s < self._ttl_s and len(self._entries) <= self._max:
                break
            del self._entries[key]

    def begin(self, scope: str, key: str, print_: str) -> Begin:
        now = self._now_s()
        with self._lock:
            self._expire(now)
            entry = self._entries.get((scope, key))
            if entry is None:
                self._entries[(scope, key)] = _Entry(print_, now)
                self._expire(now)
                return Run()
            if entry.print_ != print_:
                return Reused()
            if entry.kept is None:
                return InProgress()
            return Replay(entry.kept)

    def finish(self, scope: str, key: str, kept: Kept) -> None:
        with self._lock:
            entry = self._entries.get((scope, key))
            if entry is not None:
                entry.kept = kept

    def abandon(self, scope: str, key: str) -> None:
        with self._lock:
            self._entries.pop((scope, key), None)

    def __len__(self) -> int:
        return len(self._entries)
