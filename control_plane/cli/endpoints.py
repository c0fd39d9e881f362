"""`webhookctl endpoints ...`: register and manage a tenant's webhook endpoints (WEBHOOKCTL_API_KEY):
create, read, update, disable/enable, delete, versions, secret rotation, ownership challenges,
pings, and the ordering keys an endpoint's failing heads hold.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from typing import Any

from google.protobuf.field_mask_pb2 import FieldMask

from control_plane.cli.common import Out, next_cursor_line, status_name, table, when
from control_plane.rpc.api import pb
from core.custom_headers import HeaderInput, InvalidHeaders, parse_flag_list


def add_arguments(p: argparse.ArgumentParser) -> None:
    ep = p.add_subparsers(dest="command", required=True)
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


def _header_flags(p: argparse.ArgumentParser, replaces: str = "") -> None:
    p.add_argument("--header", action="append", metavar="'NAME: VALUE'",
                   help="repeat; a custom header sent with every request" + replaces)
    p.add_argument("--secret-header", action="append", metavar="'NAME: VALUE'",
                   help="repeat; a custom header whose value is sealed and never shown again")
    p.add_argument("--secret-header-env", action="append", metavar="NAME=ENV_VAR",
                   help="repeat; a secret custom header whose value is read from an environment variable")


def run(args: argparse.Namespace, tenant: Any, out: Out) -> None:
    cmd = args.command
    ref = pb.GetEndpointRequest(endpoint_id=getattr(args, "endpoint_id", "") or "")
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
        out(r, lambda r: endpoint_rows(r.endpoints) + next_cursor_line(r.next_cursor))
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


# -- flags in ---------------------------------------------------------------------------------


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


# -- output -----------------------------------------------------------------------------------


def endpoint_rows(endpoints: Iterable[Any]) -> str:
    return table(
        ["id", "status", "version", "published", "url", "event types"],
        [
            (e.endpoint_id, status_name(pb.EndpointStatus, e.status), e.config_version,
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
        ("id", e.endpoint_id), ("url", e.url), ("status", status_name(pb.EndpointStatus, e.status)),
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


def _delivery_settings(v: Any) -> tuple[str, str]:
    """A version's payload mode and ordering key; "?" for versions recorded before they were kept."""
    if not v.payload_mode:
        return "?", "?"
    payload = f"fields:{','.join(v.payload_fields)}" if v.payload_mode == "fields" else v.payload_mode
    return payload, v.ordering_key or "-"


def _key_shown(r: Any) -> str:
    """What a create or rotation hands over: an HMAC secret once, or an ed25519 public key."""
    if r.public_key:
        return f"public key (ed25519; verify v1a signatures with it): {r.public_key}"
    if r.signing_secret:
        return f"signing secret (shown once): {r.signing_secret}"
    return "signing secret: not shown again for a retried request_id (rotate it to get a new one)"
