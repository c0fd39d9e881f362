"""Coalesces the history writes of many deliveries into few Cassandra requests.

A delivery's history written as its own requests costs Cassandra and the driver (whose Python
time is spent in the dispatcher's interpreter) several times what the same statements cost in
batches of many deliveries: per-request work (native protocol framing, query processing, the
driver's future and callbacks) dominates, not the mutations themselves
(docs/performance.md#history-writes-in-cassandra).

So a write joins the open batch; its completion reports the batch's outcome. The batch is sent
when it is full (statements or estimated bytes), when no earlier batch is still in flight, or
when its oldest write has waited ``linger``; the owner calls :meth:`flush_if_due` at the end of
each pass (the dispatcher polls its pending writes on a timer, so a lingering batch is never
stranded). Sending at once when Cassandra has nothing of ours in flight is what keeps light load
fast (a first attempt waits for its creation rows: a fixed linger was paid by every first
attempt at light load); under load a batch is always in flight, so writes coalesce for one
round trip and batches grow with the load, Nagle-style.

Atomicity is not needed: each write is an idempotent upsert. But one write must never fail
another (an event whose value its column cannot hold failed every batch it joined,
other tenants' writes included): when a batch of several writes fails, whether its send raises
(the driver binding a bad value) or Cassandra refuses it later, each of its writes is sent again
alone and reports its own outcome; a write's completion is not done until then. A lone write that
fails is its delivery's to redo. During an outage that is one extra request per write.

Multi-partition unlogged batches make the coordinator fan out; on a ring, lower
``history_batch_max_statements`` (1 request per write is the old behaviour) or raise the batch
size thresholds in cassandra.yaml to match.

Only the owner's thread calls ``add``/``flush*`` and sends; completions are set from the
driver's I/O thread, and the owner only ever reads them (``done()``), so no lock is needed. A
failed batch's callback only appends it to a deque (one atomic operation under the GIL) that the
owner drains at its next ``flush_if_due``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

Statement = tuple[Any, Sequence[Any]]  # (prepared statement, bound values)


class Completion(Protocol):
    """What the dispatcher needs of a write or send in progress (concurrent.futures.Future fits)."""

    def done(self) -> bool: ...

    def exception(self) -> BaseException | None: ...

    def result(self) -> Any: ...


class BatchCompletion:
    """The outcome of one batch, shared by all writes in it. Cheaper than a
    concurrent.futures.Future (no condition variable): the owner only polls it."""

    __slots__ = ("_done", "_exc")

    def __init__(self) -> None:
        self._done = False
        self._exc: BaseException | None = None

    def done(self) -> bool:
        return self._done

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self) -> None:
        if self._exc is not None:
            raise self._exc

    def succeed(self, *_: Any) -> None:
        self._done = True

    def fail(self, exc: BaseException) -> None:
        self._exc = exc  # before done: a reader that sees done also sees the error
        self._done = True


class _Batch(BatchCompletion):
    """A sent batch: its outcome, and the writes in it (each statements and completion)."""

    __slots__ = ("writes", "_isolate")

    def __init__(self, isolate: Callable[[_Batch], None]) -> None:
        super().__init__()
        self.writes: list[tuple[list[Statement], WriteCompletion]] = []
        self._isolate = isolate

    def succeed(self, *_: Any) -> None:
        super().succeed()
        # Nothing is sent again after a success: let the statements (payloads too) go. A write's
        # completion outlives its batch (the dispatcher keeps event rows' for up to 100,000
        # events), and each kept a whole batch reachable for the collector to walk.
        self.writes = []

    def fail(self, exc: BaseException) -> None:
        super().fail(exc)
        if len(self.writes) > 1:
            self._isolate(self)


class WriteCompletion:
    """One write's outcome: its batch's, unless the batch held others and failed; then that of
    the write sent again alone."""

    __slots__ = ("_batch", "alone")

    def __init__(self, batch: _Batch) -> None:
        self._batch = batch
        self.alone: BatchCompletion | None = None

    def _outcome(self) -> BatchCompletion | None:
        if self.alone is not None:
            return self.alone
        b = self._batch
        if b.done() and (b.exception() is None or len(b.writes) == 1):
            return b
        return None  # pending, or failed with others: to be sent alone

    def done(self) -> bool:
        outcome = self._outcome()
        return outcome is not None and outcome.done()

    def exception(self) -> BaseException | None:
        outcome = self._outcome()
        return None if outcome is None else outcome.exception()

    def result(self) -> None:
        exc = self.exception()
        if exc is not None:
            raise exc


class AllOf:
    """Done when every part is; fails with the first failure seen."""

    __slots__ = ("_parts",)

    def __init__(self, parts: list[Completion]) -> None:
        self._parts = parts

    def done(self) -> bool:
        return all(p.done() for p in self._parts) or self.exception() is not None

    def exception(self) -> BaseException | None:
        for p in self._parts:
            if p.done() and p.exception() is not None:
                return p.exception()
        return None

    def result(self) -> None:
        exc = self.exception()
        if exc is not None:
            raise exc


# Cassandra checks a batch's size against batch_size_fail_threshold as the data size of its
# mutations: every cell's value plus its timestamp, TTL and deletion time (16 bytes, the tables
# have a default TTL), and the keys. Estimated from the bound values, without serialising.
CELL_OVERHEAD_BYTES = 16
STATEMENT_OVERHEAD_BYTES = 32


def estimated_size(values: Sequence[Any]) -> int:
    """Approximate data size of one statement's mutation (see CELL_OVERHEAD_BYTES)."""
    size = STATEMENT_OVERHEAD_BYTES
    for v in values:
        size += CELL_OVERHEAD_BYTES + (len(v) if isinstance(v, (str, bytes)) else 8)
    return size


class WriteBatcher:
    def __init__(self, send: Callable[[list[Statement], BatchCompletion], None], max_statements: int,
                 max_bytes: int, linger_s: float, clock: Callable[[], float] = time.monotonic,
                 min_interval_s: float = 0.0) -> None:
        """``send(statements, completion)`` starts one request and settles ``completion``.
        ``min_interval_s``: with nothing in flight, a batch still waits until this long after
        the previous one left (never longer than ``linger_s`` after its oldest write)."""
        if max_statements < 1 or max_bytes < 1:
            raise ValueError("a batch holds at least one statement and one byte")
        self._send = send
        self._max_statements = max_statements
        self._max_bytes = max_bytes
        self._linger_s = linger_s
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._flushed_at = float("-inf")
        self._failed: deque[_Batch] = deque()  # failed batches of several writes, to send alone
        self._statements: list[Statement] = []
        self._bytes = 0
        self._opened_at = 0.0
        self._completion = _Batch(self._failed.append)
        self._in_flight: BatchCompletion | None = None  # the last batch sent
        self.requests_sent = 0
        self.statements_sent = 0

    def pace(self, linger_s: float, min_interval_s: float) -> None:
        """Wait this long from now on (the dispatcher waits longer while it catches up)."""
        self._linger_s = linger_s
        self._min_interval_s = min_interval_s

    def add(self, statements: list[Statement]) -> WriteCompletion:
        """Queue one write's statements together (they always travel in the same request)."""
        size = sum(estimated_size(values) for _, values in statements)
        if self._statements and (len(self._statements) + len(statements) > self._max_statements
                                 or self._bytes + size > self._max_bytes):
            self.flush()
        if not self._statements:
            self._opened_at = self._clock()
        self._statements.extend(statements)
        self._bytes += size
        completion = WriteCompletion(self._completion)
        self._completion.writes.append((statements, completion))
        if len(self._statements) >= self._max_statements or self._bytes >= self._max_bytes:
            self.flush()
        return completion

    def flush_if_due(self) -> None:
        self._send_alone()
        if not self._statements:
            return
        now = self._clock()
        idle = self._in_flight is None or self._in_flight.done()
        if (idle and now - self._flushed_at >= self._min_interval_s) or now - self._opened_at >= self._linger_s:
            self.flush()

    def flush(self) -> None:
        if not self._statements:
            return
        statements, batch = self._statements, self._completion
        self._statements, self._bytes, self._completion = [], 0, _Batch(self._failed.append)
        self._in_flight = batch
        self._flushed_at = self._clock()
        self._request(statements, batch)
        self._send_alone()  # a batch whose send raised (a value that cannot be bound)

    def _send_alone(self) -> None:
        """Send each write of every failed batch of several again, alone."""
        while self._failed:
            for statements, write in self._failed.popleft().writes:
                write.alone = BatchCompletion()
                self._request(statements, write.alone)

    def _request(self, statements: list[Statement], completion: BatchCompletion) -> None:
        self.requests_sent += 1
        self.statements_sent += len(statements)
        try:
            self._send(statements, completion)
        except Exception as e:  # e.g. no host available, or a value the driver cannot bind
            completion.fail(e)

    @property
    def buffered(self) -> int:
        return len(self._statements)
