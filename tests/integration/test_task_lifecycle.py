"""What a cancelled dispatcher leaves in the TaskManager's one Python interpreter.

PyFlink's thread mode calls a function's ``close()`` only when its input ends, never when the
task is cancelled or fails over, so every restart of the job used to leave the previous
dispatcher's Cassandra session (and its connections), I/O loop thread and HTTP pool behind.
Measured here as the TaskManager's TCP connections to Cassandra, on the real stack.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

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


def _a_cancelled_job(job_env: dict[str, str], name: str, port: int) -> tuple[int, set[str], set[str]]:
    """Run a job until its dispatcher has connected, then cancel it: (the TaskManager's pid, its
    connections to ``port`` from before, the job's)."""
    tm = _taskmanager_pid()
    before = _connections_to(tm, port)
    with second_stack(job_env, name, {}):
        return tm, before, _new_settled(tm, port, before)


def test_a_restarted_dispatcher_releases_what_the_cancelled_one_held(job_env: dict[str, str],
                                                                     settings: Settings) -> None:
    port = settings.cassandra.port
    tm, before, of_a = _a_cancelled_job(job_env, "lifecycle-a", port)
    # A is cancelled: its close() is never called. B opens in the same interpreter.
    with second_stack(job_env, "lifecycle-b", {}):
        of_b = _new_settled(tm, port, before | of_a)
        # Closed in the background once B has opened (within seconds).
        left = _still_open_after(tm, port, of_a, timeout=30)
    assert of_b, "job B's dispatcher opened no Cassandra connection"
    assert not left, f"job A's {len(left)} of {len(of_a)} Cassandra connections outlived its cancellation"


def test_a_cancelled_dispatcher_is_released_with_no_job_after_it(job_env: dict[str, str],
                                                                 settings: Settings) -> None:
    port = settings.cassandra.port
    tm, _, of_a = _a_cancelled_job(job_env, "lifecycle-alone", port)
    # Cancelled, and no dispatcher opens after it: the registry's own watcher (every 10 s) releases it.
    left = _still_open_after(tm, port, of_a, timeout=40)
    assert not left, f"{len(left)} of {len(of_a)} Cassandra connections outlived a cancelled job with none after it"
