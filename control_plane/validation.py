"""Checks on what a tenant sends, each raising InvalidArgument with a message naming the field.

The destination check reuses the dispatcher's egress policy (core.egress) so the control plane
never accepts a URL the dispatcher would refuse, and resolves the host once so a name that points
at a private address is refused at creation rather than failing every delivery later.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Protocol

from control_plane.domain import EndpointSpec
from control_plane.errors import InvalidArgument
from core import custom_headers, identifiers, minimise, ordering, signing
from core.egress import EgressPolicy, EgressRefused, check_resolved, parse_target

MAX_URL_CHARS = 2048
MAX_DESCRIPTION_CHARS = 512
MAX_EVENT_TYPES = 100
MAX_METADATA_ENTRIES = 50
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_RATE_LIMIT_PER_S = 10_000.0
MAX_IN_FLIGHT = 1_000

_EVENT_TYPE = identifiers.EVENT_TYPE
_ID = identifiers.ID


class Resolver(Protocol):
    def __call__(self, host: str, port: int) -> list[str]:
        """Every address the host resolves to (A and AAAA); OSError if it does not resolve."""
        ...


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class DestinationValidator:
    """URL -> canonical URL, refusing anything the dispatcher's egress policy refuses."""

    def __init__(self, policy: EgressPolicy, resolver: Resolver = system_resolver) -> None:
        self._policy = policy
        self._resolve = resolver

    def __call__(self, url: str) -> str:
        if not url:
            raise InvalidArgument("url is required (an https:// URL)")
        if len(url) > MAX_URL_CHARS:
            raise InvalidArgument(f"url is longer than {MAX_URL_CHARS} characters")
        try:
            target = parse_target(url, self._policy)
            if not target.is_ip_literal:
                try:
                    addresses = self._resolve(target.host, target.port)
                except OSError:
                    raise InvalidArgument(
                        f"url host {target.host!r} does not resolve; check the name and its DNS"
                    ) from None
                check_resolved(addresses, self._policy)
        except EgressRefused as refused:
            raise InvalidArgument(f"url refused ({refused.reason_code}): {refused.message}") from None
        return target.url


def event_types(values: Sequence[str]) -> tuple[str, ...]:
    if not values:
        raise InvalidArgument("event_types must list at least one type, prefix (`invoice.*`) or `*`")
    if len(values) > MAX_EVENT_TYPES:
        raise InvalidArgument(f"event_types has more than {MAX_EVENT_TYPES} entries")
    for value in values:
        name = value[:-2] if value.endswith(".*") else value
        if value != "*" and not _EVENT_TYPE.fullmatch(name):
            raise InvalidArgument(
                f"event_types entry {value!r} is not an event type (`invoice.paid`), a prefix "
                "(`invoice.*`) or `*`"
            )
    return tuple(sorted(set(values)))


def description(value: str) -> str:
    if len(value) > MAX_DESCRIPTION_CHARS:
        raise InvalidArgument(f"description is longer than {MAX_DESCRIPTION_CHARS} characters")
    return value


def rate_limit(value: float | None) -> float | None:
    if value is not None and not 0 < value <= MAX_RATE_LIMIT_PER_S:
        raise InvalidArgument(f"rate_limit_per_s must be in (0, {MAX_RATE_LIMIT_PER_S:g}] or unset")
    return value


def max_in_flight(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= MAX_IN_FLIGHT:
        raise InvalidArgument(f"max_in_flight must be in [1, {MAX_IN_FLIGHT}] or unset")
    return value


def metadata(values: Mapping[str, str]) -> dict[str, str]:
    if len(values) > MAX_METADATA_ENTRIES:
        raise InvalidArgument(f"metadata has more than {MAX_METADATA_ENTRIES} entries")
    for key, value in values.items():
        if not key or len(key) > MAX_METADATA_KEY_CHARS:
            raise InvalidArgument(f"metadata keys must be 1-{MAX_METADATA_KEY_CHARS} characters")
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise InvalidArgument(
                f"metadata[{key!r}] is longer than {MAX_METADATA_VALUE_CHARS} characters"
            )
    return dict(values)


def headers(values: Sequence[custom_headers.HeaderInput],
            keep_allowed: frozenset[str] = frozenset()) -> tuple[custom_headers.HeaderInput, ...]:
    """Custom headers (core.custom_headers.check): reserved names, syntax, count and size."""
    try:
        return custom_headers.check(values, keep_allowed=keep_allowed)
    except custom_headers.InvalidHeaders as exc:
        raise InvalidArgument(str(exc)) from None


def spec(raw: EndpointSpec, destination: DestinationValidator) -> EndpointSpec:
    """Every field checked and normalised (canonical URL, sorted unique event types)."""
    return EndpointSpec(
        url=destination(raw.url),
        description=description(raw.description),
        event_types=event_types(raw.event_types),
        rate_limit_per_s=rate_limit(raw.rate_limit_per_s),
        max_in_flight=max_in_flight(raw.max_in_flight),
        metadata=metadata(raw.metadata),
        payload_mode=raw.payload_mode or minimise.FULL,
        payload_fields=payload_fields(raw.payload_mode or minimise.FULL, raw.payload_fields),
        ordering_key=ordering_key(raw.ordering_key),
    )


def payload_fields(mode: str, fields: Sequence[str]) -> tuple[str, ...]:
    """The payload mode and allow-list, checked together (core.minimise)."""
    try:
        minimise.check(mode, fields)
    except minimise.InvalidAllowList as exc:
        raise InvalidArgument(f"payload allow-list: {exc}") from None
    return tuple(fields)


def ordering_key(value: str) -> str:
    """An endpoint's ordering setting: "", "object_id" or a JSON Pointer (core.ordering)."""
    try:
        return ordering.check(value)
    except ordering.InvalidOrderingKey as exc:
        raise InvalidArgument(str(exc)) from None


# Cassandra's limit for a clustering key: a longer key cannot be in blocked_ordering_keys.
MAX_KEY_BYTES = 65_535


def key_value(value: str) -> str:
    """One ordering key's value (an object id or a payload member, as ListBlockedKeys shows it):
    any text, so only its presence and size are checked."""
    if not value:
        raise InvalidArgument("ordering_key is required: the key as ListBlockedKeys shows it")
    if len(value.encode()) > MAX_KEY_BYTES:
        raise InvalidArgument(f"ordering_key is longer than {MAX_KEY_BYTES} bytes; no key that long is blocked")
    return value


MAX_REASON_CHARS = 500


def signature_scheme(value: str) -> str:
    """The signing scheme asked for; empty means HMAC-SHA256 (Standard Webhooks v1)."""
    if not value:
        return signing.HMAC_SHA256
    if value not in signing.SCHEMES:
        raise InvalidArgument(f"unknown signature_scheme {value!r}; use one of: {', '.join(signing.SCHEMES)}")
    return value


def reason(value: str) -> str:
    """A replay's free-text reason for the audit: optional, one line, bounded."""
    value = value.strip()
    if len(value) > MAX_REASON_CHARS:
        raise InvalidArgument(f"reason must be at most {MAX_REASON_CHARS} characters, got {len(value)}")
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value):
        raise InvalidArgument("reason must be one line of printable text (no control characters)")
    return value


def identifier(field: str, value: str) -> str:
    """Ids and request ids: 1-128 of [A-Za-z0-9_-], so they are safe in keys and logs."""
    if not _ID.fullmatch(value):
        raise InvalidArgument(f"{field} must be 1-128 characters of letters, digits, '_' or '-'")
    return value
