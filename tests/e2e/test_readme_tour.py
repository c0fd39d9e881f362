"""The README's five-minute tour, run as written on the real stack.

The commands are read from the tour's code block in README.md (not copied here), so a tour that
stops working, or a README edit that breaks it, fails this test. Each line runs in bash with the
environment the lines before it left, as in a terminal; `webhookctl listen` runs in a second
"terminal" beside them. Only addresses are substituted: the session's own control plane, outbox
and listener port (environment variables webhookctl already reads), and `<delivery_id>` by the
id the listener printed, as a reader would.

The tour's `curl` line calls the HTTP API at the stack's address (127.0.0.1:8088), which becomes
the session's, as webhookctl's addresses do.
`make run LOCAL_RECEIVERS=1` is not run (it would start or reconfigure the shared stack): the
session's own job and control plane stand in for it, with the same loopback allowance, and the
test checks that the tour's switch is the one the stack scripts turn that allowance on with.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from core.settings import REPO_ROOT
from stack.outbox_relay import OutboxRelay
from tests.unit.stack.test_local_receivers import shell as switch_shell

pytestmark = pytest.mark.integration

README = REPO_ROOT / "README.md"
VENV_BIN = str(REPO_ROOT / ".venv" / "bin")


def tour_commands(readme: str) -> list[str]:
    """The command lines of the first code block under "## The five-minute tour"."""
    section = readme.split("\n## The five-minute tour\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```\n")[1]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


class Terminal:
    """A shell session: each line runs in bash with the environment the previous lines left."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def run(self, line: str, timeout: float = 60) -> str:
        with tempfile.NamedTemporaryFile(prefix="tour-env-") as saved:
            out = subprocess.run(["bash", "-c", f"set -e -o pipefail\n{line}\nenv -0 > {saved.name}"],
                                 cwd=REPO_ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
            assert out.returncode == 0, f"{line}\nexit {out.returncode}\n{out.stdout}\n{out.stderr}"
            pairs = (item.split("=", 1) for item in Path(saved.name).read_text().split("\0") if "=" in item)
            self.env = dict(pairs)  # type: ignore[arg-type]
        return out.stdout


class Background:
    """A long-running command (the second terminal), its output collected line by line."""

    def __init__(self, line: str, env: dict[str, str]) -> None:
        self.line = line
        self.proc = subprocess.Popen(["bash", "-c", line], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            with self._changed:
                self.lines.append(text.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, what: str, match: Callable[[str], bool], timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [line for line in self.lines if match(line)]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                assert left > 0 and self.proc.poll() is None, (
                    f"{self.line!r}: no line with {what} after {timeout}s; it printed:\n" + "\n".join(self.lines))
                self._changed.wait(min(left, 1.0))

    def interrupt(self, timeout: float = 20) -> int:
        """Ctrl-C, as a person would; SIGKILL only if it does not stop."""
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise


def _placeholders(line: str, seen: dict[str, str]) -> str:
    def value(m: re.Match[str]) -> str:
        assert m.group(1) in seen, f"the tour uses <{m.group(1)}> before anything printed it: {line}"
        return seen[m.group(1)]

    return re.sub(r"<(\w+)>", value, line)


HTTP_API = "127.0.0.1:8088"  # the address the tour's curl line names (control_plane.http_port's default)


def test_the_readme_tour_works_as_written(control_plane: str, delivery_job: str, relay: OutboxRelay,
                                          listen_port: int, job_env: dict[str, str], tmp_path: Path,
                                          http_api_base: str) -> None:
    commands = tour_commands(README.read_text())

    # 1. `make run` with the switch: the stack scripts turn on exactly the allowance the session's
    # job and control plane run with.
    make = shlex.split(commands.pop(0), comments=True)
    assert make[:2] == ["make", "run"], make
    switch = dict(word.split("=", 1) for word in make[2:])
    out, exported = switch_shell(tmp_path, "local_receivers_apply", **switch)
    assert out.returncode == 0, out.stderr
    assert exported["WEBHOOKS_EGRESS__DEV_ALLOW_CIDRS"] == job_env["WEBHOOKS_EGRESS__DEV_ALLOW_CIDRS"]

    walk_tour(commands, fresh_terminal(int(control_plane.rsplit(":", 1)[1]), relay.settings.outbox.dsn, listen_port),
              http_api_base.removeprefix("http://"))


def fresh_terminal(control_plane_port: int, outbox_dsn: str, listen_port: int) -> dict[str, str]:
    """A new terminal's environment: webhookctl not on PATH until the tour activates the venv, no
    credentials; only the addresses of the stack under test (variables webhookctl reads)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WEBHOOKS_", "WEBHOOKCTL_")) and k not in ("VIRTUAL_ENV", "LOCAL_RECEIVERS")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != VENV_BIN)
    env.update({
        "WEBHOOKS_CONTROL_PLANE__PORT": str(control_plane_port),
        "WEBHOOKS_OUTBOX__DSN": outbox_dsn,
        "WEBHOOKCTL_LISTEN_PORT": str(listen_port),
    })
    return env


def walk_tour(commands: list[str], env: dict[str, str], http_api: str) -> None:
    """Run the tour's lines after `make run` in a terminal with ``env`` (`webhookctl listen` in a
    second one; ``http_api`` the HTTP API's host:port for the curl line), asserting what a reader
    sees at each step."""
    term = Terminal(env)
    listener: Background | None = None
    seen: dict[str, str] = {}
    try:
        for raw in commands:
            line = _placeholders(raw, seen)
            if line.startswith("curl "):
                assert HTTP_API in line, f"the tour's curl names another address: {line}"
                line = line.replace(HTTP_API, http_api)
            words = shlex.split(line, comments=True)
            if words[:2] == ["webhookctl", "listen"]:
                listener = Background(line, dict(term.env))  # the second terminal, set up like the first
                listener.wait_for("the verified ping", lambda s: "webhook.ping" in s and "verified yes" in s)
                continue
            out_text = term.run(line)
            if line.startswith("export WEBHOOKCTL_API_KEY="):
                assert term.env.get("WEBHOOKCTL_API_KEY"), "the tour's key export left no API key"
            elif words[:3] == ["webhookctl", "events", "publish"]:
                assert listener is not None, "the tour publishes before it listens"
                got = listener.wait_for("a verified invoice.paid, attempt 1", lambda s: " invoice.paid " in s
                                        and " attempt 1 " in s and "verified yes" in s and "inv_1" in s)
                seen["delivery_id"] = re.search(r"\b(dlv_\S+)", got).group(1)  # type: ignore[union-attr]
            elif words[:3] == ["webhookctl", "deliveries", "get"]:
                assert seen["delivery_id"] in out_text and "invoice.paid" in out_text, out_text
                for _ in range(20):  # the success's history write may trail the 200 by a moment
                    if "succeeded" in out_text:
                        break
                    time.sleep(0.5)
                    out_text = term.run(line)
                assert "succeeded" in out_text, out_text
            elif words[0] == "curl":
                got = json.loads(out_text)
                assert (got["delivery"]["delivery_id"], got["delivery"]["status"]) == (
                    seen["delivery_id"], "DELIVERY_STATUS_SUCCEEDED"), out_text
                seen["curl"] = out_text
            elif words[:3] == ["webhookctl", "deliveries", "replay"]:
                assert listener is not None
                listener.wait_for("the replay: attempt 2, verified", lambda s: seen["delivery_id"] in s
                                  and " attempt 2 " in s and "verified yes" in s)
        assert listener is not None, "the tour never starts webhookctl listen"
        assert {"delivery_id", "curl"} <= seen.keys(), "the tour never showed a delivery, over gRPC and HTTP"
        assert listener.interrupt() == 0, "\n".join(listener.lines)
        assert any("deleted endpoint" in s for s in listener.lines), "\n".join(listener.lines)
        print("\nthe listener's terminal:\n" + "\n".join(listener.lines))  # what a reader sees (-s)
    finally:
        if listener is not None and listener.proc.poll() is None:
            os.killpg(listener.proc.pid, signal.SIGKILL)
