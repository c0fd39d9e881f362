"""What the running local stack costs, per part: resident memory and CPU over a window, from /proc.

`python -m stack.cluster_cost [--seconds 30]` reads every part with a live pid in the run directory
(each ``<part>/pid`` the stack scripts write, with every process below it: the PostgreSQL
postmaster's backends, a script's JVM) -- whichever topology runs, one node of each or the
cluster's fifteen. Run it with the job running and no traffic, it is the idle cost docs/operating.md
states (cluster topology). CPU is in percent of one core, averaged over the window.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from core.settings import load_settings
from stack.cpu import CLK_TCK, descendants, pid_from, ticks_and_rss_kb


def parts(run: Path) -> dict[str, int]:
    """Part name -> pid of every live part in ``run``, in name order."""
    found = {f.parent.name: pid_from(f) for f in sorted(run.glob("*/pid"))}
    return {name: pid for name, pid in found.items() if pid is not None}


def measure(run: Path, seconds: float) -> list[tuple[str, float, float]]:
    """(part, RSS MB at the end, CPU % of a core over the window) for every live part."""
    roots = parts(run)
    before = {name: ticks_and_rss_kb(descendants(pid))[0] for name, pid in roots.items()}
    start = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    rows = []
    for name, pid in roots.items():
        ticks, rss_kb = ticks_and_rss_kb(descendants(pid))
        rows.append((name, rss_kb / 1024, 100 * (ticks - before[name]) / CLK_TCK / elapsed))
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args()
    rows = measure(load_settings().run_dir, args.seconds)
    if not rows:
        print(f"nothing runs in {load_settings().run_dir}", file=sys.stderr)
        return 1
    for name, rss, cpu in rows:
        print(f"  {name:16} {rss:6.0f} MB  {cpu:5.1f} % of a core")
    print(f"  {'total':16} {sum(r[1] for r in rows):6.0f} MB  {sum(r[2] for r in rows):5.1f} % of a core"
          f"  ({args.seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
