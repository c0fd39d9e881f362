"""`webhookctl operations ...`: operational events and auto-disable from a terminal (WEBHOOKCTL_API_KEY).

    webhookctl operations auto-disable                      # show the tenant's setting
    webhookctl operations auto-disable --window 2d --warn-at 0.5,0.9 [--dry-run] [--off]
    webhookctl operations types                             # the webhooks.* event types
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from google.protobuf.json_format import MessageToDict

from control_plane.cli.common import call, table, when
from protogen.webhooks.v1 import operations_pb2 as opb
from protogen.webhooks.v1 import operations_pb2_grpc as orpc

_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(text: str) -> int:
    """A duration such as 90s, 15m, 12h, 5d, in seconds."""
    m = _DURATION.fullmatch(text.strip().lower())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration such as 90s, 15m, 12h or 5d")
    return int(m.group(1)) * _UNIT_S[m.group(2)]


def shares(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: shares of the window such as 0.5,0.7,0.9") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    cmds = p.add_subparsers(dest="command", required=True)
    a = cmds.add_parser("auto-disable", help="show, or change (any option given), the tenant's auto-disable")
    a.add_argument("--window", type=seconds, help="failing without a success this long disables (default 5d)")
    a.add_argument("--warn-at", type=shares, help="shares of the window that warn (default 0.5,0.7,0.9)")
    a.add_argument("--dry-run", action="store_true", help="only warn: never disable")
    a.add_argument("--off", action="store_true", help="no warnings, no auto-disable")
    cmds.add_parser("types", help="the operational event types (webhooks.*), with their schemas")


def run(args: argparse.Namespace, stub: Any) -> Any:
    if args.command == "types":
        return stub.ListOperationalEventTypes(opb.ListOperationalEventTypesRequest())
    if args.window is None and args.warn_at is None and not args.dry_run and not args.off:
        return stub.GetAutoDisable(opb.GetAutoDisableRequest())
    return stub.SetAutoDisable(opb.SetAutoDisableRequest(
        off=args.off, window_seconds=args.window or 0, warn_at=args.warn_at or [], dry_run=args.dry_run))


def render(message: Any) -> str:
    if isinstance(message, opb.ListOperationalEventTypesResponse):
        return table(["type", "version", "description"],
                     [[t.name, t.schema_version, t.description] for t in message.types])
    if message.off:
        state = "off"
    else:
        warn = ", ".join(f"{round(w * 100)} %" for w in message.warn_at) or "none"
        state = (f"window {message.window_seconds} s, warnings at {warn}"
                 + (", dry-run (warnings only)" if message.dry_run else ""))
    origin = " (default)" if message.is_default else f" (set {when(message.updated_at)} by {message.updated_by})"
    return f"auto-disable: {state}{origin}"


def main(args: argparse.Namespace) -> int:
    token = os.environ.get("WEBHOOKCTL_API_KEY", "")
    if not token:
        print("webhookctl: set WEBHOOKCTL_API_KEY", file=sys.stderr)
        return 2
    result = call(args, token, lambda channel: run(args, orpc.OperationsStub(channel)))
    if result is None:
        return 1
    if args.json:
        print(json.dumps(MessageToDict(result, preserving_proto_field_name=True), indent=2))
    else:
        print(render(result))
    return 0
