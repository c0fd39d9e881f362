"""`webhookctl master-key reencrypt` (WEBHOOKCTL_ADMIN_TOKEN): seal every endpoint's signing keys
under the current master key, and say whether the old master key can be retired yet.
"""

from __future__ import annotations

import argparse
from typing import Any

from control_plane.cli.common import Out
from control_plane.rpc.api import pb


def add_arguments(p: argparse.ArgumentParser) -> None:
    mk = p.add_subparsers(dest="command", required=True)
    re_ = mk.add_parser("reencrypt", help="seal every signing key under the current master key")
    re_.add_argument("--tenant", help="one tenant (default: all)")
    re_.add_argument("--dry-run", action="store_true", help="count only")


def run(args: argparse.Namespace, admin: Any, out: Out) -> None:
    r = admin.ReencryptSigningKeys(pb.ReencryptSigningKeysRequest(
        tenant_id=args.tenant or "", dry_run=args.dry_run), timeout=max(args.timeout, 600))
    out(r, reencrypt_report)


def reencrypt_report(r: Any) -> str:
    others = sorted(k for k, n in r.keys_by_master_key.items() if n and k != r.current_master_key_id)
    verdict = ("every key is sealed under the current master key"
               + ("" if not r.unpublished else f"; {r.unpublished} endpoint(s) not yet sent to the job: run again")
               if not others else f"still sealed under {', '.join(others)}: run again")
    return "\n".join([
        f"current master key: {r.current_master_key_id}",
        f"endpoints scanned {r.endpoints_scanned}, re-encrypted {r.endpoints_reencrypted} "
        f"({r.keys_reencrypted} keys)",
        "keys by master key: " + ", ".join(f"{k}={n}" for k, n in sorted(r.keys_by_master_key.items())),
        verdict])
