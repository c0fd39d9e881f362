"""The history write batcher: when a batch goes, what each write's completion reports."""

from __future__ import annotations

import gc
import weakref

import pytest

from core.settings import Settings
from operators.write_batcher import (
    CELL_OVERHEAD_BYTES,
    STATEMENT_OVERHEAD_BYTES,
    AllOf,
    BatchCompletion,
    Statement,
    WriteBatcher,
    estimated_size,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Sent:
    def __init__(self) -> None:
        self.batches: list[tuple[list[Statement], BatchCompletion]] = []

    def __call__(self, statements: list[Statement], completion: BatchCompletion) -> None:
        self.batches.append((statements, completion))

    def names(self) -> list[list[str]]:
        return [[name for name, _ in statements] for statements, _ in self.batches]


def stmts(*names: str) -> list[Statement]:
    return [(n, ()) for n in names]


def make(max_statements: int = 4, max_bytes: int = 10_000, linger_s: float = 0.005, min_interval_s: float = 0.0):
    sent, clock = Sent(), Clock()
    return WriteBatcher(sent, max_statements, max_bytes, linger_s, clock, min_interval_s), sent, clock


def test_with_nothing_in_flight_a_write_goes_at_the_next_flush_if_due() -> None:
    b, sent, _ = make()
    c = b.add(stmts("a1", "a2"))
    assert sent.batches == []  # never from add itself: the pass may add more
    b.flush_if_due()
    assert sent.names() == [["a1", "a2"]] and not c.done()


def test_while_a_batch_is_in_flight_writes_wait_for_it_or_the_linger_then_go_together() -> None:
    b, sent, clock = make()
    b.add(stmts("first"))
    b.flush_if_due()
    c1 = b.add(stmts("a1", "a2"))
    clock.t += 0.004
    c2 = b.add(stmts("b1"))
    b.flush_if_due()
    assert sent.names() == [["first"]]
    clock.t += 0.001  # the oldest write has now waited 5 ms
    b.flush_if_due()
    assert sent.names() == [["first"], ["a1", "a2", "b1"]]
    assert not c1.done() and not c2.done()
    assert b.buffered == 0
    c3 = b.add(stmts("c1"))
    b.flush_if_due()
    assert b.buffered == 1  # ["a1", "a2", "b1"] is in flight
    sent.batches[1][1].succeed()
    assert c1.done() and c2.done()
    b.flush_if_due()  # it came back: the next batch goes without waiting out the linger
    assert sent.names()[-1] == ["c1"] and not c3.done()


def test_with_a_min_interval_batches_leave_at_most_that_often_but_a_quiet_write_goes_at_once() -> None:
    b, sent, clock = make(linger_s=0.020, min_interval_s=0.010)
    c0 = b.add(stmts("quiet"))
    b.flush_if_due()
    assert sent.names() == [["quiet"]]  # nothing left recently: no wait at light load
    sent.batches[0][1].succeed()
    assert c0.done()
    clock.t += 0.003
    b.add(stmts("a"))
    b.flush_if_due()
    assert sent.names() == [["quiet"]]  # back already, but the last batch left 3 ms ago
    clock.t += 0.004
    b.add(stmts("b"))
    b.flush_if_due()
    assert sent.names() == [["quiet"]]
    clock.t += 0.003  # 10 ms since the last batch left
    b.flush_if_due()
    assert sent.names() == [["quiet"], ["a", "b"]]
    b.add(stmts("c"))  # the batch before is still in flight: the linger still bounds the wait
    clock.t += 0.019
    b.flush_if_due()
    assert sent.names()[-1] == ["a", "b"]
    clock.t += 0.001
    b.flush_if_due()
    assert sent.names()[-1] == ["c"]
    for _ in range(2):  # a full batch never waits
        b.add(stmts("d1", "d2"))
    assert sent.names()[-1] == ["d1", "d2", "d1", "d2"]
    assert (b.requests_sent, b.statements_sent) == (4, 8)


def test_with_the_default_settings_a_steady_load_shares_requests_and_a_quiet_write_goes_at_once() -> None:
    """The defaults under a bench-like load: ~500 deliveries/s (two writes each, creation and
    outcome, ~1 ms apart), Cassandra answering in 2 ms. Sent whenever the last batch came back,
    each request carried about one delivery's writes; the dispatcher's CPU per delivery followed
    the requests (each one's driver work and the pass that harvests its completion)."""
    c = Settings().cassandra
    sent, clock = Sent(), Clock()
    b = WriteBatcher(sent, c.history_batch_max_statements, c.history_batch_max_bytes,
                     c.history_batch_linger_ms / 1000, clock, c.history_batch_min_interval_ms / 1000)
    b.add(stmts("quiet"))
    b.flush_if_due()
    assert len(sent.batches) == 1  # light load: nothing left recently, so no wait
    sent.batches[0][1].succeed()
    clock.t += 1.0
    in_flight: list[tuple[float, BatchCompletion]] = []
    writes = 0
    for _ in range(2000):  # 1 s: a write every 0.5 ms, the owner's pass after each
        clock.t += 0.0005
        for due, done in [x for x in in_flight if x[0] <= clock.t]:
            done.succeed()
            in_flight.remove((due, done))
        b.add(stmts("w"))
        writes += 1
        before = len(sent.batches)
        b.flush_if_due()
        in_flight += [(clock.t + 0.002, done) for _, done in sent.batches[before:]]
    assert (len(sent.batches) - 1) / writes <= 0.1  # <= 1 request per 10 writes (5 deliveries)
    oldest_wait = max(c.history_batch_min_interval_ms, c.history_batch_linger_ms)
    assert oldest_wait <= 20  # what a first attempt may wait for its creation rows, at most


def test_a_full_batch_goes_at_once_and_a_write_is_never_split() -> None:
    b, sent, _ = make(max_statements=4)
    b.add(stmts("a1", "a2", "a3"))
    b.add(stmts("b1", "b2"))  # does not fit beside a: a goes alone, b opens the next batch
    assert sent.names() == [["a1", "a2", "a3"]]
    b.add(stmts("c1", "c2"))  # fills the batch to 4: sent without waiting
    assert sent.names() == [["a1", "a2", "a3"], ["b1", "b2", "c1", "c2"]]


def test_a_write_larger_than_a_batch_still_goes_alone() -> None:
    b, sent, _ = make(max_statements=2)
    b.add(stmts("a1", "a2", "a3"))
    assert sent.names() == [["a1", "a2", "a3"]]


def test_bytes_bound_the_batch() -> None:
    payload = ("payload", (b"x" * 1000,))
    b, sent, _ = make(max_statements=100, max_bytes=STATEMENT_OVERHEAD_BYTES + estimated_size(payload[1]))
    b.add(stmts("small"))
    b.add(stmts("small2"))
    # This one would exceed the bytes: the open batch goes first, then it fills its own.
    b.add([payload])
    assert sent.names() == [["small", "small2"]]
    b.add(stmts("next"))
    assert sent.names() == [["small", "small2"], ["payload", "next"]]


@pytest.mark.parametrize("values,expected", [
    ((), STATEMENT_OVERHEAD_BYTES),
    (("abc",), STATEMENT_OVERHEAD_BYTES + CELL_OVERHEAD_BYTES + 3),
    ((b"12345", 7, None), STATEMENT_OVERHEAD_BYTES + 3 * CELL_OVERHEAD_BYTES + 5 + 8 + 8),
])
def test_size_estimate_counts_values_and_cell_overhead(values: tuple[object, ...], expected: int) -> None:
    assert estimated_size(values) == expected


def test_completions_report_their_batch_outcome() -> None:
    b, sent, _ = make(max_statements=2)
    first = b.add(stmts("a1", "a2"))
    second = b.add(stmts("b1"))
    b.flush()
    assert first is not second
    (_, c1), (_, c2) = sent.batches
    c1.succeed(object())
    c2.fail(TimeoutError("write timed out"))
    assert first.done() and first.exception() is None and first.result() is None
    assert second.done() and isinstance(second.exception(), TimeoutError)
    with pytest.raises(TimeoutError):
        second.result()


def test_a_send_that_raises_fails_a_lone_write() -> None:
    def refuse(statements: list[Statement], completion: BatchCompletion) -> None:
        raise RuntimeError("no host available")

    b = WriteBatcher(refuse, 10, 10_000, 0.0)
    c = b.add(stmts("a"))
    b.flush()
    assert c.done() and isinstance(c.exception(), RuntimeError)
    assert b.requests_sent == 1


def test_flush_of_nothing_sends_nothing() -> None:
    b, sent, _ = make()
    b.flush()
    b.flush_if_due()
    assert sent.batches == [] and b.requests_sent == 0 and b.statements_sent == 0


def test_all_of_waits_for_every_part_and_fails_fast() -> None:
    a, c = BatchCompletion(), BatchCompletion()
    both = AllOf([a, c])
    a.succeed()
    assert not both.done()
    c.succeed()
    assert both.done() and both.exception() is None
    x, y = BatchCompletion(), BatchCompletion()
    either_failed = AllOf([x, y])
    y.fail(ValueError("bad"))
    assert either_failed.done() and isinstance(either_failed.exception(), ValueError)


@pytest.mark.parametrize("max_statements,max_bytes", [(0, 10), (1, 0)])
def test_nonsense_bounds_are_refused(max_statements: int, max_bytes: int) -> None:
    with pytest.raises(ValueError):
        WriteBatcher(Sent(), max_statements, max_bytes, 0.0)


# -- one bad write never fails another -------------------------------------------


def refusing(bad: str, sent: Sent):  # type: ignore[no-untyped-def]
    """A send that raises, as the driver does binding a value its column cannot hold, for any
    request holding statement ``bad``; the others are recorded."""
    def send(statements: list[Statement], completion: BatchCompletion) -> None:
        if any(name == bad for name, _ in statements):
            raise OverflowError(f"{bad}: int too large to bind")
        sent(statements, completion)
    return send


def test_a_bad_statement_fails_only_its_own_write_when_the_batch_raises() -> None:
    sent = Sent()
    b = WriteBatcher(refusing("bad", sent), 10, 10_000, 0.0)
    good1, bad, good2 = b.add(stmts("a1", "a2")), b.add(stmts("bad", "b2")), b.add(stmts("c1"))
    b.flush()
    assert sent.names() == [["a1", "a2"], ["c1"]]  # the others went again, each alone
    assert bad.done() and isinstance(bad.exception(), OverflowError)
    for _, c in sent.batches:
        c.succeed()
    assert good1.done() and good1.exception() is None and good2.done() and good2.exception() is None


def test_a_shared_batch_that_fails_later_is_retried_write_by_write_at_the_next_flush() -> None:
    b, sent, _ = make()
    first, second = b.add(stmts("a1")), b.add(stmts("b1", "b2"))
    b.flush()
    (_, batch), = sent.batches
    batch.fail(RuntimeError("the batch was refused"))  # on the driver's thread
    assert not first.done() and not second.done()  # not failed: neither is known bad yet
    b.flush_if_due()
    assert sent.names()[1:] == [["a1"], ["b1", "b2"]]
    sent.batches[1][1].succeed()
    sent.batches[2][1].fail(RuntimeError("b2 refused"))
    assert first.done() and first.exception() is None
    assert second.done() and isinstance(second.exception(), RuntimeError)


def test_a_lone_write_that_fails_is_not_sent_again() -> None:
    b, sent, _ = make()
    c = b.add(stmts("a1", "a2"))
    b.flush()
    sent.batches[0][1].fail(TimeoutError("write timed out"))
    b.flush_if_due()
    assert sent.names() == [["a1", "a2"]]  # its delivery redoes it
    assert c.done() and isinstance(c.exception(), TimeoutError)


class Value:
    """A bound value that can be watched for collection (tuples and bytes cannot)."""


def test_a_write_kept_after_its_batch_succeeded_no_longer_holds_the_batch_statements() -> None:
    # The dispatcher keeps each event row's write completion (to know its payload is durable)
    # for up to 100,000 events. Each held the whole batch it rode in, every statement and bound
    # value (payloads included): ~200,000 objects after one bench burst, walked by every full
    # collection of the interpreter (~90-300 ms pauses in the first-attempt tail) and memory
    # growing with the batches.
    b, sent, _ = make()
    v = Value()
    watched = weakref.ref(v)
    c = b.add([("insert", (v,))])
    other = b.add(stmts("b1"))
    del v
    b.flush_if_due()
    gc.collect()
    assert watched() is not None  # in flight: a failure would send it again alone
    sent.batches[0][1].succeed()
    sent.batches.clear()  # the request is answered: the driver holds it no more
    gc.collect()
    assert c.done() and c.exception() is None and other.done()
    assert watched() is None, "a done write still holds its batch's statements"


def test_a_new_pace_applies_to_the_next_batches() -> None:
    # The dispatcher paces batches slower while it catches up, and back again after.
    b, sent, clock = make(linger_s=0.020, min_interval_s=0.010)
    b.add(stmts("a"))
    b.flush_if_due()
    sent.batches[0][1].succeed()
    b.pace(linger_s=0.020, min_interval_s=0.020)
    clock.t += 0.015
    b.add(stmts("b"))
    b.flush_if_due()
    assert sent.names() == [["a"]]  # 15 ms after the last one left: waits for 20
    clock.t += 0.0051
    b.flush_if_due()
    assert sent.names() == [["a"], ["b"]]
    sent.batches[1][1].succeed()
    b.pace(linger_s=0.020, min_interval_s=0.010)
    clock.t += 0.0101
    b.add(stmts("c"))
    b.flush_if_due()
    assert sent.names()[-1] == ["c"]
