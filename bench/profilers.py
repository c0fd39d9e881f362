"""Profiles of the TaskManagers over a measured phase, read by bench/attribution.py: py-spy on the
interpreter embedded in each TaskManager, each thread's name and CPU from /proc/<pid>/task (and,
asked for, JDK Flight Recorder through ``jcmd``).

The tools are processes of this bench (py-spy, jcmd, jfr), in no measured group: their own CPU
is not in any figure. JFR's is: it samples from inside the JVM, so its sampler thread and
buffers are in the TaskManager's CPU while it records. Nothing is left running on a
TaskManager: a recording is stopped and py-spy interrupted even when the phase fails.

The JDK tools are taken from the TaskManager's own JDK (next to /proc/<pid>/exe); py-spy from
the virtualenv (requirements.txt pins it). The recording's settings enable the execution
sampler only: the JDK's ``profile`` settings would also record ``jdk.ThreadCPULoad``, whose
per-thread CPU clock read crashed a TaskManager on a thread pemja had attached
(docs/performance.md, profiling). Even with execution samples only, a TaskManager died once
while recording (the thread dump after JFR.start hung, then the JVM was gone), and the
recording's counts only describe the crossing, they enter no figure: JFR is off unless asked
(``jfr=True``; `make bench-archive ARCHIVE_ARGS=--jfr`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench import attribution as attr
from core.settings import REPO_ROOT
from stack import cpu

# Every 10 ms, as the JDK's `profile` settings sample; jdk.ThreadCPULoad off on purpose (above).
JFC = """<?xml version="1.0" encoding="UTF-8"?>
<configuration version="2.0" label="archive attribution" description="Execution samples only">
  <event name="jdk.ExecutionSample">
    <setting name="enabled">true</setting>
    <setting name="period">10 ms</setting>
  </event>
  <event name="jdk.ThreadCPULoad">
    <setting name="enabled">false</setting>
  </event>
</configuration>
"""
# Deep enough for the side output's route from the Python call to the Kafka producer's append.
JFR_STACK_DEPTH = 64
# py-spy reads every OS thread's state in each round (/proc/<tid>/stat, to leave idle threads
# out), so a round's cost grows with the TaskManager's threads, and a TaskManager has hundreds:
# a rate it keeps up with, at a cost the machine can spare (docs/archive.md#sizing).
PY_SPY_RATE = 50


class ToolsMissing(RuntimeError):
    """A profiler the attribution needs is not there (or cannot work on this job)."""


@dataclass(frozen=True)
class Tools:
    py_spy: str
    jcmd: str
    jfr: str


def find_tools(tm_pids: list[int]) -> Tools:
    """py-spy, and jcmd and jfr of the TaskManagers' JDK; ToolsMissing says which is not there.
    Also refuses a job whose Python runs in worker processes (``python.execution-mode:
    process``): the attribution reads the interpreter inside the TaskManager."""
    if not tm_pids:
        raise ToolsMissing("no TaskManager is running (.run/flink-tm*/pid)")
    venv_py_spy = REPO_ROOT / ".venv/bin/py-spy"
    py_spy = str(venv_py_spy) if venv_py_spy.exists() else shutil.which("py-spy")
    if py_spy is None:
        raise ToolsMissing("py-spy is not installed (requirements.txt pins it: make setup)")
    jdks = set()
    for pid in tm_pids:
        try:
            jdks.add(Path(os.readlink(f"/proc/{pid}/exe")).parent)
        except OSError as e:
            raise ToolsMissing(f"cannot read TaskManager {pid}'s executable: {e}") from e
        workers = python_workers(pid)
        if workers:
            raise ToolsMissing(f"TaskManager {pid} runs Python in worker processes {workers} (process mode); "
                               "the attribution reads the interpreter of thread mode, inside the JVM")
    if len(jdks) != 1:
        raise ToolsMissing(f"the TaskManagers run different JDKs: {sorted(map(str, jdks))}")
    jdk = jdks.pop()
    jcmd, jfr = jdk / "jcmd", jdk / "jfr"
    for tool in (jcmd, jfr):
        if not os.access(tool, os.X_OK):
            raise ToolsMissing(f"{tool} is not there: the TaskManager's Java is not a full JDK")
    return Tools(py_spy, str(jcmd), str(jfr))


def python_workers(tm_pid: int) -> list[int]:
    """Processes below a TaskManager whose executable is a Python interpreter."""
    out = []
    for pid in cpu.descendants(tm_pid)[1:]:
        try:
            if Path(os.readlink(f"/proc/{pid}/exe")).name.startswith("python"):
                out.append(pid)
        except OSError:
            continue
    return out


def thread_ticks(pid: int) -> dict[int, int]:
    """utime + stime of every thread of ``pid`` now, by OS thread id."""
    out = {}
    for entry in os.scandir(f"/proc/{pid}/task"):
        try:
            out[int(entry.name)] = attr.stat_ticks(Path(entry.path, "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # ended between listing and reading
    return out


def thread_names(pid: int) -> dict[int, str]:
    """OS thread id -> the kernel's name of the thread (its first 15 characters)."""
    out: dict[int, str] = {}
    for entry in os.scandir(f"/proc/{pid}/task"):
        try:
            out[int(entry.name)] = Path(entry.path, "comm").read_text().rstrip("\n")
        except OSError:
            continue  # exited meanwhile
    return out


# A JVM's background threads, by the kernel's (15-character) names as thread_name gives them:
# the JIT compilers (C1 CompilerThre, C2 CompilerThre), and G1's collector threads (GC Thread#0,
# G1 Conc#0, G1 Refine#0, G1 Main Marker, G1 Service; the servers' collector here).
JIT_THREADS = ("C# CompilerThre",)
GC_THREADS = ("GC Thread##", "G# Conc##", "G# Refine##", "G# Main Marker", "G# Service", "VM Thread")


def thread_name(comm: str) -> str:
    """A thread's name with every run of digits as '#': one entry for a pool's threads."""
    return re.sub(r"\d+", "#", comm)


def stack_threads(groups: dict[str, list[Path]]) -> tuple[dict[int, int], dict[int, tuple[str, str]]]:
    """Every thread of every group's processes now: its ticks by OS thread id (thread_ticks), and
    its group and name as thread_name gives it."""
    ticks: dict[int, int] = {}
    names: dict[int, tuple[str, str]] = {}
    for group, files in groups.items():
        for pid in cpu.pids_of(files):
            ticks.update(thread_ticks(pid))
            names.update({tid: (group, thread_name(comm)) for tid, comm in thread_names(pid).items()})
    return ticks, names


def cores_by_thread_name(before: dict[int, int], after: dict[int, int], names: dict[int, tuple[str, str]],
                         wall_s: float) -> dict[tuple[str, str], float]:
    """Cores busy per (group, thread name) between two stack_threads readings, largest first.
    ``names`` is the later reading's: each thread's own ticks in between count under the name it
    has at the end (a pool may rename its threads: Cassandra's workers take the name of the stage
    they serve); a thread that started in between counts whole, one that ended not at all."""
    if wall_s <= 0:
        return {}
    cores: dict[tuple[str, str], float] = {}
    for tid, cpu_s in attr.cpu_between(before, after, cpu.CLK_TCK).items():
        if (key := names.get(tid)) is not None:  # None: its name went with it before it was read
            cores[key] = cores.get(key, 0.0) + cpu_s / wall_s
    return {k: c for k, c in sorted(cores.items(), key=lambda x: (-x[1], x[0])) if c > 0}


def _jcmd(tools: Tools, pid: int, *args: str) -> str:
    out = subprocess.run([tools.jcmd, str(pid), *args], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"jcmd {pid} {' '.join(args)} failed: {out.stdout}{out.stderr}")
    return out.stdout


class TaskManagerProfile:
    """One TaskManager over one phase: started before it, stopped after it, read afterwards
    (``share``) -- reading a recording costs CPU, so it is done outside any measured span."""

    def __init__(self, tools: Tools, pid: int, out_dir: Path, name: str, rate: int = PY_SPY_RATE,
                 jfr: bool = False) -> None:
        self.tools, self.pid, self.name, self.rate, self.jfr = tools, pid, name, rate, jfr
        out_dir.mkdir(parents=True, exist_ok=True)
        self.jfc = out_dir / "attribution.jfc"
        self.jfr_file = out_dir / f"tm-{pid}.jfr"
        self.raw = out_dir / f"tm-{pid}.py-spy.txt"
        self.log = out_dir / f"tm-{pid}.py-spy.log"
        self.dump = out_dir / f"tm-{pid}.threads.txt"
        self.names: dict[int, str] = {}
        self.before: dict[int, int] = {}
        self.after: dict[int, int] = {}
        self._py_spy: subprocess.Popen[bytes] | None = None
        self._recording = False

    def start(self) -> None:
        if self.jfr:
            self.jfc.write_text(JFC)
            _jcmd(self.tools, self.pid, "JFR.start", f"name={self.name}", f"settings={self.jfc}",
                  f"filename={self.jfr_file}")
            self._recording = True
        # The kernel's thread names, not a thread dump: `jcmd Thread.print` killed a TaskManager
        # whose threads pemja had attached (twice in four runs), and the names are all needed here.
        self.names = thread_names(self.pid)
        self.dump.write_text("".join(f"{tid} {name}\n" for tid, name in sorted(self.names.items())))
        with open(self.log, "wb") as log:
            self._py_spy = subprocess.Popen(
                [self.tools.py_spy, "record", "--nonblocking", "--threads", "--rate", str(self.rate),
                 "--format", "raw", "-o", str(self.raw), "--pid", str(self.pid)],
                stdout=log, stderr=subprocess.STDOUT)
        self._wait_sampling()
        self.before = thread_ticks(self.pid)

    def _wait_sampling(self, timeout_s: float = 30.0) -> None:
        """Until py-spy found the interpreter and samples (it says so), so the CPU window starts
        with its samples."""
        assert self._py_spy is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "Sampling process" in self.log.read_text(errors="replace"):
                return
            if self._py_spy.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"py-spy did not start sampling TaskManager {self.pid}: "
                           f"{self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        """The CPU window's end, then py-spy (SIGINT: it writes its file) and the recording."""
        try:
            self.after = thread_ticks(self.pid)
        except OSError:
            self.after = {}  # the TaskManager is gone: nothing to attribute
        try:
            if self._py_spy is not None and self._py_spy.poll() is None:
                self._py_spy.send_signal(signal.SIGINT)
                try:
                    self._py_spy.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self._py_spy.kill()
                    self._py_spy.wait()
        finally:
            if self._recording:
                self._recording = False
                _jcmd(self.tools, self.pid, "JFR.stop", f"name={self.name}")

    def share(self, facts_topic: str, append_lines: frozenset[int]) -> attr.JobShare:
        is_facts = attr.facts_task(facts_topic)
        stacks = attr.parse_pyspy_raw(self.raw.read_text()) if self.raw.exists() else Counter()
        if not stacks:
            raise RuntimeError(f"py-spy recorded no sample of TaskManager {self.pid}'s interpreter: "
                               f"{self.log.read_text(errors='replace')[-2000:]}")
        # The kernel's names do not say which task chains the facts sink, so a side output on any
        # of the TaskManager's threads counts as the facts': the bench's events are all valid (no
        # dead letter, the job's other side output) and the stack's own job, if one runs, gets
        # none of its traffic.
        tallies = attr.tally(stacks, lambda tid: tid is not None, append_lines)
        errors = re.search(r"Errors: (\d+)", self.log.read_text(errors="replace"))
        jfr = self._jfr_tally(is_facts)  # JFR names threads by their Java names
        # Every producer network thread of the TaskManager is counted as the facts': an upper
        # bound (the signals' and dead letters' producers idle beside it).
        return attr.attribute(tallies, attr.cpu_between(self.before, self.after, cpu.CLK_TCK), self.names,
                              is_facts, lambda name: name.startswith(attr.PRODUCER_COMM), jfr,
                              int(errors[1]) if errors else 0)

    def _jfr_tally(self, is_facts: Callable[[str], bool]) -> attr.JfrTally:
        if not self.jfr_file.exists():
            return attr.JfrTally()
        proc = subprocess.Popen([self.tools.jfr, "print", "--events", "jdk.ExecutionSample", "--stack-depth",
                                 str(JFR_STACK_DEPTH), str(self.jfr_file)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        tallied = attr.tally_jfr(attr.parse_jfr_samples(proc.stdout), is_facts)
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"jfr print {self.jfr_file} failed: {err[-2000:]}")
        return tallied


@contextmanager
def profiled(tools: Tools, tm_pids: list[int], out_dir: Path, name: str,
             rate: int = PY_SPY_RATE, jfr: bool = False) -> Iterator[list[TaskManagerProfile]]:
    """Every TaskManager profiled over the body; the profiles, to read once the body is done."""
    profiles = [TaskManagerProfile(tools, pid, out_dir, f"{name}-{pid}", rate, jfr) for pid in tm_pids]
    started: list[TaskManagerProfile] = []
    try:
        for p in profiles:
            started.append(p)
            p.start()
        yield profiles
    finally:
        errors = []
        for p in started:
            try:
                p.stop()
            except Exception as e:  # stop every other one anyway: none may be left recording
                errors.append(e)
        if errors:
            raise errors[0]


def job_share(profiles: list[TaskManagerProfile], facts_topic: str) -> attr.JobShare:
    """The facts' CPU over the phase, summed over the TaskManagers."""
    lines = attr.fact_append_lines((REPO_ROOT / "operators/history_store.py").read_text())
    total = attr.JobShare()
    for p in profiles:
        total = total.plus(p.share(facts_topic, lines))
    return total
