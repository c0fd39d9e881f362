"""What the cluster fault tests (`make chaos-cluster`, marker ``chaos_cluster``) share beyond
tests/support/faults.py: a delivery job of the test's own that it can stop, rescale (in place or
from a savepoint) and kill under (topics, keyspace, control plane, parallelism), TaskManagers the
test starts and kills, where a job's subtasks run, the pause a fault causes, and the matrix's
summary line.

The faults run against the stack that is up; WEBHOOKS_CHAOS_STACK names it in the report
('default': the single-node stack of `make up`). The faults that need the cluster topology (a
broker, a Cassandra node, a control-plane replica killed) join as more tests marked
``chaos_cluster`` using the same verdict (faults.verdict with matrix=MATRIX and their pause).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
from cassandra.cluster import Session

from core.settings import Settings
from stack.flink_jobs import InPlaceRescale, cancel, job_sh, rescale_in_place, rest, wait_all_running
from stack.isolation import isolated_env, keyspace_session, settings_with
from stack.topics import create_topics
from tests.support.faults import RUN, FaultResult, _alive
from tests.support.figures import longest_silence
from tests.support.helpers import eventually
from tests.support.receiver import Receiver

# The report this matrix writes (.run/chaos-cluster/) and the stack it ran on.
MATRIX = "chaos-cluster"
DISPATCH = "dispatch (per endpoint)"  # the keyed vertex, by its name's start (jobs/delivery_job.py)
STACK = os.environ.get("WEBHOOKS_CHAOS_STACK", "default")


def cluster_summary(results: list[FaultResult]) -> str:
    """The matrix's last line: every fault counted, lost and unexplained duplicates summed, and the
    longest pause a fault caused (time from the fault to deliveries resuming everywhere)."""
    passed = sum(r.passed for r in results)
    pauses = [r.pause_s for r in results if r.pause_s is not None]
    return (f"chaos-cluster: faults={len(results)} passed={passed} lost={sum(max(0, r.lost) for r in results)} "
            f"unexplained_duplicates={sum(r.unexplained_duplicates for r in results)} "
            f"max_pause_s={max(pauses, default=0.0):.1f}")


# -- a delivery job of the test's own ----------------------------------------------------------------

@dataclass
class OwnJob:
    """A delivery job with its own topics, keyspace and in-process control plane; ``env`` is what
    stack/job.sh needs to stop it with a savepoint and resubmit it from there."""
    env: dict[str, str]
    settings: Settings
    session: Session
    channel: grpc.Channel

    def job_id(self) -> str:
        return job_sh(self.env, "id").strip()

    def stop_with_savepoint(self) -> None:
        job_sh(self.env, "stop")
        eventually(lambda: not self.job_id() or None, timeout=60, what="the job stopped")

    def rescale_in_place(self, parallelism: int) -> InPlaceRescale:
        """The adaptive scheduler's rescale: the same job, restarted from its next checkpoint at
        ``parallelism`` (stack/flink_jobs.rescale_in_place)."""
        job_id = self.job_id()
        rescaled = rescale_in_place(job_id, parallelism, timeout=180)
        assert self.job_id() == job_id, "a rescale in place keeps the job"
        assert dispatch_parallelism(job_id) == parallelism
        return rescaled

    def resume(self, parallelism: int) -> str:
        """Resubmit from the newest savepoint at ``parallelism``; returns the running job's id."""
        env = {**self.env, "WEBHOOKS_FLINK__PARALLELISM": str(parallelism)}
        out = job_sh(env, "submit")
        assert "resuming" in out and "savepoint-" in out, out
        job_id = self.job_id()
        wait_all_running(job_id, timeout=180)
        restored = rest(f"/jobs/{job_id}/checkpoints")["latest"]["restored"]
        assert restored is not None and restored["is_savepoint"] is True, restored
        assert dispatch_parallelism(job_id) == parallelism
        return job_id


@contextlib.contextmanager
def own_job(job_env: dict[str, str], run: str, overrides: dict[str, str]) -> Iterator[OwnJob]:
    """Submit the job (its settings: the session's ``job_env`` + ``overrides``); cancel whatever
    incarnation runs at the end and stop its control plane."""
    env = {**job_env, **isolated_env(f"{run}-{uuid.uuid4().hex[:6]}", own_keyspace=True), **overrides}
    settings = settings_with(env)
    create_topics(settings.kafka)
    from control_plane.server import build

    with keyspace_session(settings) as session:
        server = build(settings, session, port=0)
        server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        job = OwnJob(env, settings, session, channel)
        try:
            grpc.channel_ready_future(channel).result(timeout=10)
            job_sh(env, "submit")
            wait_all_running(job.job_id(), timeout=180)
            yield job
        finally:
            with contextlib.suppress(Exception):
                for jid in {job.job_id()} - {""}:
                    cancel(jid)
            channel.close()
            server.stop(grace_s=2)


def dispatch_parallelism(job_id: str) -> int:
    """Subtasks of the job's keyed dispatch vertex."""
    (p,) = [v["parallelism"] for v in rest(f"/jobs/{job_id}")["vertices"] if v["name"].startswith(DISPATCH)]
    return int(p)


def max_parallelism(job_id: str) -> set[int]:
    """The max parallelism (number of key groups) of the job's vertices, as Flink reports it."""
    plan = rest(f"/jobs/{job_id}/plan")["plan"]["nodes"]
    return {int(n["maxParallelism"]) for n in plan if "maxParallelism" in n} or {
        int(v.get("maxParallelism", -1)) for v in rest(f"/jobs/{job_id}")["vertices"]}


# -- TaskManagers a test starts and kills ---------------------------------------------------------------

def resource_id(part: str) -> str:
    """The ResourceID of the TaskManager stack/flink.sh started as ``part`` (its log is appended to
    on every start, so the last one)."""
    log = RUN / "flink" / "log" / f"{part}.log"
    ids = re.findall(r"Starting TaskManager with ResourceID: (\S+)", log.read_text())
    assert ids, f"no ResourceID in {log}"
    return ids[-1]


def placement(job_id: str, vertex_prefix: str) -> dict[int, str]:
    """Subtask index -> ResourceID of the TaskManager running it, for the vertex whose name starts
    with ``vertex_prefix`` (operators chained into one task share its vertex)."""
    for v in rest(f"/jobs/{job_id}")["vertices"]:
        if v["name"].startswith(vertex_prefix):
            subtasks = rest(f"/jobs/{job_id}/vertices/{v['id']}")["subtasks"]
            return {int(s["subtask"]): str(s["taskmanager-id"]) for s in subtasks}
    raise AssertionError(f"no vertex named like {vertex_prefix!r} in job {job_id}")


def sigkill_taskmanager(part: str) -> int:
    """SIGKILL a TaskManager this test started (its process group, as an OOM kill or a lost host
    would); returns the kill time (ms). Never the stack's own flink-tm: others' jobs run there."""
    assert part.startswith("flink-tm-"), part
    pid = int((RUN / part / "pid").read_text())
    killed_at_ms = int(time.time() * 1000)
    os.killpg(pid, signal.SIGKILL)
    eventually(lambda: not _alive(pid) or None, timeout=30, interval=0.2, what=f"TaskManager {part} gone")
    return killed_at_ms


def restarted_vertices(job_id: str, since_ms: int) -> tuple[int, int]:
    """(vertices whose every subtask was (re)deployed after ``since_ms``, all vertices)."""
    vertices = rest(f"/jobs/{job_id}")["vertices"]
    return sum(1 for v in vertices if v["start-time"] > since_ms), len(vertices)


def silence_after(receiver: Receiver, paths: list[str], since: float) -> dict[str, float]:
    """Per endpoint path, the longest time after ``since`` in which it received nothing between two
    requests: the pause a fault at ``since`` caused it (paths without a request after it are left
    out). A gap, not the first request after the fault: tasks Flink has not cancelled yet keep
    sending until it notices the fault, then stop for the restart too."""
    out: dict[str, float] = {}
    for path in paths:
        silence = longest_silence((r.received_at for r in receiver.requests(path)), since)
        if silence is not None:
            out[path] = silence
    return out
