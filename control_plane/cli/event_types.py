"""`webhookctl event-types ...`: the event-type catalog from a terminal.

Reads use WEBHOOKCTL_API_KEY (the tenant's own catalog). Changes need a key the admin granted
catalog writing (`event-types grant-writer`), or WEBHOOKCTL_ADMIN_TOKEN with --tenant (used when
no API key is set; `grant-writer` always uses it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict

from control_plane.cli.common import call, table, ts, when
from control_plane.rpc.catalog_api import cpb, crpc


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant", default="", help="the tenant (required with the admin token)")
    cmds = p.add_subparsers(dest="command", required=True)
    c = cmds.add_parser("create", help="catalogue an event type")
    c.add_argument("name", help="dotted lower-case, e.g. invoice.paid")
    c.add_argument("--description", default="")
    # dest type_group: "group" is the top-level command group's dest, which this would overwrite
    c.add_argument("--group", dest="type_group", default="")
    c.add_argument("--enforcement", choices=("reject", "warn"), default="reject",
                   help="a payload failing its schema at fan-out: dead-lettered (reject) or delivered and counted")
    u = cmds.add_parser("update", help="change description, group, enforcement or replay window (only those given)")
    u.add_argument("name")
    u.add_argument("--description")
    u.add_argument("--group", dest="type_group")
    u.add_argument("--enforcement", choices=("reject", "warn"))
    u.add_argument("--replay-window", help="how long after the event its deliveries may be replayed by hand: "
                                           "never, or a duration such as 15m, 1h, 7d; '' for the 30-day history")
    a = cmds.add_parser("add-version", help="add a schema version (refused if it breaks its major)")
    a.add_argument("name")
    a.add_argument("version", help="MAJOR or MAJOR.MINOR")
    a.add_argument("--schema-file", required=True, type=Path, help="the JSON Schema 2020-12 document")
    a.add_argument("--example-file", action="append", type=Path, default=[],
                   help="an example payload (repeatable); default: the schema's own `examples`")
    d = cmds.add_parser("deprecate", help="deprecate a type or one version; lists who still received it")
    d.add_argument("name")
    d.add_argument("--version", default="", help="one version (default: the whole type)")
    d.add_argument("--sunset", required=True, help="ISO 8601 time producers stop emitting it")
    g = cmds.add_parser("get", help="a type and its versions")
    g.add_argument("name")
    g.add_argument("--schema", metavar="VERSION", help="print this version's schema document")
    ls = cmds.add_parser("list", help="the tenant's event types")
    ls.add_argument("--page-size", type=int, default=0)
    ls.add_argument("--cursor")
    s = cmds.add_parser("settings", help="what happens to events whose type or version is not catalogued")
    s.add_argument("--unknown-types", choices=("reject", "warn"))
    r = cmds.add_parser("replay-rule", help="the tenant's replay window for types matching a pattern that have "
                                            "none of their own")
    r.add_argument("pattern", help="an event type, a prefix such as user.*, or *")
    r.add_argument("window", help="never, or a duration such as 15m, 1h, 7d; '' removes the rule")
    e = cmds.add_parser("export", help="documentation for receivers")
    e.add_argument("--format", choices=("openapi", "asyncapi"), required=True)
    e.add_argument("--out", type=Path, help="write to this file (default: stdout)")
    pin = cmds.add_parser("pin", help="the schema majors an endpoint accepts (events of others are not sent to it)")
    pin.add_argument("endpoint_id")
    pin.add_argument("--major", type=int, action="append", default=[], help="an accepted major (repeatable)")
    pin.add_argument("--clear", action="store_true", help="accept every major again")
    w = cmds.add_parser("grant-writer", help="(admin) allow an API key to change its tenant's catalog")
    w.add_argument("key_id")
    w.add_argument("--revoke", action="store_true", help="take the permission away")


def _load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise SystemExit(f"webhookctl: {what} {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SystemExit(f"webhookctl: {what} {path} is not JSON: {exc}") from None


def _type_text(t: Any) -> str:
    head = [f"{t.name} ({t.status}" + (f", sunset {when(t.sunset_at)}" if t.HasField("sunset_at") else "") + ")",
            f"description: {t.description or '-'}", f"group: {t.group or '-'}", f"enforcement: {t.enforcement}",
            f"replay window: {t.replay_window or '30 days (the history)'}",
            f"updated: {when(t.updated_at)} by {t.updated_by}"]
    rows = [(v.version, v.status + (f" until {when(v.sunset_at)}" if v.HasField("sunset_at") else ""),
             when(v.created_at), v.created_by) for v in t.versions]
    return "\n".join(head) + "\n\n" + (table(["version", "status", "created", "by"], rows) if rows else "no versions")


def run(args: argparse.Namespace, stub: Any) -> str | Any:
    """One command; returns the response message, or text when the command prints a document."""
    tenant, cmd = args.tenant, args.command
    if cmd == "create":
        return stub.CreateEventType(cpb.CreateEventTypeRequest(
            tenant_id=tenant, name=args.name, description=args.description, group=args.type_group,
            enforcement=args.enforcement))
    if cmd == "update":
        given = {f: getattr(args, a) for f, a in (("description", "description"), ("group", "type_group"),
                                                  ("enforcement", "enforcement"), ("replay_window", "replay_window"))
                 if getattr(args, a) is not None}
        return stub.UpdateEventType(cpb.UpdateEventTypeRequest(tenant_id=tenant, name=args.name,
                                                               update_fields=list(given), **given))
    if cmd == "add-version":
        schema = _load_json(args.schema_file, "--schema-file")
        examples = [_load_json(p, "--example-file") for p in args.example_file]
        if not examples and isinstance(schema, dict):
            examples = list(schema.get("examples") or [])
        return stub.AddSchemaVersion(cpb.AddSchemaVersionRequest(
            tenant_id=tenant, name=args.name, version=args.version, schema_json=json.dumps(schema),
            examples_json=[json.dumps(x) for x in examples]))
    if cmd == "deprecate":
        return stub.DeprecateEventType(cpb.DeprecateEventTypeRequest(
            tenant_id=tenant, name=args.name, version=args.version, sunset_at=ts(args.sunset)))
    if cmd == "get":
        t = stub.GetEventType(cpb.GetEventTypeRequest(tenant_id=tenant, name=args.name))
        if args.schema:
            found = [v for v in t.versions if v.version in (args.schema, f"{args.schema}.0")]
            if not found:
                raise SystemExit(f"webhookctl: {args.name} has no version {args.schema}")
            return json.dumps(json.loads(found[0].schema_json), indent=2)
        return t
    if cmd == "list":
        return stub.ListEventTypes(cpb.ListEventTypesRequest(tenant_id=tenant, page_size=args.page_size,
                                                             cursor=args.cursor or ""))
    if cmd == "settings":
        if args.unknown_types:
            return stub.SetCatalogSettings(cpb.SetCatalogSettingsRequest(tenant_id=tenant,
                                                                         unknown_types=args.unknown_types))
        return stub.GetCatalog(cpb.GetCatalogRequest(tenant_id=tenant)).settings
    if cmd == "replay-rule":
        return stub.SetReplayRule(cpb.SetReplayRuleRequest(tenant_id=tenant, pattern=args.pattern,
                                                           replay_window=args.window))
    if cmd == "export":
        doc = stub.ExportCatalog(cpb.ExportCatalogRequest(tenant_id=tenant, format=args.format)).document_json
        if args.out:
            args.out.write_text(doc + "\n")
            return f"{args.format} document written to {args.out}"
        return str(doc)
    if cmd == "pin":
        if bool(args.major) == args.clear:
            raise SystemExit("webhookctl: give --major (one or more) or --clear")
        return stub.SetEndpointSchemaMajors(cpb.SetEndpointSchemaMajorsRequest(endpoint_id=args.endpoint_id,
                                                                               schema_majors=args.major))
    stub.SetCatalogWriter(cpb.SetCatalogWriterRequest(tenant_id=tenant, key_id=args.key_id, allowed=not args.revoke))
    return f"key {args.key_id} {'may no longer' if args.revoke else 'may now'} change the catalog of {tenant}"


def render(message: Any) -> str:
    if isinstance(message, cpb.CatalogEventType):
        return _type_text(message)
    if isinstance(message, cpb.ListEventTypesResponse):
        rows = [(t.name, t.status, t.group or "-", t.enforcement, ",".join(v.version for v in t.versions) or "-")
                for t in message.event_types]
        return table(["type", "status", "group", "enforcement", "versions"], rows) + (
            f"\nnext cursor: {message.next_cursor}" if message.next_cursor else "")
    if isinstance(message, cpb.DeprecateEventTypeResponse):
        who = (table(["endpoint", "last delivery"], [(r.endpoint_id, when(r.last_delivery_at))
                                                     for r in message.recent_receivers])
               if message.recent_receivers else "no endpoint received it in the last 7 days")
        return (_type_text(message.event_type) + "\n\nendpoints that received it in the last 7 days:\n" + who
                + ("\n(some endpoints' history was only partly read)" if message.scan_truncated else ""))
    if isinstance(message, cpb.EndpointSchemaMajors):
        return (f"endpoint {message.endpoint_id} accepts schema majors "
                + (", ".join(map(str, message.schema_majors)) or "(all)"))
    if isinstance(message, cpb.CatalogSettings):
        rules = "".join(f"\nreplay window of {r.pattern}: {r.replay_window} (set {when(r.updated_at)} by "
                        f"{r.updated_by})" for r in message.replay_rules)
        return (f"tenant {message.tenant_id}: uncatalogued types or versions -> {message.unknown_types}"
                + (" (default)" if message.is_default else "") + rules)
    return str(message)


def main(args: argparse.Namespace) -> int:
    key, admin = os.environ.get("WEBHOOKCTL_API_KEY", ""), os.environ.get("WEBHOOKCTL_ADMIN_TOKEN", "")
    # --tenant names a tenant for the admin token; without it the tenant's own key speaks.
    token = admin if args.command == "grant-writer" or (args.tenant and admin) else (key or admin)
    if not token:
        print("webhookctl: set WEBHOOKCTL_API_KEY (or WEBHOOKCTL_ADMIN_TOKEN with --tenant)", file=sys.stderr)
        return 2
    result = call(args, token, lambda channel: run(args, crpc.EventCatalogStub(channel)))
    if result is None:
        return 1
    if isinstance(result, str):
        print(result)
    elif args.json:
        print(json.dumps(MessageToDict(result, preserving_proto_field_name=True), indent=2))
    else:
        print(render(result))
    return 0
