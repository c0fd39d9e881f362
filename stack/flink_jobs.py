"""Jobs on the local Flink cluster, for tests and the benchmark: its REST API, `stack/job.sh`
with a run's WEBHOOKS_* environment, and waiting until a job really runs."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from core.settings import REPO_ROOT

REST = f"http://127.0.0.1:{os.environ.get('WEBHOOKS_FLINK_REST_PORT', '8081')}"


def rest(path: str, method: str = "GET") -> Any:
    req = urllib.request.Request(REST + path, method=method)
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body else {}


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
