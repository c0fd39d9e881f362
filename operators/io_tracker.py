"""The dispatcher's I/O in flight: HTTP requests and Cassandra reads/writes, per endpoint.

Futures complete on the I/O loop's thread (or the Cassandra driver's); the dispatcher only looks
at them from its own task thread, in the endpoint's keyed context, when a timer or an element
for that endpoint arrives. What the I/O side may do from its own thread is say *which* endpoints
have something finished: a future that takes a done-callback adds its endpoint to a set, so a
timer that finds its endpoint absent from it (and none of the endpoint's callback-less
completions done) knows without a pass that there is nothing to harvest.
"""

from __future__ import annotations

import functools
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

from core.endpoint_driver import IoKind
from operators.write_batcher import Completion


@dataclass(frozen=True)
class Finished:
    kind: IoKind
    key: str  # delivery_id
    result: Any
    exc: BaseException | None
    tag: Any  # what the starter attached (e.g. the event id a persist claimed)


class IoTracker:
    def __init__(self) -> None:
        # endpoint -> (kind, delivery) -> (completion, started at, tag, whether it calls back)
        self._by_endpoint: dict[str, dict[tuple[IoKind, str], tuple[Completion, int, Any, bool]]] = {}
        # Endpoints a done-callback reported, written from I/O threads. A set's add and discard
        # are each one atomic operation under the GIL; the task thread discards an endpoint
        # *before* scanning its futures, so a completion racing the scan is reported again.
        self._ready: set[str] = set()

    def add(self, endpoint_id: str, kind: IoKind, key: str, fut: Completion, now_ms: int, tag: Any = None) -> None:
        calls_back = hasattr(fut, "add_done_callback")
        self._by_endpoint.setdefault(endpoint_id, {})[(kind, key)] = (fut, now_ms, tag, calls_back)
        if calls_back:
            # (Runs at once, on this thread, if the future is done already.)
            fut.add_done_callback(functools.partial(_mark_ready, self._ready, endpoint_id))  # type: ignore[attr-defined]

    def has_finished(self, endpoint_id: str) -> bool:
        """Whether :meth:`finished` would return anything, without taking it: one set lookup,
        plus ``done()`` of the completions that cannot call back (the write batcher's)."""
        if endpoint_id in self._ready:
            return True
        io = self._by_endpoint.get(endpoint_id)
        return io is not None and any(not calls_back and fut.done() for fut, _, _, calls_back in io.values())

    def finished(self, endpoint_id: str) -> list[Finished]:
        self._ready.discard(endpoint_id)
        io = self._by_endpoint.get(endpoint_id)
        if not io:
            return []
        out = []
        for (kind, key), (fut, _, tag, _) in list(io.items()):
            if not fut.done():
                continue
            del io[(kind, key)]
            exc = fut.exception()
            out.append(Finished(kind, key, None if exc is not None else fut.result(), exc, tag))
        if not io:
            del self._by_endpoint[endpoint_id]
        return out

    def busy(self, endpoint_id: str) -> bool:
        return bool(self._by_endpoint.get(endpoint_id))

    def poll_interval(self, endpoint_id: str, base_ms: int, busy_max_ms: int) -> int:
        """How often young I/O of this endpoint is looked at: every ``base_ms`` with up to three in
        flight, one ``base_ms`` more for each further two, at most ``busy_max_ms``. A look costs a
        timer and a crossing into Python whatever it finds, and an endpoint with many requests in
        flight finds several finished at each rarer look (eight requests and their writes: one
        look every 40 ms instead of 10), while one with a request at a time still has its answer
        noticed within 10 ms."""
        return _young_interval(self._by_endpoint.get(endpoint_id), base_ms, busy_max_ms)

    def poll_at(self, endpoint_id: str, now_ms: int, base_ms: int, busy_max_ms: int) -> int | None:
        """When to look at this endpoint's I/O again (None: nothing in flight). Young I/O is
        checked every :meth:`poll_interval`; I/O that has run a while at a quarter of its age (at
        most once a second), so a thousand hanging requests cost about a thousand timer calls per
        second instead of a hundred thousand, and a slow answer is noticed within ~25 % of its
        latency."""
        io = self._by_endpoint.get(endpoint_id)
        if not io:
            return None
        youngest = max(started for _, started, _, _ in io.values())
        young = _young_interval(io, base_ms, busy_max_ms)
        return now_ms + max(young, min(1000, (now_ms - youngest) // 4))


def _young_interval(io: Sized | None, base_ms: int, busy_max_ms: int) -> int:
    return max(base_ms, min(busy_max_ms, base_ms * (len(io or ()) // 2)))


def _mark_ready(ready: set[str], endpoint_id: str, _fut: Any) -> None:
    """A done-callback, on whichever thread completed the future."""
    ready.add(endpoint_id)
