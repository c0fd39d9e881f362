"""webhookctl: the control-plane API from a terminal.

    webhookctl [--target HOST:PORT] [--ca FILE | --insecure] [--json] GROUP COMMAND ...

`events publish` writes to the producer database's outbox (like an application would, checked
against the tenant's event-type catalog when a credential is set), `stats` reads Prometheus;
every other group calls the control plane's gRPC API.
Credentials come from the environment so they stay out of shell history and `ps`:
WEBHOOKCTL_API_KEY for tenant commands, WEBHOOKCTL_ADMIN_TOKEN for `tenants`, `keys` and
`reconcile`.
The channel is TLS (the system's roots, or --ca FILE) except to a loopback target (the local dev
stack serves plaintext on 127.0.0.1) or with --insecure.
Output is a readable table, or the API's JSON with --json. Exit status: 0 ok, 1 API error,
2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from control_plane.cli import (
    account_cli,
    deliveries,
    endpoints,
    events,
    listen,
    master_key,
    operations_cli,
    reconcile,
    stats,
    tenants,
)
from control_plane.cli import event_types as catalog_cli
from control_plane.cli.common import Auth, Timeout, open_channel
from control_plane.console import portal_cli
from control_plane.history import query as history_query
from control_plane.rpc.api import rpc
from core.settings import load_settings


def parser() -> argparse.ArgumentParser:
    cp = load_settings().control_plane
    p = argparse.ArgumentParser(prog="webhookctl", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default=f"{cp.host}:{cp.port}", help="control plane HOST:PORT")
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--ca", help="PEM file of the CA that signed the control plane's certificate (TLS)")
    tls.add_argument("--insecure", action="store_true",
                     help="plaintext gRPC (the default only for a loopback target: the dev stack)")
    p.add_argument("--json", action="store_true", help="print the API response as JSON")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per call")
    groups = p.add_subparsers(dest="group", required=True)

    tenants.add_tenants_arguments(groups.add_parser("tenants", help="(admin) tenants"))
    tenants.add_keys_arguments(groups.add_parser("keys", help="(admin) API keys"))
    master_key.add_arguments(groups.add_parser("master-key", help="(admin) master-key rotation"))
    reconcile.add_arguments(groups.add_parser("reconcile", help="(admin) check every durable boundary for a window"))
    endpoints.add_arguments(groups.add_parser("endpoints", help="register and manage webhook endpoints"))
    deliveries.add_arguments(groups.add_parser("deliveries", help="delivery history, replay and recovery"))
    stats.add_arguments(groups.add_parser("stats", help="delivery health per job: rates, ages, p50/p99, breakers, "
                                                        "alerts"))
    listen.add_arguments(groups.add_parser("listen", help="a local HTTPS receiver: verifies and prints each delivery"))
    portal_cli.add_arguments(groups.add_parser("portal", help="(admin) one-time links into the web console"))
    account_cli.add_arguments(groups.add_parser("account", help="where every event of the tenant went in a window, "
                                                               "per event type; any not accounted for by id"))
    catalog_cli.add_arguments(groups.add_parser("event-types", help="the event-type catalog: schemas, exports"))
    operations_cli.add_arguments(groups.add_parser("operations", help="operational events (webhooks.*), auto-disable"))
    history_query.add_arguments(groups.add_parser("history", help="(operator) read-only SQL over the archived history"))
    events.add_arguments(groups.add_parser("events", help="emit events through the transactional outbox (PostgreSQL)"))
    return p


def run(args: argparse.Namespace, tenant: Any, admin: Any, emit: Callable[[Any], None],
        show: Callable[[str], None]) -> None:
    """A command of a group over the ControlPlane (``tenant``) or Admin (``admin``) stub; ``emit``
    prints a response as JSON (--json), ``show`` prints its text."""

    def out(message: Any, text: Callable[[Any], str]) -> None:
        emit(message) if args.json else show(text(message))

    if args.group in ("tenants", "keys"):
        tenants.run(args, admin, out)
    elif args.group == "reconcile":
        reconcile.run(args, admin, out)
    elif args.group == "master-key":
        master_key.run(args, admin, out)
    elif args.group == "endpoints":
        endpoints.run(args, tenant, out)
    else:
        deliveries.run(args, tenant, out)


# Groups whose module runs the whole command: its own credential, channel and output.
_SELF_CONTAINED: dict[str, Callable[[argparse.Namespace], int]] = {
    "events": events.main,
    "event-types": catalog_cli.main,
    "account": account_cli.main,
    "operations": operations_cli.main,
    "history": history_query.main,
    "stats": stats.main,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.group in _SELF_CONTAINED:
        return _SELF_CONTAINED[args.group](args)
    admin_group = args.group in ("tenants", "keys", "reconcile", "master-key", "portal")
    env = "WEBHOOKCTL_ADMIN_TOKEN" if admin_group else "WEBHOOKCTL_API_KEY"
    token = os.environ.get(env, "")
    if not token:
        print(f"webhookctl: set {env}", file=sys.stderr)
        return 2
    try:
        raw_channel = open_channel(args.target, args.ca, args.insecure)
    except OSError as exc:
        print(f"webhookctl: --ca {args.ca}: {exc.strerror}", file=sys.stderr)
        return 2
    channel = grpc.intercept_channel(raw_channel, Auth(token), Timeout(args.timeout))
    try:
        if args.group == "portal":
            return portal_cli.run(args, channel)
        if args.group == "listen":
            return listen.run(args, rpc.ControlPlaneStub(channel))
        run(
            args,
            rpc.ControlPlaneStub(channel),
            rpc.AdminStub(channel),
            emit=lambda m: print(json.dumps(MessageToDict(m, preserving_proto_field_name=True), indent=2)),
            show=print,
        )
    except grpc.RpcError as err:
        print(f"webhookctl: {err.code().name}: {err.details()}", file=sys.stderr)  # type: ignore[attr-defined]
        return 1
    finally:
        channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
