"""CPU and memory of the stack's processes, read from /proc: what a benchmark phase costs (bench/)
and what the idle stack costs (stack.cluster_cost).

A *group* is a named set of root pids (a TaskManager, Kafka, Cassandra, ...); each sample sums
utime + stime of the roots and every live descendant (PyFlink may start Python workers, the
PostgreSQL postmaster forks a backend per connection). CPU per delivery is the sum over every
group of the CPU seconds a phase used, divided by the phase's deliveries: what the issue calls
"the whole stack on the delivery path". What the stack costs with no traffic is sampled over every
process of the stack instead (``whole_stack_groups``). The receiver and the load generator (this
process) are not in any group.

Limits, stated rather than hidden: a child that exits during a phase takes its ticks with it
(its parent's cutime only gets them when it is reaped), so short-lived children are undercounted;
the stack's long-lived processes (JVMs, the control plane, PostgreSQL's backends of long
connections) are exact to a clock tick (10 ms).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def descendants(root: int) -> list[int]:
    """root and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def ticks_and_rss_kb(pids: list[int]) -> tuple[int, int]:
    ticks = rss = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited between listing and reading
        ticks += int(fields[11]) + int(fields[12])  # utime + stime
        rss += int(fields[21]) * PAGE_KB
    return ticks, rss


def steal_and_total(cpu_line: str) -> tuple[int, int]:
    """(steal, all) ticks of every CPU from /proc/stat's first line. Steal is the time the
    hypervisor ran someone else while this machine had work: the machine states where a run reads
    slow everywhere (and CPU per delivery high: caches go cold) are those with much of it."""
    ticks = [int(x) for x in cpu_line.split()[1:9]]  # user .. steal; guest time is inside user
    return ticks[7], sum(ticks)


def machine_ticks() -> tuple[int, int]:
    with open("/proc/stat") as f:
        return steal_and_total(f.readline())


def pid_from(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def pids_of(pid_files: list[Path]) -> list[int]:
    """The live processes named by ``pid_files`` and every process below them."""
    return [pid for f in pid_files if (root := pid_from(f)) is not None for pid in descendants(root)]


def stack_groups(run: Path, extra: dict[str, list[Path]] | None = None) -> dict[str, list[Path]]:
    """The pid files of the `make up` stack's processes on the delivery path, by group name:
    TaskManagers (flink-tm and flink-tm-N), the JobManager, Kafka and Cassandra; ``extra`` adds
    the run's own (its control plane, its outbox's PostgreSQL and Connect worker)."""
    groups = {
        "taskmanagers": [run / "flink-tm/pid", *sorted(run.glob("flink-tm-*/pid"))],
        "jobmanager": [run / "flink-jm/pid"],
        "kafka": [run / "kafka/pid"],
        "cassandra": [run / "cassandra/pid"],
    }
    groups.update(extra or {})
    return groups


def whole_stack_groups(run: Path, own: dict[str, list[Path]] | None = None) -> dict[str, list[Path]]:
    """Every process of the `make up` stack, not only those on the delivery path: one group per
    part that keeps its pid in ``run``/<part>/pid (Kafka, Cassandra, the JobManager, each
    TaskManager, Kafka Connect, PostgreSQL, the control plane, Prometheus, the Pushgateway, and
    any part added later without a change here); ``own``, a run's own processes, as bench-<name>."""
    groups = {f.parent.name: [f] for f in sorted(run.glob("*/pid"))}
    groups.update({f"bench-{g}": files for g, files in (own or {}).items()})
    return groups


@dataclass
class Usage:
    """What one phase cost: CPU seconds per group and the samples over time."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    # (seconds since the start, {group: % of one core over the last interval})
    series: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    rss_mb_max: dict[str, float] = field(default_factory=dict)
    steal_ticks: int = 0  # the machine's, over the same span (machine_ticks)
    machine_ticks: int = 0

    @property
    def total_cpu_s(self) -> float:
        return sum(self.cpu_s.values())

    @property
    def cores(self) -> float:
        """Cores busy on average: CPU seconds over wall seconds; nan when nothing was sampled."""
        return self.total_cpu_s / self.wall_s if self.wall_s else math.nan

    @property
    def steal_pct(self) -> float:
        """The share of the machine's CPU time its hypervisor took; nan when not read."""
        return 100.0 * self.steal_ticks / self.machine_ticks if self.machine_ticks else math.nan

    def cores_by_group(self) -> dict[str, float]:
        """Each group's cores busy on average, largest first."""
        if not self.wall_s:
            return {}
        return {g: s / self.wall_s for g, s in sorted(self.cpu_s.items(), key=lambda x: -x[1])}

    def ms_per(self, n: int) -> dict[str, float]:
        return {g: s * 1000 / n for g, s in self.cpu_s.items()} if n else {}

    def summary(self, n: int) -> str:
        if not n or not self.wall_s:
            return "no deliveries"
        parts = " ".join(f"{g}={ms:.2f}" for g, ms in sorted(self.ms_per(n).items(), key=lambda x: -x[1]))
        steal = "" if math.isnan(self.steal_pct) else f"; steal {self.steal_pct:.0f}% of the machine"
        return (f"cpu_ms_per_delivery={self.total_cpu_s * 1000 / n:.2f} ({parts}); "
                f"cores busy avg={self.cores:.2f} over {self.wall_s:.1f}s{steal}")


class StackSampler:
    """Samples every group every ``interval_s`` in a thread; pid files are re-read each time (a
    restarted process is followed). ``usage`` is final once the context exits."""

    def __init__(self, groups: Callable[[], dict[str, list[Path]]], interval_s: float = 0.5) -> None:
        self._groups = groups
        self.interval_s = interval_s
        self.usage = Usage()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)
        self._last: dict[str, int] = {}
        self._t0 = 0.0
        self._t_last = 0.0
        self._machine0 = (0, 0)

    def __enter__(self) -> StackSampler:
        self._t0 = self._t_last = time.monotonic()
        self._machine0 = machine_ticks()
        self._last = {g: t for g, (t, _) in self._read().items()}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()  # the last partial interval counts too
        self.usage.wall_s = self._t_last - self._t0
        steal, total = machine_ticks()
        self.usage.steal_ticks, self.usage.machine_ticks = steal - self._machine0[0], total - self._machine0[1]

    def _read(self) -> dict[str, tuple[int, int]]:
        out = {}
        for name, files in self._groups().items():
            out[name] = ticks_and_rss_kb(pids_of(files))
        return out

    def _sample(self) -> None:
        now = time.monotonic()
        current = self._read()
        dt = now - self._t_last
        pct = {}
        for g, (ticks, rss_kb) in current.items():
            # A group that restarted (ticks went down) counts from zero again.
            delta = ticks - self._last.get(g, 0) if ticks >= self._last.get(g, 0) else ticks
            self.usage.cpu_s[g] = self.usage.cpu_s.get(g, 0.0) + delta / CLK_TCK
            pct[g] = 100.0 * delta / CLK_TCK / dt if dt > 0 else 0.0
            self.usage.rss_mb_max[g] = max(self.usage.rss_mb_max.get(g, 0.0), rss_kb / 1024)
            self._last[g] = ticks
        self.usage.series.append((now - self._t0, pct))
        self._t_last = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()
