"""The registry that releases what operators of ended tasks left behind (pure: fake threads, clock)."""

from __future__ import annotations

import threading
import time

from operators.task_resources import Registry, thread_alive


class Released:
    """Records releases (they run on the registry's own thread) and waits for ``n`` of them."""

    def __init__(self, n: int) -> None:
        self.names: list[str] = []
        self._n = n
        self._done = threading.Event()

    def release(self, name: str, fail: bool = False):  # type: ignore[no-untyped-def]
        def go() -> None:
            self.names.append(name)
            if len(self.names) == self._n:
                self._done.set()
            if fail:
                raise RuntimeError("boom")
        return go

    def wait(self) -> list[str]:
        assert self._done.wait(5), f"released only {self.names}"
        return sorted(self.names)


def test_only_what_ended_threads_own_is_released_once() -> None:
    dead = {1, 3}
    reg = Registry(alive=lambda tid: tid not in dead)
    r = Released(2)
    reg.register("a", r.release("a", fail=True), native_id=1)  # a failing release does not stop the rest
    reg.register("b", r.release("b"), native_id=2)
    reg.register("c", r.release("c"), native_id=3)
    assert sorted(reg.sweep()) == ["a", "c"]
    assert r.wait() == ["a", "c"]
    assert reg.sweep() == [] and len(reg) == 1  # released once; b's thread still runs


def test_an_owner_that_closed_itself_is_not_released_again() -> None:
    reg = Registry(alive=lambda tid: False)
    token = reg.register("a", lambda: (_ for _ in ()).throw(AssertionError("released twice")), native_id=1)
    reg.unregister(token)
    assert reg.sweep() == []


def test_the_watcher_releases_an_ended_owner_with_no_sweep_called_and_then_stops() -> None:
    # A job cancelled with no job after it: no operator opens or runs to sweep.
    alive = {7: True}
    reg = Registry(alive=lambda tid: alive[tid], sweep_every_s=0.02)
    r = Released(1)
    reg.register("x", r.release("x"), native_id=7)
    assert reg.watching
    time.sleep(0.1)
    assert r.names == [] and len(reg) == 1  # its thread still runs: kept
    alive[7] = False
    assert r.wait() == ["x"]
    deadline = time.monotonic() + 5
    while reg.watching and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not reg.watching  # nothing registered: no thread left waking up
    r2 = Released(1)
    reg.register("y", r2.release("y"), native_id=8)
    alive[8] = False
    assert reg.watching and r2.wait() == ["y"]  # a later registration watches again


def test_the_calling_thread_owns_by_default_and_is_seen_alive() -> None:
    reg = Registry()
    reg.register("mine", lambda: None)
    assert reg.sweep() == [] and len(reg) == 1
    assert thread_alive(threading.get_native_id())
    done = []
    t = threading.Thread(target=lambda: done.append(threading.get_native_id()))
    t.start()
    t.join()
    deadline = time.monotonic() + 5  # the kernel forgets a thread shortly after join() returns
    while thread_alive(done[0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not thread_alive(done[0])
