"""`webhookctl account`: where every event of the tenant went in a window, per event type (the
TenantAccount.GetAccount RPC, with WEBHOOKCTL_API_KEY: always the key's own tenant).

The window is ``--since``/``--until`` (ISO 8601, UTC when no zone) or the last ``--hours``
(default 1). Exit status 0 when every event is accounted for, 3 when some are not (they are
listed by id), 1 on an API error, 2 on a usage error: a script can alert on it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from control_plane.cli.common import call, table, ts, when
from protogen.webhooks.v1 import account_pb2 as apb
from protogen.webhooks.v1 import account_pb2_grpc as arpc

NOT_BALANCED = 3
STATUSES = ("succeeded", "failed", "expired", "pending", "missing")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", help="ISO 8601: window of event arrivals, from (default: --hours ago)")
    p.add_argument("--until", help="ISO 8601: to, exclusive (default: now)")
    p.add_argument("--hours", type=float, default=1.0, help="the window's length when --since is not given")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print the account as JSON (same as the global --json)")


def request(args: argparse.Namespace, now_ms: int) -> Any:
    until = ts(args.until) or _stamp(now_ms)
    since = ts(args.since) or _stamp(until.ToMilliseconds() - int(args.hours * 3_600_000))
    return apb.GetAccountRequest(start_time=since, end_time=until)


def _stamp(ms: int) -> Timestamp:
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def _reasons(counts: Any) -> str:
    return ", ".join(f"{r} {n}" for r, n in sorted(counts.items())) or "-"


def render(a: Any) -> str:
    rows = [(t.event_type if i < len(a.event_types) else "ALL", t.accepted, t.fanned_out, t.no_subscriber,
             sum(t.dead_lettered.values()), t.not_accounted, *(getattr(t.deliveries, s) for s in STATUSES),
             sum(t.skipped.values()))
            for i, t in enumerate([*a.event_types, a.total])]
    parts = [f"tenant {a.tenant_id}, events that arrived {when(a.start_time)} .. {when(a.end_time)} UTC: "
             + ("every event accounted for" if a.balanced else f"{len(a.unaccounted)} not accounted for"),
             table(["event type", "accepted", "fanned out", "no subscriber", "dead-lettered", "not accounted",
                    *STATUSES, "skipped"], rows)]
    reasons = [(t.event_type, "dead-lettered", _reasons(t.dead_lettered)) for t in a.event_types if t.dead_lettered]
    reasons += [(t.event_type, "skipped", _reasons(t.skipped)) for t in a.event_types if t.skipped]
    if reasons:
        parts.append(table(["event type", "", "reasons"], reasons))
    if a.unaccounted:
        parts.append(table(["not accounted for", "event type", "why", "delivery", "detail"],
                           [(u.event_id, u.event_type, u.kind, u.delivery_id or "-", u.detail) for u in a.unaccounted]))
    parts.append("accepted = fanned out + no subscriber + dead-lettered + not accounted; deliveries of the fanned-out "
                 "events = succeeded + failed + expired + pending + missing (skipped: never sent, never expected)")
    return "\n\n".join(parts)


def main(args: argparse.Namespace) -> int:
    key = os.environ.get("WEBHOOKCTL_API_KEY", "")
    if not key:
        print("webhookctl: set WEBHOOKCTL_API_KEY (the account is the key's tenant's)", file=sys.stderr)
        return 2
    account = call(args, key, lambda channel: arpc.TenantAccountStub(channel).GetAccount(
        request(args, time.time_ns() // 1_000_000)))
    if account is None:
        return 1
    if args.json:
        print(json.dumps(MessageToDict(account, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True), indent=2))
    else:
        print(render(account))
    return 0 if account.balanced else NOT_BALANCED
