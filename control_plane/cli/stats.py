"""`webhookctl stats`: delivery health per job, read from Prometheus (control_plane.history.stats):
rates, ages, first-attempt p50/p99, breakers, alerts. No credential: it never calls the API.
"""

from __future__ import annotations

import argparse
import sys

from control_plane.history import stats as delivery_stats


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    p.add_argument("--job", help="only this delivery job (its Flink job name)")


def main(args: argparse.Namespace) -> int:
    try:
        jobs, alerts = delivery_stats.collect(args.prometheus, args.job)
    except delivery_stats.PrometheusError as exc:
        print(f"webhookctl: {exc}", file=sys.stderr)
        return 1
    print(delivery_stats.render(jobs, alerts))
    return 0
