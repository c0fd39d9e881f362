"""`webhookctl tenants ...` and `webhookctl keys ...` (WEBHOOKCTL_ADMIN_TOKEN): create a tenant,
restrict the event types its endpoints may subscribe to, issue and revoke its API keys.
"""

from __future__ import annotations

import argparse
from typing import Any

from control_plane.cli.common import Out
from control_plane.rpc.api import pb


def add_tenants_arguments(p: argparse.ArgumentParser) -> None:
    tenants = p.add_subparsers(dest="command", required=True)
    t = tenants.add_parser("create", help="create a tenant")
    t.add_argument("--id")
    t.add_argument("--name")
    t.add_argument("--verify-endpoints", action=argparse.BooleanOptionalAction, default=None,
                   help="endpoints answer an ownership challenge before receiving events (default: on in production)")
    t = tenants.add_parser("event-types", help="restrict the event types the tenant's endpoints may subscribe to")
    t.add_argument("tenant")
    allow = t.add_mutually_exclusive_group(required=True)
    allow.add_argument("--allow", action="append", metavar="TYPE", help="repeat: invoice.paid, invoice.*, *")
    allow.add_argument("--unrestricted", action="store_true")


def add_keys_arguments(p: argparse.ArgumentParser) -> None:
    keys = p.add_subparsers(dest="command", required=True)
    k = keys.add_parser("create", help="issue an API key for a tenant (printed once)")
    k.add_argument("--tenant", required=True)
    k.add_argument("--description")
    k.add_argument("--read-only", action="store_true")
    k = keys.add_parser("revoke", help="revoke an API key at once")
    k.add_argument("--tenant", required=True)
    k.add_argument("key_id")


def run(args: argparse.Namespace, admin: Any, out: Out) -> None:
    group, cmd = args.group, args.command
    if group == "tenants" and cmd == "event-types":
        r = admin.SetTenantEventTypes(pb.SetTenantEventTypesRequest(
            tenant_id=args.tenant, allowed_event_types=args.allow or [], unrestricted=args.unrestricted))
        out(r, lambda r: (f"tenant {r.tenant.tenant_id}: " + (", ".join(r.tenant.allowed_event_types)
                                                            if r.tenant.event_types_restricted else "unrestricted"))
            + (f"\nendpoints outside the list (not changed): {', '.join(r.endpoints_outside)}"
               if r.endpoints_outside else ""))
    elif group == "tenants":
        t = admin.CreateTenant(pb.CreateTenantRequest(tenant_id=args.id or "", name=args.name or "",
                                                      verify_endpoints=args.verify_endpoints))
        out(t, lambda t: f"tenant {t.tenant_id} created")
    elif cmd == "create":
        k = admin.CreateApiKey(pb.CreateApiKeyRequest(
            tenant_id=args.tenant, description=args.description or "", read_only=args.read_only))
        out(k, lambda k: f"key {k.key_id}\napi key (shown once): {k.api_key}")
    else:  # keys revoke
        admin.RevokeApiKey(pb.RevokeApiKeyRequest(tenant_id=args.tenant, key_id=args.key_id))
        out(pb.RevokeApiKeyResponse(), lambda _: f"key {args.key_id} revoked")
