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


class AsyncRuntime:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def submit_all(self, coros: list[Coroutine[Any, Any, T]]) -> list[concurrent.futures.Future[T]]:
        """Start several coroutines with a single wake-up of the loop thread (each
        run_coroutine_threadsafe call writes to the loop's self-pipe)."""
        futures: list[concurrent.futures.Future[T]] = [concurrent.futures.Future() for _ in coros]

        def start() -> None:
            for coro, fut in zip(coros, futures, strict=True):
                task = self.loop.create_task(coro)
                task.add_done_callback(functools.partial(_copy_result, fut=fut))

        self.loop.call_soon_threadsafe(start)
        return futures

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
