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
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
import psycopg
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.json_format import MessageToDict

from control_plane.cli import account_cli, listen, operations_cli
from control_plane.cli import event_types as catalog_cli
from control_plane.cli.common import Auth, Timeout, open_channel, plaintext, table, ts, when
from control_plane.console import portal_cli
from control_plane.history import query as history_query
from control_plane.history import stats
from control_plane.rpc.api import pb, rpc
from core.custom_headers import HeaderInput, InvalidHeaders, parse_flag_list
from core.settings import load_settings
from outbox.catalog_client import GrpcCatalog
from outbox.producer import OutboxError, write_event
from outbox.schemas import SchemaGuard

Out = Callable[[Any], None]


# -- output -----------------------------------------------------------------------------------


def _delivery_settings(v: Any) -> tuple[str, str]:
    """A version's payload mode and ordering key; "?" for versions recorded before they were kept."""
    if not v.payload_mode:
        return "?", "?"
    payload = f"fields:{','.join(v.payload_fields)}" if v.payload_mode == "fields" else v.payload_mode
    return payload, v.ordering_key or "-"


def _status(enum: Any, value: int) -> str:
    return enum.Name(value).split("_STATUS_", 1)[-1].lower()  # ENDPOINT_STATUS_PENDING_VERIFICATION


def endpoint_rows(endpoints: Iterable[Any]) -> str:
    return table(
        ["id", "status", "version", "published", "url", "event types"],
        [
            (e.endpoint_id, _status(pb.EndpointStatus, e.status), e.config_version,
             e.published_version, e.url, ",".join(e.event_types))
            for e in endpoints
        ],
    )


def endpoint_detail(e: Any) -> str:
    keys = ", ".join(
        f"v{k.version}" + (f" ed25519 {k.public_key}" if k.public_key else "")
        + (f" (until {when(k.not_after)})" if k.HasField("not_after") else "")
        for k in e.signing_keys
    )
    pairs = [
        ("id", e.endpoint_id), ("url", e.url), ("status", _status(pb.EndpointStatus, e.status)),
        ("description", e.description or "-"), ("event types", ", ".join(e.event_types)),
        ("rate limit/s", e.rate_limit_per_s if e.HasField("rate_limit_per_s") else "default"),
        ("max in flight", e.max_in_flight if e.HasField("max_in_flight") else "default"),
        ("config version", f"{e.config_version} (published {e.published_version})"),
        ("signing keys", keys or "-"),
        ("metadata", ", ".join(f"{k}={v}" for k, v in sorted(e.metadata.items())) or "-"),
        ("payload", (e.payload_mode or "full") + (f" {', '.join(e.payload_fields)}" if e.payload_fields else "")),
        ("ordering key", e.ordering_key or "none"),
        ("schema majors", ", ".join(map(str, e.schema_majors)) or "all"),
        ("headers", ", ".join(f"{h.name}: {'(secret)' if h.secret else h.value}" for h in e.headers) or "none"),
        *([("challenge", f"{e.challenge_event_id}, answer by {when(e.challenge_expires_at)} "
                         "(then: endpoints verify)")] if e.challenge_event_id else []),
        ("updated", when(e.updated_at)),
    ]
    return "\n".join(f"{k + ':':<16}{v}" for k, v in pairs)


def delivery_rows(deliveries: Iterable[Any]) -> str:
    return table(
        ["delivery", "created", "event type", "status", "attempts", "last http"],
        [
            (d.delivery_id, when(d.created_at), d.event_type,
             _status(pb.DeliveryStatus, d.status), d.attempt_count, d.last_http_status or "-")
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


def blocked_key_rows(keys: Iterable[Any]) -> str:
    return table(
        ["ordering key", "head delivery", "version", "attempts", "last", "next attempt", "waiting", "blocked since"],
        [
            (k.ordering_key, k.head_delivery_id, k.head_object_version, k.attempts,
             k.last_http_status or k.last_error_class or "-", when(k.next_attempt_at), k.waiting,
             when(k.blocked_since))
            for k in keys
        ],
    )


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


# The report's counts, boundary by boundary (see core/reconcile.py), in reading order.
REPORT_ROWS = (
    ("1. topic -> fan-out", ("events_on_topic", "events_dead_lettered", "events_fanned_out",
                             "events_without_subscriber", "events_released_without_clock")),
    ("2. fan-out -> deliveries", ("deliveries_expected", "deliveries_found")),
    ("3. deliveries -> status", ("succeeded", "failed", "expired", "pending_in_progress", "pending_held",
                                 "pending_orphaned")),
    ("4. status -> attempts", ("attempts", "requests_outcome_unknown")),
)


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


# -- commands ---------------------------------------------------------------------------------





def _more(next_cursor: str) -> str:
    return f"\nnext cursor: {next_cursor}" if next_cursor else ""


def _metadata(pairs: list[str] | None) -> dict[str, str]:
    result = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"webhookctl: --metadata expects KEY=VALUE, got {pair!r}")
        result[key] = value
    return result


def _headers(args: argparse.Namespace) -> list[Any] | None:
    """The custom headers the flags give, or None when none of them is given. A secret value
    may come from an environment variable, so it is in neither the shell history nor `ps`."""
    if args.header is None and args.secret_header is None and args.secret_header_env is None \
            and not getattr(args, "clear_headers", False):
        return None
    try:
        given = [*parse_flag_list(args.header or [], secret=False),
                 *parse_flag_list(args.secret_header or [], secret=True)]
    except InvalidHeaders as exc:
        raise SystemExit(f"webhookctl: {exc}") from None
    for item in args.secret_header_env or []:
        name, sep, variable = item.partition("=")
        if not sep or not name or not variable:
            raise SystemExit(f"webhookctl: --secret-header-env expects NAME=ENV_VAR, got {item!r}")
        if variable not in os.environ:
            raise SystemExit(f"webhookctl: --secret-header-env {name}: {variable} is not set")
        given.append(HeaderInput(name, os.environ[variable], secret=True))
    return [pb.CustomHeader(name=h.name, value=h.value, secret=h.secret) for h in given]


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


def run(args: argparse.Namespace, tenant: Any, admin: Any, emit: Out, show: Callable[[str], None]) -> None:
    group, cmd = args.group, getattr(args, "command", "")
    ref = pb.GetEndpointRequest(endpoint_id=getattr(args, "endpoint_id", "") or "")

    def out(message: Any, text: Callable[[Any], str]) -> None:
        emit(message) if args.json else show(text(message))

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
    elif group == "keys" and cmd == "create":
        k = admin.CreateApiKey(pb.CreateApiKeyRequest(
            tenant_id=args.tenant, description=args.description or "", read_only=args.read_only))
        out(k, lambda k: f"key {k.key_id}\napi key (shown once): {k.api_key}")
    elif group == "keys":
        admin.RevokeApiKey(pb.RevokeApiKeyRequest(tenant_id=args.tenant, key_id=args.key_id))
        out(pb.RevokeApiKeyResponse(), lambda _: f"key {args.key_id} revoked")
    elif group == "reconcile":
        r = admin.Reconcile(pb.ReconcileRequest(
            start_time=ts(args.since), end_time=ts(args.until), tenant_id=args.tenant or "",
            repair=args.repair, overdue_after_seconds=args.overdue_after), timeout=max(args.timeout, 600))
        out(r, reconcile_report)
    elif group == "master-key":
        r = admin.ReencryptSigningKeys(pb.ReencryptSigningKeysRequest(
            tenant_id=args.tenant or "", dry_run=args.dry_run), timeout=max(args.timeout, 600))
        out(r, reencrypt_report)
    elif group == "endpoints":
        run_endpoints(args, tenant, ref, out)
    else:
        run_deliveries(args, tenant, out)


def _key_shown(r: Any) -> str:
    """What a create or rotation hands over: an HMAC secret once, or an ed25519 public key."""
    if r.public_key:
        return f"public key (ed25519; verify v1a signatures with it): {r.public_key}"
    if r.signing_secret:
        return f"signing secret (shown once): {r.signing_secret}"
    return "signing secret: not shown again for a retried request_id (rotate it to get a new one)"


def run_endpoints(args: argparse.Namespace, tenant: Any, ref: Any, out: Callable[..., None]) -> None:
    cmd = args.command
    if cmd == "create":
        r = tenant.CreateEndpoint(pb.CreateEndpointRequest(
            request_id=args.request_id or "", url=args.url, description=args.description or "",
            event_types=args.event_type, rate_limit_per_s=args.rate_limit,
            max_in_flight=args.max_in_flight, metadata=_metadata(args.metadata),
            signature_scheme=args.signature_scheme or "", payload_mode=args.payload_mode or "",
            payload_fields=args.payload_field or [], ordering_key=args.ordering_key or "",
            schema_majors=args.schema_major or [], headers=_headers(args) or []))
        out(r, lambda r: f"{endpoint_detail(r.endpoint)}\n\n" + _key_shown(r))
    elif cmd == "get":
        out(tenant.GetEndpoint(ref), endpoint_detail)
    elif cmd == "list":
        r = tenant.ListEndpoints(pb.ListEndpointsRequest(page_size=args.page_size, cursor=args.cursor or ""))
        out(r, lambda r: endpoint_rows(r.endpoints) + _more(r.next_cursor))
    elif cmd == "update":
        values = pb.Endpoint(url=args.url or "", description=args.description or "",
                             event_types=args.event_type or [], metadata=_metadata(args.metadata))
        values.payload_mode = args.payload_mode or ""
        values.payload_fields.extend(args.payload_field or [])
        values.ordering_key = args.ordering_key or ""
        values.schema_majors.extend(args.schema_major or [])
        headers = _headers(args)
        values.headers.extend(headers or [])
        paths = [p for p, given in (("url", args.url), ("description", args.description),
                                    ("event_types", args.event_type), ("metadata", args.metadata),
                                    ("payload_mode", args.payload_mode), ("payload_fields", args.payload_field),
                                    ("ordering_key", args.ordering_key),
                                    ("schema_majors", args.schema_major or args.clear_schema_majors or None),
                                    ("headers", headers))
                 if given is not None]
        for field, value, clear in (("rate_limit_per_s", args.rate_limit, args.clear_rate_limit),
                                    ("max_in_flight", args.max_in_flight, args.clear_max_in_flight)):
            if value is not None:
                setattr(values, field, value)
            if value is not None or clear:
                paths.append(field)
        r = tenant.UpdateEndpoint(pb.UpdateEndpointRequest(
            endpoint_id=args.endpoint_id, endpoint=values, update_mask=FieldMask(paths=paths)))
        out(r, endpoint_detail)
    elif cmd in ("disable", "enable"):
        call = tenant.DisableEndpoint if cmd == "disable" else tenant.EnableEndpoint
        out(call(ref), endpoint_detail)
    elif cmd == "delete":
        out(tenant.DeleteEndpoint(ref), lambda r: f"endpoint {r.endpoint_id} deleted (v{r.config_version})")
    elif cmd == "versions":
        out(tenant.ListEndpointVersions(ref), lambda r: table(
            ["version", "changed", "by", "change", "url", "keys", "headers", "payload", "ordering"],
            [(v.config_version, when(v.changed_at), v.changed_by, v.change, v.url,
              ",".join(map(str, v.signing_key_versions)),
              # Names only (a secret one starred): a version's values are in its change, not here.
              ",".join(h.name + ("*" if h.secret else "") for h in v.headers) or "-",
              *_delivery_settings(v)) for v in r.versions]))
    elif cmd == "rotate-secret":
        mode = (pb.RotateSecretRequest.MODE_REVOKE_IMMEDIATELY if args.revoke_now
                else pb.RotateSecretRequest.MODE_OVERLAP)
        r = tenant.RotateSecret(pb.RotateSecretRequest(
            endpoint_id=args.endpoint_id, mode=mode, overlap_seconds=args.overlap or 0,
            signature_scheme=args.signature_scheme or ""))
        out(r, lambda r: "\n".join([
            f"new key v{r.new_key_version}; live keys:",
            *(f"  v{k.version} {k.signature_scheme}"
              + (f" until {when(k.not_after)}" if k.HasField("not_after") else "") for k in r.live_keys),
            _key_shown(r)]))
    elif cmd == "verify":
        out(tenant.VerifyEndpoint(ref), endpoint_detail)
    elif cmd == "resend-challenge":
        out(tenant.ResendChallenge(ref), endpoint_detail)
    elif cmd == "blocked-keys":
        r = tenant.ListBlockedKeys(pb.ListBlockedKeysRequest(
            endpoint_id=args.endpoint_id, page_size=args.page_size, page_token=args.page_token or ""))
        out(r, lambda r: (blocked_key_rows(r.keys) if r.keys else "no blocked ordering keys")
            + (f"\nnext page token: {r.next_page_token}" if r.next_page_token else ""))
    elif cmd == "skip-head":
        r = tenant.SkipOrderingHead(pb.SkipOrderingHeadRequest(
            endpoint_id=args.endpoint_id, ordering_key=args.ordering_key, delivery_id=args.delivery_id or "",
            reason=args.reason, request_id=args.request_id or ""))
        out(r, lambda r: f"skip {r.request_id} of delivery {r.delivery_id} queued: it ends failed and the "
            f"key's next delivery goes next")
    else:  # ping
        out(tenant.SendTestEvent(ref), lambda r: f"ping {r.event_id} queued as delivery {r.delivery_id}")


def run_deliveries(args: argparse.Namespace, tenant: Any, out: Callable[..., None]) -> None:
    cmd = args.command
    if cmd == "list":
        statuses = [pb.DeliveryStatus.Value(f"DELIVERY_STATUS_{s.upper()}") for s in args.status or []]
        r = tenant.ListDeliveries(pb.ListDeliveriesRequest(
            endpoint_id=args.endpoint_id, statuses=statuses, start_time=ts(args.since),
            end_time=ts(args.until), page_size=args.page_size, cursor=args.cursor or ""))
        out(r, lambda r: delivery_rows(r.deliveries) + _more(r.next_cursor))
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


# -- arguments --------------------------------------------------------------------------------


def _header_flags(p: argparse.ArgumentParser, replaces: str = "") -> None:
    p.add_argument("--header", action="append", metavar="'NAME: VALUE'",
                   help="repeat; a custom header sent with every request" + replaces)
    p.add_argument("--secret-header", action="append", metavar="'NAME: VALUE'",
                   help="repeat; a custom header whose value is sealed and never shown again")
    p.add_argument("--secret-header-env", action="append", metavar="NAME=ENV_VAR",
                   help="repeat; a secret custom header whose value is read from an environment variable")


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

    tenants = groups.add_parser("tenants", help="(admin) tenants").add_subparsers(
        dest="command", required=True
    )
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

    keys = groups.add_parser("keys", help="(admin) API keys").add_subparsers(dest="command", required=True)
    k = keys.add_parser("create", help="issue an API key for a tenant (printed once)")
    k.add_argument("--tenant", required=True)
    k.add_argument("--description")
    k.add_argument("--read-only", action="store_true")
    k = keys.add_parser("revoke", help="revoke an API key at once")
    k.add_argument("--tenant", required=True)
    k.add_argument("key_id")

    mk = groups.add_parser("master-key", help="(admin) master-key rotation").add_subparsers(
        dest="command", required=True)
    re_ = mk.add_parser("reencrypt", help="seal every signing key under the current master key")
    re_.add_argument("--tenant", help="one tenant (default: all)")
    re_.add_argument("--dry-run", action="store_true", help="count only")

    rec = groups.add_parser("reconcile", help="(admin) check every durable boundary for a window")
    rec.add_argument("--since", required=True, help="ISO 8601: window of event arrivals, from")
    rec.add_argument("--until", required=True, help="ISO 8601: to (exclusive)")
    rec.add_argument("--tenant")
    rec.add_argument("--repair", action="store_true", help="re-drive what is missing (idempotent)")
    rec.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                     help="print the report as JSON (same as the global --json)")
    rec.add_argument("--overdue-after", type=int, default=0, metavar="SECONDS",
                     help="a pending delivery due longer ago, on an endpoint no job holds, is orphaned")

    ep = groups.add_parser("endpoints", help="register and manage webhook endpoints").add_subparsers(
        dest="command", required=True)
    c = ep.add_parser("create", help="register an endpoint (prints its signing secret once)")
    c.add_argument("--url", required=True)
    c.add_argument("--event-type", action="append", required=True, help="repeat; `invoice.*` for a prefix")
    c.add_argument("--description")
    c.add_argument("--rate-limit", type=float)
    c.add_argument("--max-in-flight", type=int)
    c.add_argument("--metadata", action="append", metavar="KEY=VALUE")
    c.add_argument("--request-id", help="idempotency key: a retry returns the same endpoint")
    c.add_argument("--payload-mode", choices=["full", "fields", "thin"],
                   help="what the endpoint is sent: the full payload (default), only --payload-field "
                   "members, or a thin reference")
    c.add_argument("--payload-field", action="append", metavar="JSON_POINTER",
                   help="repeat; e.g. /id, /customer/id (with --payload-mode fields)")
    c.add_argument("--signature-scheme", choices=["hmac-sha256", "ed25519"],
                   help="hmac-sha256 (default: a shared whsec_ secret) or ed25519 (receivers get a whpk_ public key)")
    c.add_argument("--ordering-key", metavar="object_id|JSON_POINTER",
                   help="one delivery at a time per key, in object version order; a failing one holds "
                   "its key's later deliveries (default: not ordered)")
    c.add_argument("--schema-major", type=int, action="append", metavar="MAJOR",
                   help="repeat; the schema majors of its event types the endpoint accepts (default: all)")
    _header_flags(c)
    for name, text in (("get", "show one endpoint"),
                       ("disable", "stop deliveries; pending ones wait until enabled"),
                       ("enable", "resume deliveries to a disabled endpoint"),
                       ("delete", "delete an endpoint; its pending deliveries are cancelled"),
                       ("versions", "the endpoint's configuration history"),
                       ("ping", "send a signed webhook.ping event to the endpoint"),
                       ("verify", "activate an endpoint that answered its ownership challenge"),
                       ("resend-challenge", "send a pending endpoint a new ownership challenge")):
        ep.add_parser(name, help=text).add_argument("endpoint_id")
    ls = ep.add_parser("list", help="list the tenant's endpoints")
    ls.add_argument("--page-size", type=int, default=0)
    ls.add_argument("--cursor")
    u = ep.add_parser("update", help="only the options given change")
    u.add_argument("endpoint_id")
    u.add_argument("--url")
    u.add_argument("--description")
    u.add_argument("--event-type", action="append")
    u.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="replaces all metadata")
    u.add_argument("--rate-limit", type=float)
    u.add_argument("--clear-rate-limit", action="store_true")
    u.add_argument("--max-in-flight", type=int)
    u.add_argument("--clear-max-in-flight", action="store_true")
    u.add_argument("--payload-mode", choices=["full", "fields", "thin"])
    u.add_argument("--payload-field", action="append", metavar="JSON_POINTER", help="replaces the allow-list")
    u.add_argument("--ordering-key", metavar="object_id|JSON_POINTER",
                   help="'' turns ordering off (held deliveries go at once); existing deliveries keep their key")
    u.add_argument("--schema-major", type=int, action="append", metavar="MAJOR", help="replaces the accepted majors")
    u.add_argument("--clear-schema-majors", action="store_true", help="accept every major again")
    _header_flags(u, " (with the other header flags: replaces every custom header; an empty secret value keeps it)")
    u.add_argument("--clear-headers", action="store_true", help="remove every custom header")
    bk = ep.add_parser("blocked-keys", help="ordering keys whose head keeps failing, holding later deliveries")
    bk.add_argument("endpoint_id")
    bk.add_argument("--page-size", type=int, default=0)
    bk.add_argument("--page-token")
    sk = ep.add_parser("skip-head", help="end a blocked ordering key's head as failed so the key moves on")
    sk.add_argument("endpoint_id")
    sk.add_argument("ordering_key")
    sk.add_argument("--delivery-id", help="the head you saw: refused if the key's head is another one by now")
    sk.add_argument("--reason", required=True, help="why, for the audit shown by `deliveries get`")
    sk.add_argument("--request-id")
    r = ep.add_parser("rotate-secret", help="new signing secret; the old one may keep signing for an overlap")
    r.add_argument("endpoint_id")
    mode = r.add_mutually_exclusive_group()
    mode.add_argument("--overlap", type=int, metavar="SECONDS", help="old key keeps signing (default 24 h)")
    mode.add_argument("--revoke-now", action="store_true", help="old keys stop signing at once")
    r.add_argument("--signature-scheme", choices=["hmac-sha256", "ed25519"],
                   help="the new key's scheme (default: the current one's); the overlap spans schemes")

    dl = groups.add_parser("deliveries", help="delivery history, replay and recovery").add_subparsers(
        dest="command", required=True)
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

    st = groups.add_parser("stats", help="delivery health per job: rates, ages, p50/p99, breakers, alerts")
    st.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    st.add_argument("--job", help="only this delivery job (its Flink job name)")

    listen.add_arguments(groups.add_parser("listen", help="a local HTTPS receiver: verifies and prints each delivery"))

    portal_cli.add_arguments(groups.add_parser("portal", help="(admin) one-time links into the web console"))

    account_cli.add_arguments(groups.add_parser("account", help="where every event of the tenant went in a window, "
                                                               "per event type; any not accounted for by id"))
    catalog_cli.add_arguments(groups.add_parser("event-types", help="the event-type catalog: schemas, exports"))
    operations_cli.add_arguments(groups.add_parser("operations", help="operational events (webhooks.*), auto-disable"))
    history_query.add_arguments(groups.add_parser("history", help="(operator) read-only SQL over the archived history"))

    ev = groups.add_parser("events", help="emit events through the transactional outbox (PostgreSQL)")
    evs = ev.add_subparsers(dest="command", required=True)
    pub = evs.add_parser("publish", help="write one event to the outbox in one transaction; prints its event_id")
    pub.add_argument("--tenant", required=True)
    pub.add_argument("--type", required=True, help="event type, e.g. invoice.paid")
    pub.add_argument("--data", required=True, help="the JSON body; @FILE reads a file, - reads stdin")
    pub.add_argument("--object-id")
    pub.add_argument("--object-version", type=int)
    pub.add_argument("--schema-version", default="1")
    pub.add_argument("--event-id", help="default: a new time-ordered id")
    pub.add_argument("--dsn", default=None, help="producer database (default: settings outbox.dsn)")
    return p


def publish_event(args: argparse.Namespace) -> int:
    """`events publish`: the producer library in one transaction of its own, with the same checks
    an application gets: strict JSON always, and the tenant's event-type catalog (SchemaGuard, read
    from the control plane) when a credential is set. The outbox is the producer database."""
    data = _event_data(args.data)
    dsn = args.dsn or load_settings().outbox.dsn
    try:
        catalog = _catalog(args)
    except OSError as exc:
        print(f"webhookctl: --ca {args.ca}: {exc.strerror}", file=sys.stderr)
        return 2
    if catalog is None:
        print("webhookctl: not checked against the event-type catalog (set WEBHOOKCTL_API_KEY, or "
              "WEBHOOKCTL_ADMIN_TOKEN); the delivery job checks it", file=sys.stderr)
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            event_id = write_event(conn, args.tenant, args.type, data, object_id=args.object_id,
                                   object_version=args.object_version, schema_version=args.schema_version,
                                   event_id=args.event_id, schemas=SchemaGuard(catalog) if catalog else None)
    except OutboxError as exc:
        print(f"webhookctl: invalid event: {exc}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        print(f"webhookctl: outbox write failed: {exc}".rstrip(), file=sys.stderr)
        return 1
    finally:
        if catalog is not None:
            catalog.close()
    print(json.dumps({"event_id": event_id}) if args.json else event_id)
    return 0


def _event_data(data: str) -> str | bytes:
    if data == "-":
        return sys.stdin.read()
    if data.startswith("@"):
        with open(data[1:], "rb") as f:
            return f.read()
    return data


def _catalog(args: argparse.Namespace) -> GrpcCatalog | None:
    """The tenant's catalog as the producer library reads it, with the credential `event-types`
    would use for --tenant (the admin token, else the tenant's key); None without one. Unreachable,
    it writes the event unchecked with a warning, as an application's producer does."""
    token = os.environ.get("WEBHOOKCTL_ADMIN_TOKEN", "") or os.environ.get("WEBHOOKCTL_API_KEY", "")
    if not token:
        return None
    return GrpcCatalog(args.target, token, ca_file=args.ca, insecure=plaintext(args.target, args.ca, args.insecure),
                       timeout_s=args.timeout)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.group == "events":
        return publish_event(args)
    if args.group == "event-types":
        return catalog_cli.main(args)
    if args.group == "account":
        return account_cli.main(args)
    if args.group == "operations":
        return operations_cli.main(args)
    if args.group == "history":
        return history_query.main(args)
    if args.group == "stats":
        try:
            jobs, alerts = stats.collect(args.prometheus, args.job)
        except stats.PrometheusError as exc:
            print(f"webhookctl: {exc}", file=sys.stderr)
            return 1
        print(stats.render(jobs, alerts))
        return 0
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
