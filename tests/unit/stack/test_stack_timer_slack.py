"""Every server the stack scripts start runs with the stack's timer slack (stack/lib.sh start_bg).

Cassandra's request workers nap 10 us at a time for ~10 ms after each request before they sleep for
good; with the kernel's default slack (50 us) that is hundreds of wake-ups per request, which was
most of Cassandra's CPU per delivery (docs/operating.md, deployment notes). start_bg sets the slack before it
execs the server, so the server and every thread it makes inherit it.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

STACK = Path(__file__).parents[3] / "stack"


def _start(tmp_path: Path, slack: str | None) -> int:
    env = {"PATH": os.environ["PATH"], "WEBHOOKS_RUN_DIR": str(tmp_path), "TOPOLOGY": "single"}
    if slack is not None:
        env["WEBHOOKS_TIMER_SLACK_NS"] = slack
    subprocess.run(["bash", "-c", f"source {STACK / 'lib.sh'} && start_bg probe {tmp_path}/probe.log "
                    "python3 -c 'import time; time.sleep(30)'"], env=env, check=True, timeout=30)
    pid = int((tmp_path / "probe" / "pid").read_text())
    deadline = time.monotonic() + 10  # until the subshell has exec'd the server
    while not _argv0(pid).endswith(b"python3") and time.monotonic() < deadline:
        time.sleep(0.02)
    return pid


def _argv0(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]


def _slack(pid: int) -> int:
    return int(Path(f"/proc/{pid}/timerslack_ns").read_text())


@pytest.mark.parametrize(("setting", "expected"), [
    (None, 1_000_000),          # the stack's default: 1 ms
    ("250000", 250_000),        # WEBHOOKS_TIMER_SLACK_NS
    ("default", None),          # untouched: what this test process has (the kernel's 50 us)
])
def test_a_server_started_by_the_stack_runs_with_its_timer_slack(tmp_path: Path, setting: str | None,
                                                                 expected: int | None) -> None:
    if expected is None:
        expected = _slack(os.getpid())
    pid = _start(tmp_path, setting)
    try:
        assert _slack(pid) == expected
    finally:
        os.kill(pid, 9)


def test_the_recorded_pid_is_the_server_itself(tmp_path: Path) -> None:
    # The pid start_bg records is what stop_part signals: setting the slack must not leave a shell
    # in between (the subshell execs setsid, which execs the server).
    pid = _start(tmp_path, None)
    try:
        assert _argv0(pid).endswith(b"python3")
    finally:
        os.kill(pid, 9)
