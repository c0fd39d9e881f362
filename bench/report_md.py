"""The benchmark's report: `.run/bench/report.md` and three PNG charts beside it.

* ``latency_cdf.png``: first-attempt latency CDF of each phase (where the tail is);
* ``rate.png``: first attempts per second over each phase (stalls show as gaps);
* ``cpu.png``: CPU per delivery by process for each phase, and % of a core by process over the
  full-speed phase (where the CPU goes).

matplotlib renders off-screen (Agg); the charts are for people, the summary lines for tools.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.raw_http import Result as RawResult
from bench.results import Costs, PhaseResult


def _git_rev() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write(out_dir: Path, phases: Mapping[str, PhaseResult], summary_lines: list[str], raw: RawResult,
          args: Mapping[str, Any], costs: Costs | None = None) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    charts = _charts(out_dir, phases)
    rows = []
    for name, r in phases.items():
        n = r.delivered
        split = ", ".join(f"{g} {ms:.2f}" for g, ms in sorted(r.usage.ms_per(n).items(), key=lambda x: -x[1])
                          if ms >= 0.005)
        total = r.usage.total_cpu_s * 1000 / n if n else 0.0
        rows.append(f"| {name} | {r.delivered}/{r.expected} | {r.duplicates} | {r.sustained_per_s:.0f} | "
                    f"{r.p(50):.0f} | {r.p(90):.0f} | {r.p(99):.0f} | {total:.2f} | {split} |")
    text = [
        "# Delivery benchmark",
        "",
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, commit {_git_rev()}, {os.cpu_count()} cores "
        f"({_cpu_model()}), Python {platform.python_version()}.",
        f"Arguments: {' '.join(f'{k}={v}' for k, v in args.items() if v is not None)}.",
        "",
        "```",
        *summary_lines,
        "```",
        "",
        f"Raw HTTP ceiling on this machine now (aiohttp client -> the same receiver, no platform): "
        f"{raw.per_second:.0f} requests/s, at {raw.client_cpu_ms_per_request:.3f} ms of the client's CPU a "
        "request: what aiohttp alone costs, a floor under the TaskManager's share of any delivery.",
        "",
        "First attempt = from the produce call (or the outbox COMMIT) to the receiver's first request "
        "for the delivery. CPU = utime + stime of every stack process on the delivery path during the "
        "phase (TaskManagers, JobManager, Kafka, Cassandra, the control plane; PostgreSQL and Kafka "
        "Connect in the outbox phases), from /proc, divided by the phase's deliveries; the receiver and "
        "the load generator are excluded.",
        "",
        "| phase | delivered | repeats | sustained/s | p50 ms | p90 ms | p99 ms | CPU ms/delivery | by process (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        *(_costs(costs) if costs is not None else []),
        *[f"![{title}]({file})" for title, file in charts],
        "",
    ]
    report = out_dir / "report.md"
    report.write_text("\n".join(text))
    return report


def _costs(c: Costs) -> list[str]:
    """The full-speed phase's CPU in raw client requests, its Cassandra writes, the idle stack."""
    out = [
        "## Costs",
        "",
        f"- Full speed: {c.cpu_ms_per_delivery:.2f} ms of the delivery path's CPU a delivery = "
        f"{c.cpu_per_client_request:.1f} raw aiohttp client requests at {c.client_cpu_ms_per_request:.3f} ms "
        "each (this run's raw phase).",
    ]
    if c.writes_by_table is None:
        out.append("- Cassandra writes: not read.")
    else:
        by_table = ", ".join(f"{t} {n}" for t, n in sorted(c.writes_by_table.items(), key=lambda x: -x[1]))
        out.append(f"- Cassandra writes, the server's own count (one per table and partition updated) over the "
                   f"full-speed phase: {c.cassandra_writes} for {c.deliveries} deliveries = "
                   f"{c.cassandra_writes_per_delivery:.2f} a delivery ({by_table or 'none'}).")
    if c.idle is None:
        out.append("- Idle stack: not sampled (--idle-seconds 0).")
    else:
        by_process = ", ".join(f"{g} {cores:.3f}" for g, cores in c.idle.cores_by_group().items())
        out.append(f"- Idle stack (job running, no traffic), every stack process over {c.idle.wall_s:.0f} s: "
                   f"{c.idle_cores:.2f} cores busy ({by_process}).")
    return [*out, ""]


def _charts(out_dir: Path, phases: Mapping[str, PhaseResult]) -> list[tuple[str, str]]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the report still has its tables
        return []
    made = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, r in phases.items():
        lat = [x * 1000 for x in r.latencies_s]
        if lat:
            ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=name)
    ax.set_xscale("log")
    ax.set_xlabel("first-attempt latency (ms, log scale)")
    ax.set_ylabel("fraction of deliveries")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title("First-attempt latency CDF by phase")
    made.append(_save(plt, fig, out_dir, "latency_cdf.png", "first-attempt latency CDF"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, r in phases.items():
        if not r.pairs:
            continue
        start = r.pairs[0][0]
        bins: dict[int, int] = {}
        for a in r.arrivals:
            b = int(a - start)
            bins[b] = bins.get(b, 0) + 1
        xs = list(range(max(bins) + 1))
        ax.plot(xs, [bins.get(x, 0) for x in xs], label=name, drawstyle="steps-post")
    ax.set_xlabel("seconds since the phase's first event")
    ax.set_ylabel("first attempts per second")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("Delivery rate over time")
    made.append(_save(plt, fig, out_dir, "rate.png", "delivery rate over time"))

    fig, (bars, series) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [n for n, r in phases.items() if r.delivered]
    groups = sorted({g for n in names for g in phases[n].usage.cpu_s})
    bottom = [0.0] * len(names)
    for g in groups:
        vals = [phases[n].usage.ms_per(phases[n].delivered).get(g, 0.0) for n in names]
        bars.bar(names, vals, bottom=bottom, label=g)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    bars.set_ylabel("CPU ms per delivery")
    bars.set_title("CPU per delivery by process")
    bars.legend(fontsize=8)
    bars.tick_params(axis="x", rotation=30)
    full = phases.get("max")
    if full is not None and full.usage.series:
        ts = [t for t, _ in full.usage.series]
        for g in groups:
            series.plot(ts, [pct.get(g, 0.0) for _, pct in full.usage.series], label=g)
        series.set_xlabel("seconds into the full-speed phase")
        series.set_ylabel("% of one core")
        series.set_title("CPU by process, full speed")
        series.grid(True, alpha=0.3)
        series.legend(fontsize=8)
    made.append(_save(plt, fig, out_dir, "cpu.png", "CPU by process"))
    return made


def _save(plt: Any, fig: Any, out_dir: Path, file: str, title: str) -> tuple[str, str]:
    fig.tight_layout()
    fig.savefig(out_dir / file, dpi=100)
    plt.close(fig)
    return title, file
