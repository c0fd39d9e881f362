"""Releasing what an operator of an ended task left in the TaskManager's Python interpreter.

In thread mode PyFlink calls a function's ``close()`` only when its input ends. A task that is
cancelled, fails over or stops with a savepoint never calls it (flink-python 2.2.1:
``AbstractOneInputEmbeddedPythonFunctionOperator`` invokes "close" from ``endInput()`` alone),
and the interpreter lives as long as the TaskManager. What the dispatcher opened -- a Cassandra
session, its I/O loop's thread, the HTTP connection pool -- outlived its task: every restart of
the job left one more of each (docs/performance.md#restores-and-leaked-resources), and each
leaked session's control connection re-read the schema at every keyspace change.

So an operator that opens resources registers how to release them under the native id of its
task thread: Flink runs each task on a thread of its own, which ends with the task. Whenever an
operator opens (the restarted one, or another job's), and every ``sweep_every_s`` on a watcher
thread of the registry's own while anything is registered, the registrations whose thread is
gone are released -- on a thread of their own, so no task waits for a session to shut down. The
watcher is what releases a job cancelled with none after it (no operator would open or run to
do it); it ends when nothing is registered and starts again with the next registration.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

Release = Callable[[], None]


def thread_alive(native_id: int) -> bool:
    """Whether this process still has the thread (Linux); True when it cannot tell, so that a
    platform without /proc leaks as before rather than closing a live operator's resources."""
    if not os.path.isdir("/proc/self/task"):
        return True
    return os.path.exists(f"/proc/self/task/{native_id}")


class Registry:
    def __init__(self, alive: Callable[[int], bool] = thread_alive, sweep_every_s: float = 10.0) -> None:
        self._alive = alive
        self._sweep_every_s = sweep_every_s
        self._lock = threading.Lock()
        self._owned: dict[int, tuple[int, str, Release]] = {}  # token -> (thread id, what, release)
        self._next_token = 0
        self._watcher: threading.Thread | None = None

    def register(self, what: str, release: Release, native_id: int | None = None) -> int:
        """Own ``release`` by the calling task thread (or ``native_id``); returns a token for
        :meth:`unregister`."""
        tid = threading.get_native_id() if native_id is None else native_id
        with self._lock:
            self._next_token += 1
            self._owned[self._next_token] = (tid, what, release)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="task-resources-watch", daemon=True)
                self._watcher.start()
            return self._next_token

    def unregister(self, token: int) -> None:
        """Its owner closed it itself (its input ended)."""
        with self._lock:
            self._owned.pop(token, None)

    def sweep(self) -> list[str]:
        """Release, in the background, what belongs to threads that are gone; returns what."""
        with self._lock:
            ended = [t for t, (tid, _, _) in self._owned.items() if not self._alive(tid)]
            found = [self._owned.pop(t) for t in ended]
        if found:
            threading.Thread(target=_release_all, args=(found,), name="release-ended-tasks", daemon=True).start()
        return [what for _, what, _ in found]

    @property
    def watching(self) -> bool:
        with self._lock:
            return self._watcher is not None

    def _watch(self) -> None:
        while True:
            time.sleep(self._sweep_every_s)
            self.sweep()
            with self._lock:
                if not self._owned:  # the next register() starts another watcher
                    self._watcher = None
                    return

    def __len__(self) -> int:
        return len(self._owned)


def _release_all(found: list[tuple[int, str, Release]]) -> None:
    for tid, what, release in found:
        try:
            release()
            log.info("released %s of ended task thread %d", what, tid)
        except Exception:  # noqa: BLE001 -- best effort: the rest must still be released
            log.exception("releasing %s of ended task thread %d failed", what, tid)


# One per interpreter: every job the TaskManager runs shares it.
REGISTRY = Registry()
