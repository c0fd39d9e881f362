"""Jobs on the local Flink cluster, for tests, the benchmark and the stack scripts: its REST API,
`stack/job.sh` with a run's WEBHOOKS_* environment, waiting until a job really runs, and changing
a running job's parallelism in place through the adaptive scheduler's resource requirements
(`stack/job.sh rescale N` runs `python -m stack.flink_jobs rescale <job id> <parallelism>`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from core.settings import REPO_ROOT

REST = f"http://127.0.0.1:{os.environ.get('WEBHOOKS_FLINK_REST_PORT', '8081')}"

# The delivery job's vertices that run on one subtask at any parallelism (jobs/delivery_job.py:
# the endpoints topic's reader and normalizer, pinned with everything upstream of them, keep
# configs and clock ticks in the topic's order): a vertex whose name contains one of these, and
# every vertex upstream of it, keeps its parallelism when the job is rescaled.
# tests/unit/jobs/test_one_subtask_vertices.py checks these against the job's own names.
ONE_SUBTASK = ("parse endpoint configs", "endpoint configs for dispatch")


def rest(path: str, method: str = "GET", body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(REST + path, method=method, data=data,
                                 headers={} if data is None else {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        answer = r.read()
    return json.loads(answer) if answer else {}


def job_sh(env: dict[str, str], action: str, timeout: float = 300) -> str:
    """Run `stack/job.sh <action>` (submit, stop, id) with ``env`` on top of ours; its stdout."""
    out = subprocess.run(["bash", str(REPO_ROOT / "stack/job.sh"), action], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"job.sh {action} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def wait_all_running(job_id: str, timeout: float = 120) -> None:
    """Until the job and every one of its vertices run; a job that ended fails at once."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = rest(f"/jobs/{job_id}")
        if d["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in d["vertices"]):
            return
        if d["state"] in ("FAILED", "CANCELED", "FINISHED"):
            break
        time.sleep(0.5)
    raise RuntimeError(f"job {job_id} not running after {timeout}s: "
                       f"{json.dumps(rest(f'/jobs/{job_id}/exceptions'))[:3000]}")


def operator_metric(job_id: str, name: str) -> float:
    """A user metric (counter or gauge) of the job, summed over every vertex and subtask that
    reports it; 0 when none does yet."""
    total = 0.0
    for v in rest(f"/jobs/{job_id}")["vertices"]:
        base = f"/jobs/{job_id}/vertices/{v['id']}/subtasks/metrics"
        ids = [m["id"] for m in rest(base) if m["id"].split(".")[-1] == name]  # type: ignore[union-attr]
        if ids:
            # Ids carry the operator name ("dedupe_+_fan-out.x"): a raw "+" would read as a space.
            get = urllib.parse.quote(",".join(ids), safe=",")
            for m in rest(f"{base}?get={get}&agg=sum"):  # type: ignore[union-attr]
                total += float(m.get("sum", 0))
    return total


def cancel(job_id: str) -> None:
    with contextlib.suppress(OSError):  # the cluster may already be going down
        rest(f"/jobs/{job_id}?mode=cancel", method="PATCH")


@contextlib.contextmanager
def extra_taskmanagers(n: int, say: Callable[[str], None] = lambda _msg: None) -> Iterator[list[str]]:
    """n more TaskManagers (stack/flink.sh add-tm) for a run or a test, stopped by their pids after;
    yields their parts (flink-tm-2, ...), which a fault test may kill."""
    parts: list[str] = []
    try:
        for _ in range(n):
            out = subprocess.run(["bash", str(REPO_ROOT / "stack/flink.sh"), "add-tm"], check=True,
                                 capture_output=True, text=True, timeout=180)
            parts.append(out.stdout.strip().splitlines()[-1])
            say(f"started TaskManager {parts[-1]}")
        yield parts
    finally:
        for part in parts:
            subprocess.run(["bash", str(REPO_ROOT / "stack/flink.sh"), "stop-tm", part], check=False,
                           capture_output=True, timeout=120)
            say(f"stopped TaskManager {part}")


# -- rescaling a running job in place (the adaptive scheduler) ----------------------------------------

def scheduler() -> str:
    """The scheduler the cluster runs jobs with, as its configuration says (`default` when unset)."""
    conf = {c["key"]: c["value"] for c in rest("/jobmanager/config")}
    return str(conf.get("jobmanager.scheduler", "default")).lower()


def one_subtask_vertices(names: Mapping[str, str], inputs: Mapping[str, list[str]],
                         markers: tuple[str, ...] = ONE_SUBTASK) -> set[str]:
    """The vertices (ids) that stay at one subtask: each whose name contains a marker, and every
    vertex upstream of one. ``names``: vertex id -> name; ``inputs``: vertex id -> the ids of the
    vertices it reads from (the job plan's edges)."""
    pinned: set[str] = set()
    todo = [v for v, name in names.items() if any(m in name for m in markers)]
    while todo:
        v = todo.pop()
        if v not in pinned:
            pinned.add(v)
            todo.extend(inputs.get(v, []))
    return pinned


def rescaled_requirements(current: Mapping[str, Any], pinned: set[str], parallelism: int,
                          max_parallelism: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The body of `PUT /jobs/:jobid/resource-requirements` that runs every vertex but ``pinned``
    at ``parallelism``: vertex id -> {"parallelism": {"lowerBound": 1, "upperBound": N}}, from
    the job's current requirements (the GET of the same path, which lists every vertex; the PUT
    must too). The lower bound stays 1 as Flink sets it, so the job keeps running with fewer
    slots if a TaskManager is lost rather than waiting for its replacement. A parallelism above a
    vertex's max parallelism (its key groups) cannot be reached by any restore: refused here."""
    if parallelism < 1:
        raise ValueError(f"parallelism must be at least 1, not {parallelism}")
    over = {v: m for v, m in (max_parallelism or {}).items() if v not in pinned and m < parallelism}
    if over:
        raise ValueError(f"parallelism {parallelism} exceeds the max parallelism of vertices {over} "
                         "(fixed for the life of the job's state)")
    out: dict[str, Any] = {}
    for vertex, req in current.items():
        bounds = req["parallelism"]
        if vertex in pinned:
            out[vertex] = {"parallelism": {"lowerBound": bounds["lowerBound"], "upperBound": bounds["upperBound"]}}
        else:
            out[vertex] = {"parallelism": {"lowerBound": 1, "upperBound": parallelism}}
    return out


# How stale the REST API's view of a job may be: its handlers read an execution graph cached for
# web.refresh-interval (Flink's default 3 s; flink-conf/config.yaml does not set it).
REST_CACHE_S = 3.0


@dataclass(frozen=True)
class InPlaceRescale:
    """When a rescale was asked for, when the job was first seen not running every task (None:
    no poll saw it), and when it was seen running every task at the new parallelism (epoch s).
    The two seen times come from polls every 0.2 s of a view up to REST_CACHE_S old."""
    requested_at: float
    stopped_at: float | None
    running_at: float

    @property
    def not_running_s(self) -> float | None:
        """How long the job was seen not running every task; None when no poll saw it (a pause
        shorter than the REST API's cache can fall between two of its refreshes)."""
        return None if self.stopped_at is None else self.running_at - self.stopped_at

    def not_running_text(self) -> str:
        """not_running_s for a person: seconds, or why there is no figure."""
        s = self.not_running_s
        return f"{s:.1f} s" if s is not None else f"not seen (a pause under the REST API's {REST_CACHE_S:g} s cache)"


def rescale_in_place(job_id: str, parallelism: int, timeout: float = 180) -> InPlaceRescale:
    """Change a running job's parallelism through the adaptive scheduler and wait until it runs
    every task at it. The scheduler restarts the job from its next completed checkpoint (its
    state redistributed by key group); the job id stays. Needs `jobmanager.scheduler: adaptive`."""
    if (kind := scheduler()) != "adaptive":
        raise RuntimeError(f"the cluster runs the {kind} scheduler, which cannot change a running job's "
                           "parallelism: set WEBHOOKS_FLINK_SCHEDULER=adaptive (flink-conf/config.yaml) and "
                           "restart Flink, or stop the job with a savepoint and submit it at the new parallelism")
    job = rest(f"/jobs/{job_id}")
    names = {v["id"]: v["name"] for v in job["vertices"]}
    plan = rest(f"/jobs/{job_id}/plan")["plan"]["nodes"]
    inputs = {n["id"]: [i["id"] for i in n.get("inputs", [])] for n in plan}
    max_p = {n["id"]: int(n["maxParallelism"]) for n in plan if "maxParallelism" in n}
    pinned = one_subtask_vertices(names, inputs)
    body = rescaled_requirements(rest(f"/jobs/{job_id}/resource-requirements"), pinned, parallelism, max_p)
    requested_at = time.time()
    rest(f"/jobs/{job_id}/resource-requirements", method="PUT", body=body)
    stopped_at: float | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = rest(f"/jobs/{job_id}")
        if d["state"] in ("FAILED", "CANCELED", "FINISHED"):
            break
        running = d["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in d["vertices"])
        if not running and stopped_at is None:
            stopped_at = time.time()
        if running and all(v["parallelism"] == parallelism for v in d["vertices"] if v["id"] not in pinned):
            return InPlaceRescale(requested_at, stopped_at, time.time())
        time.sleep(0.2)
    raise RuntimeError(f"job {job_id} not running at parallelism {parallelism} {timeout:g} s after asking: "
                       f"{json.dumps(rest(f'/jobs/{job_id}/exceptions'))[:3000]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack.flink_jobs", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rescale = sub.add_parser("rescale", help="run a job at another parallelism, in place (adaptive scheduler)")
    rescale.add_argument("job_id")
    rescale.add_argument("parallelism", type=int)
    rescale.add_argument("--timeout", type=float, default=180)
    args = parser.parse_args(argv)
    try:
        r = rescale_in_place(args.job_id, args.parallelism, args.timeout)
    except (RuntimeError, ValueError) as exc:
        print(f"rescale: {exc}", file=sys.stderr)
        return 1
    print(f"job {args.job_id} running at parallelism {args.parallelism} {r.running_at - r.requested_at:.1f} s "
          f"after asking (not running every task: {r.not_running_text()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
