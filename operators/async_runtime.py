"""A background asyncio loop owned by one operator instance.

Flink calls the operator from its task thread; HTTP and Cassandra I/O run on this loop in a
daemon thread. The operator submits coroutines and later harvests the finished futures from its
own timers, so no callback ever touches Flink state from a foreign thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (requirements pin it): its TLS, socket and scheduling paths are C, and
    this loop shares the TaskManager's one GIL with the task thread, so every microsecond it
    spends in Python is taken from fan-out and dispatch. The stdlib loop is the fallback."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class AsyncRuntime:
    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        # Coroutines submitted and not yet started, and whether the loop has been woken for them.
        # Each wake-up is a write to the loop's self-pipe (a syscall and a GIL hand-off), a share of
        # the task thread at full load worth saving while the loop is often already awake
        # (docs/performance.md#the-taskmanagers-interpreter).
        self._lock = threading.Lock()
        self._inbox: list[tuple[Coroutine[Any, Any, Any], concurrent.futures.Future[Any]]] = []
        self._woken = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return self.submit_all([coro])[0]

    def submit_all(self, coros: list[Coroutine[Any, Any, T]]) -> list[concurrent.futures.Future[T]]:
        """Start coroutines on the loop; the loop thread is woken only if no wake-up is pending
        already (coroutines submitted meanwhile start with the ones before them)."""
        futures: list[concurrent.futures.Future[T]] = [concurrent.futures.Future() for _ in coros]
        with self._lock:
            self._inbox.extend(zip(coros, futures, strict=True))
            wake = not self._woken
            self._woken = True
        if wake:
            self.loop.call_soon_threadsafe(self._start_inbox)
        return futures

    def _start_inbox(self) -> None:
        with self._lock:
            batch, self._inbox, self._woken = self._inbox, [], False
        for coro, fut in batch:
            task = self.loop.create_task(coro)
            task.add_done_callback(functools.partial(_copy_result, fut=fut))

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        """Run a coroutine to completion from the task thread (open/close only)."""
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


def _copy_result(task: asyncio.Task[Any], *, fut: concurrent.futures.Future[Any]) -> None:
    if task.cancelled():
        fut.cancel()
    elif task.exception() is not None:
        fut.set_exception(task.exception())  # type: ignore[arg-type]
    else:
        fut.set_result(task.result())
