"""`webhookctl deliveries ...`: an endpoint's delivery history, one delivery with every attempt and
its replay audit, a replay, and the bulk recovery of a window's failed deliveries with a progress
bar (WEBHOOKCTL_API_KEY).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import Any

from control_plane.cli.common import Out, next_cursor_line, status_name, table, ts, when
from control_plane.rpc.api import pb


def add_arguments(p: argparse.ArgumentParser) -> None:
    dl = p.add_subparsers(dest="command", required=True)
    d = dl.add_parser("list", help="an endpoint's deliveries in a time range")
    d.add_argument("endpoint_id")
    d.add_argument("--status", action="append", choices=["pending", "succeeded", "failed", "expired", "skipped"])
    d.add_argument("--since", help="ISO 8601, default 30 days ago")
    d.add_argument("--until", help="ISO 8601, default now")
    d.add_argument("--page-size", type=int, default=0)
    d.add_argument("--cursor")
    dl.add_parser("get", help="one delivery and every attempt").add_argument("delivery_id")
    rp = dl.add_parser("replay", help="send a delivery again (same delivery id)")
    rp.add_argument("delivery_id")
    rp.add_argument("--request-id")
    rp.add_argument("--reason", help="why, for the audit shown by `deliveries get`")
    rc = dl.add_parser("recover", help="replay failed/expired deliveries in a time range")
    rc.add_argument("endpoint_id")
    rc.add_argument("--since", required=True)
    rc.add_argument("--until", required=True)
    rc.add_argument("--reason", help="why, recorded with every delivery replayed")


def run(args: argparse.Namespace, tenant: Any, out: Out) -> None:
    cmd = args.command
    if cmd == "list":
        statuses = [pb.DeliveryStatus.Value(f"DELIVERY_STATUS_{s.upper()}") for s in args.status or []]
        r = tenant.ListDeliveries(pb.ListDeliveriesRequest(
            endpoint_id=args.endpoint_id, statuses=statuses, start_time=ts(args.since),
            end_time=ts(args.until), page_size=args.page_size, cursor=args.cursor or ""))
        out(r, lambda r: delivery_rows(r.deliveries) + next_cursor_line(r.next_cursor))
    elif cmd == "get":
        out(tenant.GetDelivery(pb.GetDeliveryRequest(delivery_id=args.delivery_id)), delivery_detail)
    elif cmd == "replay":
        r = tenant.ReplayDelivery(pb.ReplayDeliveryRequest(
            delivery_id=args.delivery_id, request_id=args.request_id or "", reason=args.reason or ""))
        out(r, lambda r: f"replay {r.request_id} of {r.delivery_id} queued (manual attempt)")
    else:  # recover
        stream = tenant.RecoverFailedDeliveries(pb.RecoverFailedDeliveriesRequest(
            endpoint_id=args.endpoint_id, start_time=ts(args.since), end_time=ts(args.until),
            reason=args.reason or ""))
        bar = ProgressBar()
        for progress in stream:
            if args.json:
                out(progress, str)
            else:
                bar.update(progress)


def delivery_rows(deliveries: Iterable[Any]) -> str:
    return table(
        ["delivery", "created", "event type", "status", "attempts", "last http"],
        [
            (d.delivery_id, when(d.created_at), d.event_type,
             status_name(pb.DeliveryStatus, d.status), d.attempt_count, d.last_http_status or "-")
            for d in deliveries
        ],
    )


def delivery_detail(d: Any) -> str:
    head = delivery_rows([d.delivery])
    facts = (
        f"endpoint {d.delivery.endpoint_id}, config version {d.endpoint_config_version}, "
        f"automatic retries {'active' if d.auto_retry_active else 'stopped'}"
    )
    if d.delivery.status == pb.DELIVERY_STATUS_SKIPPED:
        facts += f"\nskipped, never sent: {d.last_error_class}"
    attempts = table(
        ["#", "started", "outcome", "http", "latency ms", "error", "manual", "config v"],
        [
            # A reserved row (no outcome yet, or none ever recorded) has no latency.
            (a.attempt_number, when(a.started_at), a.outcome, a.http_status or "-",
             a.latency_ms if a.finished_at.seconds else "-", a.error_class or "-",
             "yes" if a.manual else "", a.endpoint_config_version)
            for a in d.attempts
        ],
    )
    if d.replay_refusal:
        facts += f"\n{d.replay_refusal}"
    out = f"{head}\n\n{facts}\n\n{attempts}"
    if d.replays:
        out += "\n\nreplays\n" + table(["requested", "by (API key)", "action", "request id", "reason"], [
            (when(r.requested_at), r.requested_by, r.action or "replay", r.request_id, r.reason or "-")
            for r in d.replays])
    return out


class ProgressBar:
    """One line on stderr, redrawn in place; the final line stays."""

    def __init__(self, width: int = 30) -> None:
        self._width = width

    def update(self, p: Any) -> None:
        total = max(p.total, 1)
        filled = int(self._width * min(p.replayed, total) / total)
        bar = "#" * filled + "-" * (self._width - filled)
        end = "\n" if p.done else ""
        refused = f", {p.not_allowed} past their replay window" if p.not_allowed else ""
        why = "".join(f"\n  {n} by {rule}" for rule, n in sorted(p.not_allowed_by_rule.items())) if p.done else ""
        sys.stderr.write(f"\r[{bar}] {p.replayed}/{p.total} replayed, {p.skipped} skipped{refused}{end}{why}"
                         + ("\n" if why else ""))
        sys.stderr.flush()
