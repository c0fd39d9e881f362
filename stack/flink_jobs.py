"""Jobs on the local Flink cluster, for tests and the benchmark: its REST API, `stack/job.sh`
with a run's WEBHOOKS_* environment, and waiting until a job really runs."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.request
from typing import Any

from core.settings import REPO_ROOT

REST = f"http://127.0.0.1:{os.environ.get('WEBHOOKS_FLINK_REST_PORT', '8081')}"


def rest(path: str, method: str = "GET") -> dict[str, Any]:
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


def cancel(job_id: str) -> None:
    with contextlib.suppress(OSError):  # the cluster may already be going down
        rest(f"/jobs/{job_id}?mode=cancel", method="PATCH")
