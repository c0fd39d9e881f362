"""`webhookctl reconcile --since ... --until ...` (WEBHOOKCTL_ADMIN_TOKEN): check every durable
boundary of a window of event arrivals (control_plane.history.reconcile), print the counts
boundary by boundary, the gaps and, with --repair, what was re-driven.
"""

from __future__ import annotations

import argparse
from typing import Any

from control_plane.cli.common import Out, table, ts, when
from control_plane.rpc.api import pb

# The report's counts, boundary by boundary (see core/reconcile.py), in reading order.
REPORT_ROWS = (
    ("1. topic -> fan-out", ("events_on_topic", "events_dead_lettered", "events_fanned_out",
                             "events_without_subscriber", "events_released_without_clock")),
    ("2. fan-out -> deliveries", ("deliveries_expected", "deliveries_found")),
    ("3. deliveries -> status", ("succeeded", "failed", "expired", "pending_in_progress", "pending_held",
                                 "pending_orphaned")),
    ("4. status -> attempts", ("attempts", "requests_outcome_unknown")),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", required=True, help="ISO 8601: window of event arrivals, from")
    p.add_argument("--until", required=True, help="ISO 8601: to (exclusive)")
    p.add_argument("--tenant")
    p.add_argument("--repair", action="store_true", help="re-drive what is missing (idempotent)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print the report as JSON (same as the global --json)")
    p.add_argument("--overdue-after", type=int, default=0, metavar="SECONDS",
                   help="a pending delivery due longer ago, on an endpoint no job holds, is orphaned")


def run(args: argparse.Namespace, admin: Any, out: Out) -> None:
    r = admin.Reconcile(pb.ReconcileRequest(
        start_time=ts(args.since), end_time=ts(args.until), tenant_id=args.tenant or "",
        repair=args.repair, overdue_after_seconds=args.overdue_after), timeout=max(args.timeout, 600))
    out(r, reconcile_report)


def reconcile_report(r: Any) -> str:
    counts = dict(r.counts)
    rows = [(boundary, name, counts.get(name, 0)) for boundary, names in REPORT_ROWS for name in names]
    rows += [("gaps", name[4:], n) for name, n in sorted(counts.items()) if name.startswith("gap_")]
    parts = [f"window {when(r.start_time)} .. {when(r.end_time)} UTC, tenant {r.tenant_id or 'all'}: "
             + ("clean" if r.clean else f"{len(r.gaps)} gap(s)"),
             table(["boundary", "count", "value"], rows)]
    if r.gaps:
        parts.append(table(["gap", "id", "tenant", "detail"], [(g.kind, g.id, g.tenant_id, g.detail) for g in r.gaps]))
    if r.repairs:
        parts.append(table(["repaired", "id", "action", "detail"], [(x.kind, x.id, x.action, x.detail)
                                                                     for x in r.repairs]))
    return "\n\n".join(parts)
