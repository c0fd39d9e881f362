"""`webhookctl events publish`: emit one event the way an application does, a row written to the
producer database's transactional outbox in one transaction (outbox.producer), checked against
the tenant's event-type catalog when a credential is set, and with tracing on the first span of
its trace (docs/producers.md, tracing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import psycopg

from control_plane.cli.common import plaintext
from core import trace_context
from core.settings import load_settings
from outbox.catalog_client import GrpcCatalog
from outbox.producer import OutboxError, write_event
from outbox.schemas import SchemaGuard
from tracing import tracer


def add_arguments(p: argparse.ArgumentParser) -> None:
    evs = p.add_subparsers(dest="command", required=True)
    pub = evs.add_parser("publish", help="write one event to the outbox in one transaction; prints its event_id")
    pub.add_argument("--tenant", required=True)
    pub.add_argument("--type", required=True, help="event type, e.g. invoice.paid")
    pub.add_argument("--data", required=True, help="the JSON body; @FILE reads a file, - reads stdin")
    pub.add_argument("--object-id")
    pub.add_argument("--object-version", type=int)
    pub.add_argument("--schema-version", default="1")
    pub.add_argument("--event-id", help="default: a new time-ordered id")
    pub.add_argument("--dsn", default=None, help="producer database (default: settings outbox.dsn)")
    pub.add_argument("--traceparent", default=None,
                     help="a W3C traceparent the event continues (with tracing on, the outbox write is its child)")


def main(args: argparse.Namespace) -> int:
    """`events publish`: the producer library in one transaction of its own, with the same checks
    an application gets: strict JSON always, and the tenant's event-type catalog (SchemaGuard, read
    from the control plane) when a credential is set. The outbox is the producer database."""
    data = _event_data(args.data)
    settings = load_settings()
    dsn = args.dsn or settings.outbox.dsn
    # None with tracing off; on, the row is the "outbox write" span (flushed when the process exits).
    producer_tracer = tracer(settings.tracing, settings.tracing.producer_service_name)
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
                                   event_id=args.event_id, schemas=SchemaGuard(catalog) if catalog else None,
                                   traceparent=args.traceparent, tracer=producer_tracer)
            trace = _row_trace(conn, event_id) if producer_tracer is not None or args.traceparent else None
    except OutboxError as exc:
        print(f"webhookctl: invalid event: {exc}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        print(f"webhookctl: outbox write failed: {exc}".rstrip(), file=sys.stderr)
        return 1
    finally:
        if catalog is not None:
            catalog.close()
    if trace is not None and trace.sampled and producer_tracer is not None:
        print(f"webhookctl: trace {settings.tracing.ui_url}/trace/{trace.trace_id_hex}", file=sys.stderr)
    out: dict[str, str] = {"event_id": event_id}
    if trace is not None:
        out["traceparent"] = trace.traceparent
    print(json.dumps(out) if args.json else event_id)
    return 0


def _row_trace(conn: psycopg.Connection, event_id: str) -> trace_context.TraceContext | None:
    """The trace context the event's row carries (what the receivers' requests will continue)."""
    row = conn.execute("SELECT traceparent FROM webhook_outbox WHERE event_id = %s", (event_id,)).fetchone()
    return trace_context.parse_or_none(row[0]) if row else None


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
