"""`webhookctl portal link --tenant acme --ttl 15m`: a one-time URL into the console's tenant view
(gRPC Portal.CreatePortalLink, admin credential), for a SaaS to open in an iframe of its own page."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from control_plane.console.portal_api import portal_pb, portal_rpc

_TTL = re.compile(r"(\d+)([smh]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600}


def ttl_seconds(text: str) -> int:
    """90, 90s, 15m, 1h -> seconds."""
    match = _TTL.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 15m, 1h)")
    return int(match[1]) * _UNIT_S[match[2]]


def add_arguments(p: argparse.ArgumentParser) -> None:
    links = p.add_subparsers(dest="command", required=True)
    link = links.add_parser("link", help="a URL that opens one tenant's console view once (then expires)")
    link.add_argument("--tenant", required=True)
    link.add_argument("--ttl", type=ttl_seconds, default=15 * 60, help="how long it can be opened: 90s, 15m, 1h")


def run(args: argparse.Namespace, channel: grpc.Channel) -> int:
    r: Any = portal_rpc.PortalStub(channel).CreatePortalLink(
        portal_pb.CreatePortalLinkRequest(tenant_id=args.tenant, ttl_seconds=args.ttl))
    if args.json:
        print(json.dumps(MessageToDict(r, preserving_proto_field_name=True), indent=2))
    else:
        until = r.expires_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")
        print(f"{r.url}\nopens the console for tenant {args.tenant} once, until {until} UTC (link {r.link_id})")
    return 0
