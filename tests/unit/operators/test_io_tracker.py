"""operators/io_tracker.py and operators/wakes.py: which endpoints have I/O finished, and whether a
timer needs a pass. Futures are completed from another thread, as the I/O loop does."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from operators.io_tracker import IoTracker
from operators.wakes import Wakes
from operators.write_batcher import BatchCompletion


def complete_elsewhere(fut: concurrent.futures.Future[str], value: str) -> None:
    t = threading.Thread(target=fut.set_result, args=(value,))
    t.start()
    t.join()


def test_a_future_finished_on_another_thread_marks_only_its_endpoint() -> None:
    io = IoTracker()
    a: concurrent.futures.Future[str] = concurrent.futures.Future()
    b: concurrent.futures.Future[str] = concurrent.futures.Future()
    io.add("ep-a", "send", "d1", a, now_ms=0)
    io.add("ep-b", "send", "d2", b, now_ms=0)
    assert not io.has_finished("ep-a") and not io.has_finished("ep-b")
    complete_elsewhere(a, "ok")
    assert io.has_finished("ep-a") and not io.has_finished("ep-b")
    [f] = io.finished("ep-a")
    assert (f.kind, f.key, f.result, f.exc) == ("send", "d1", "ok", None)
    assert not io.has_finished("ep-a") and not io.busy("ep-a") and io.busy("ep-b")


def test_a_future_done_before_it_was_added_is_ready_at_once() -> None:
    io = IoTracker()
    fut: concurrent.futures.Future[str] = concurrent.futures.Future()
    fut.set_result("early")
    io.add("ep", "check", "d1", fut, now_ms=0)
    assert io.has_finished("ep")
    assert [f.result for f in io.finished("ep")] == ["early"]


def test_one_finishing_after_the_scan_is_reported_again() -> None:
    io = IoTracker()
    first: concurrent.futures.Future[str] = concurrent.futures.Future()
    second: concurrent.futures.Future[str] = concurrent.futures.Future()
    io.add("ep", "send", "d1", first, now_ms=0)
    io.add("ep", "send", "d2", second, now_ms=0)
    complete_elsewhere(first, "one")
    assert [f.key for f in io.finished("ep")] == ["d1"]
    assert not io.has_finished("ep")
    complete_elsewhere(second, "two")
    assert io.has_finished("ep")
    assert [f.key for f in io.finished("ep")] == ["d2"]


def test_a_completion_that_cannot_call_back_is_polled() -> None:
    io = IoTracker()
    write = BatchCompletion()
    io.add("ep", "persist", "d1", write, now_ms=0)
    assert not io.has_finished("ep")
    write.succeed()
    assert io.has_finished("ep")
    [f] = io.finished("ep")
    assert (f.kind, f.exc) == ("persist", None)


def test_a_failure_is_finished_with_its_exception() -> None:
    io = IoTracker()
    fut: concurrent.futures.Future[str] = concurrent.futures.Future()
    io.add("ep", "load", "d1", fut, now_ms=0)
    fut.set_exception(TimeoutError("slow"))
    [f] = io.finished("ep")
    assert f.result is None and isinstance(f.exc, TimeoutError)


@pytest.mark.parametrize(("started", "now", "poll"), [
    (0, 0, 10),  # young: every base interval
    (0, 20, 30),  # a quarter of 20 ms is below the base
    (0, 400, 500),  # a quarter of its age
    (0, 10_000, 11_000),  # at most once a second
])
def test_polls_back_off_with_the_age_of_the_youngest_io(started: int, now: int, poll: int) -> None:
    io = IoTracker()
    io.add("ep", "send", "d1", concurrent.futures.Future(), now_ms=started)
    assert io.poll_at("ep", now, base_ms=10, busy_max_ms=40) == poll
    assert io.poll_at("idle", now, base_ms=10, busy_max_ms=40) is None


@pytest.mark.parametrize(("in_flight", "base", "busy_max", "interval"), [
    (0, 10, 40, 10),
    (1, 10, 40, 10),  # light load: one request at a time is noticed within the base interval
    (2, 10, 40, 10),  # its creation write and its send, or two sends
    (3, 10, 40, 10),
    (4, 10, 40, 20),
    (6, 10, 40, 30),
    (8, 10, 40, 40),  # a full endpoint (eight requests): a look finds several
    (24, 10, 40, 40),  # never past the cap
    (24, 10, 10, 10),  # equal settings: a fixed interval, as before
    (8, 25, 10, 25),  # a cap below the base is the base
])
def test_busy_endpoints_are_looked_at_less_often(in_flight: int, base: int, busy_max: int, interval: int) -> None:
    io = IoTracker()
    for n in range(in_flight):
        io.add("ep", "send", f"d{n}", concurrent.futures.Future(), now_ms=0)
    assert io.poll_interval("ep", base, busy_max) == interval
    if in_flight:
        assert io.poll_at("ep", 0, base, busy_max) == interval  # young I/O: the interval itself


def test_an_endpoint_without_a_pass_in_this_incarnation_always_gets_one() -> None:
    # A restore re-fires checkpointed timers: the driver must be rebuilt from keyed state.
    assert Wakes().needs_pass("ep", 1_000, IoTracker())


@pytest.mark.parametrize(("driver_wake", "now", "finished", "needs"), [
    (None, 100, False, False),  # only a poll, nothing finished
    (500, 100, False, False),  # a retry later, nothing finished
    (500, 500, False, True),  # the driver's wake is due
    (500, 100, True, True),  # I/O finished
    (None, 100, True, True),
])
def test_a_timer_needs_a_pass_only_for_finished_io_or_a_due_wake(driver_wake: int | None, now: int,
                                                                  finished: bool, needs: bool) -> None:
    io = IoTracker()
    fut: concurrent.futures.Future[str] = concurrent.futures.Future()
    io.add("ep", "send", "d1", fut, now_ms=0)
    if finished:
        complete_elsewhere(fut, "ok")
    wakes = Wakes()
    wakes.asked("ep", driver_wake)
    assert wakes.needs_pass("ep", now, io) is needs


def test_a_dropped_driver_is_forgotten() -> None:
    wakes = Wakes()
    wakes.asked("ep", None)
    assert not wakes.needs_pass("ep", 0, IoTracker())
    wakes.forget("ep")
    assert wakes.needs_pass("ep", 0, IoTracker())


def test_the_timer_is_the_earlier_of_the_driver_wake_and_the_poll_and_set_once() -> None:
    wakes = Wakes()
    wakes.asked("ep", 1_000)
    assert wakes.next_timer("ep", 110, now_ms=100) == 110  # the poll first
    assert wakes.next_timer("ep", 120, now_ms=105) is None  # 110 is set and comes first
    wakes.fired("ep", 110)
    assert wakes.next_timer("ep", None, now_ms=110) == 1_000  # I/O done: the driver's reason
    assert wakes.next_timer("ep", 2_000, now_ms=120) is None
    wakes.asked("ep", None)
    assert wakes.next_timer("ep", None, now_ms=130) is None  # nothing to wake for


def test_a_wake_in_the_past_is_set_just_after_now() -> None:
    wakes = Wakes()
    wakes.asked("ep", 50)
    assert wakes.next_timer("ep", None, now_ms=100) == 101


def test_a_hold_replaces_the_timers_and_is_the_only_reason() -> None:
    wakes = Wakes()
    wakes.asked("ep", 200)
    assert wakes.next_timer("ep", 110, now_ms=100) == 110
    wakes.held("ep", 5_000)
    assert wakes.timer_for("ep", 5_000, now_ms=100) == 5_000
    assert not wakes.needs_pass("ep", 4_999, IoTracker())
    assert wakes.needs_pass("ep", 5_000, IoTracker())
