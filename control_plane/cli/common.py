"""What webhookctl's command groups share: the gRPC channel with its credential and timeout,
times in and out, plain-text tables and how a response is printed.

Public, so each group's module (:mod:`control_plane.cli.endpoints`, :mod:`control_plane.cli.event_types`
and the others beside them) imports it rather than another group's private helpers.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

T = TypeVar("T")

# How a command prints an API response: ``out(message, text)`` prints the message as JSON with
# --json, else ``text(message)``.
Out = Callable[[Any, Callable[[Any], str]], None]


def when(stamp: Timestamp) -> str:
    if not stamp.seconds and not stamp.nanos:
        return "-"
    return stamp.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    line = "  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True))
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([line.rstrip(), *(b.rstrip() for b in body)])


def status_name(enum: Any, value: int) -> str:
    return enum.Name(value).split("_STATUS_", 1)[-1].lower()  # ENDPOINT_STATUS_PENDING_VERIFICATION


def next_cursor_line(next_cursor: str) -> str:
    """The line under a page that says how to get the next one (nothing after the last page)."""
    return f"\nnext cursor: {next_cursor}" if next_cursor else ""


def ts(text: str | None) -> Timestamp | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"webhookctl: not an ISO 8601 time: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


class Auth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the bearer credential to every call."""

    def __init__(self, token: str) -> None:
        self._md = (("authorization", f"Bearer {token}"),)

    def _details(self, details: Any) -> Any:
        return details._replace(metadata=tuple(details.metadata or ()) + self._md)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


class Timeout(grpc.UnaryUnaryClientInterceptor):
    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(details._replace(timeout=details.timeout or self._seconds), request)


def open_channel(target: str, ca: str | None, insecure: bool) -> grpc.Channel:
    """TLS unless asked for plaintext or talking to this machine's loopback (the dev stack)."""
    if plaintext(target, ca, insecure):
        return grpc.insecure_channel(target)
    roots = None
    if ca is not None:
        with open(ca, "rb") as f:
            roots = f.read()
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots))


def plaintext(target: str, ca: str | None, insecure: bool) -> bool:
    """Whether webhookctl talks to ``target`` without TLS: asked to, or this machine's loopback
    with no CA named (the dev stack)."""
    return insecure or (ca is None and _is_loopback(target))


def _is_loopback(target: str) -> bool:
    host = target.rsplit(":", 1)[0].strip("[]") if ":" in target else target
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def call(args: argparse.Namespace, token: str, fn: Callable[[grpc.Channel], T]) -> T | None:
    """``fn`` over a channel to ``args.target`` carrying ``token`` and ``args.timeout``, closed after.
    An RPC error is printed as webhookctl prints them and answers None (the caller exits 1)."""
    channel = grpc.intercept_channel(open_channel(args.target, args.ca, args.insecure), Auth(token),
                                     Timeout(args.timeout))
    try:
        return fn(channel)
    except grpc.RpcError as err:
        print(f"webhookctl: {err.code().name}: {err.details()}", file=sys.stderr)  # type: ignore[attr-defined]
        return None
    finally:
        channel.close()
