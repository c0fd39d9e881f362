"""What a cancelled dispatcher leaves in the TaskManager's one Python interpreter.

PyFlink's thread mode calls a function's ``close()`` only when its input ends, never when the
task is cancelled or fails over, so every restart of the job used to leave the previous
dispatcher's Cassandra session (and its connections), I/O loop thread and HTTP pool behind.
Measured here as the TaskManager's TCP connections to Cassandra, on the real stack.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.settings import Settings
from tests.support.helpers import eventually
from tests.support.stack_fixtures import second_stack

RUN = Path(__file__).resolve().parents[2] / ".run"


def _taskmanager_pid() -> int:
    return int((RUN / "flink-tm" / "pid").read_text())


def _connections_to(pid: int, port: int) -> set[str]:
    """The socket inodes of the process's ESTABLISHED TCP connections to ``port``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed while we looked
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "01" and int(f[2].rsplit(":", 1)[1], 16) == port and f[9] in inodes:
                found.add(f[9])
    return found


def _new_settled(pid: int, port: int, known: set[str], timeout: float = 90) -> set[str]:
    """Connections not in ``known`` once there are some and the set has not changed for 3 s
    (a dispatcher opens its Cassandra session after its task is RUNNING)."""
    seen: list[tuple[float, frozenset[str]]] = []

    def stable() -> set[str] | None:
        now = frozenset(_connections_to(pid, port))
        seen.append((time.monotonic(), now))
        recent = {c for t, c in seen if t >= seen[-1][0] - 3}
        settled = seen[0][0] <= seen[-1][0] - 3 and len(recent) == 1
        return set(now - known) if settled and now - known else None

    return eventually(stable, timeout=timeout, interval=0.5, what=f"new connections to :{port}, settled")


def _still_open_after(pid: int, port: int, conns: set[str], timeout: float) -> set[str]:
    """Which of ``conns`` are still open once they all closed or ``timeout`` s passed."""
    deadline = time.monotonic() + timeout
    while (left := conns & _connections_to(pid, port)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@dataclass
class Lifecycle:
    """Job A run until its dispatcher connected, then cancelled; job B run after it in the same
    TaskManager, then cancelled too, with no job after it."""

    of_a: set[str]  # A's connections to Cassandra
    of_b: set[str]  # B's
    a_left: set[str]  # A's still open once B had opened (and 30 s had passed, at most)
    b_left: set[str]  # B's still open 40 s after its cancellation, at most


@pytest.fixture(scope="module")
def lifecycle(job_env: dict[str, str], settings: Settings) -> Lifecycle:
    """Both tests' jobs, in one sequence: B, cancelled with no job after it, is the second test's
    cancelled dispatcher (a job of its own would cost a third submission)."""
    port = settings.cassandra.port
    tm = _taskmanager_pid()
    before = _connections_to(tm, port)
    with second_stack(job_env, "lifecycle-a", {}):
        of_a = _new_settled(tm, port, before)
    # A is cancelled: its close() is never called. B opens in the same interpreter.
    with second_stack(job_env, "lifecycle-b", {}):
        of_b = _new_settled(tm, port, before | of_a)
        # Closed in the background once B has opened (within seconds).
        a_left = _still_open_after(tm, port, of_a, timeout=30)
    # Cancelled, and no dispatcher opens after it: the registry's own watcher (every 10 s) releases it.
    b_left = _still_open_after(tm, port, of_b, timeout=40)
    return Lifecycle(of_a, of_b, a_left, b_left)


def test_a_restarted_dispatcher_releases_what_the_cancelled_one_held(lifecycle: Lifecycle) -> None:
    assert lifecycle.of_b, "job B's dispatcher opened no Cassandra connection"
    assert not lifecycle.a_left, (f"job A's {len(lifecycle.a_left)} of {len(lifecycle.of_a)} Cassandra connections"
                                  " outlived its cancellation")


def test_a_cancelled_dispatcher_is_released_with_no_job_after_it(lifecycle: Lifecycle) -> None:
    assert not lifecycle.b_left, (f"{len(lifecycle.b_left)} of {len(lifecycle.of_b)} Cassandra connections outlived"
                                  " a cancelled job with none after it")
