"""Custom headers per endpoint: static name/value pairs sent with every request to the endpoint.

A tenant sets them (an API key its gateway wants, a routing tag); a value may be marked secret.
Three forms, one per place a header lives:

* :class:`HeaderInput` -- what a tenant sends (create, update): the value in clear, also a secret
  one. Only the control plane's request path holds it; its repr hides a secret value.
* :class:`SealedHeader` -- what is stored (Cassandra), published (``webhooks.endpoints``) and kept
  in Flink state: a plain value as is, a secret value only as ciphertext (``sealed``, sealed like a
  signing secret, :func:`core.secrets.seal_header_value`). The job opens it at send time.
* :class:`HeaderView` -- what an answer shows (API, CLI, console): a secret value never again.

The rules (:func:`check`), each refused with a message naming the header:

* a name is an HTTP token (RFC 9110 ``tchar``), at most :data:`MAX_NAME_CHARS`; names are
  case-insensitive, so two that differ only in case are one name given twice;
* reserved names (:func:`reserved_reason`): the ``webhook-*`` family the signature and the
  receiver's checks use, the headers HTTP framing depends on (``host``, ``content-*``,
  ``transfer-encoding``, ``expect``, ...), the hop-by-hop headers (RFC 9110 7.6.1, and
  ``keep-alive``/``proxy-connection``), and those the sender sets itself (``user-agent``,
  ``accept-encoding``);
* a value is visible ASCII with inner spaces or tabs (no CR, LF or NUL: nothing can inject a
  header line), neither empty nor padded, at most :data:`MAX_VALUE_CHARS`; at most
  :data:`MAX_HEADERS` headers and :data:`MAX_TOTAL_BYTES` of names and values together.

Pure: no I/O; the nonce source and the keyring are arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.secrets import (
    NONCE_BYTES,
    Keyring,
    SecretDecryptError,
    constant_time_equals,
    open_header_value,
    seal_header_value,
    sealed_with,
)

MAX_HEADERS = 20
MAX_NAME_CHARS = 64
MAX_VALUE_CHARS = 4096
# Names and values of all of an endpoint's headers: well under the 8 KiB of request headers
# many servers and gateways accept, leaving room for the platform's own.
MAX_TOTAL_BYTES = 6144

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Visible ASCII, space and tab inside; first and last characters visible.
_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?")

_SIGNATURE = "the platform's own header (signature, ids, timestamps) that receivers verify"
_FRAMING = "HTTP framing and the signed body depend on it"
_HOP = "a hop-by-hop header, meaningful to one connection only"
_SENDER = "set by the sender on every request"
_TRACE = "the delivery's W3C trace context, set by the platform"
RESERVED_NAMES: Mapping[str, str] = {
    "host": _FRAMING,
    "content-length": _FRAMING,
    "content-type": _FRAMING,
    "transfer-encoding": _FRAMING,
    "expect": _FRAMING,
    "trailer": _FRAMING,
    "connection": _HOP,
    "keep-alive": _HOP,
    "proxy-connection": _HOP,
    "proxy-authenticate": _HOP,
    "proxy-authorization": _HOP,
    "te": _HOP,
    "upgrade": _HOP,
    "user-agent": _SENDER,
    "accept-encoding": _SENDER,
    "traceparent": _TRACE,
    "tracestate": _TRACE,
}
# Any name with these prefixes: webhook-* is the Standard Webhooks family (present and future
# ones); content-* describe the body the signature covers (encoding, range, digest, ...).
RESERVED_PREFIXES: Mapping[str, str] = {"webhook-": _SIGNATURE, "content-": _FRAMING}


class InvalidHeaders(ValueError):
    """A header set that breaks a rule; the message names the header and the rule."""


@dataclass(frozen=True)
class HeaderInput:
    """A header as a tenant gives it. For a secret header in an update, an empty value keeps the
    value it has (a secret is never shown again, so it cannot be sent back)."""

    name: str
    value: str
    secret: bool = False

    def __repr__(self) -> str:
        shown = "[REDACTED]" if self.secret else repr(self.value)
        return f"HeaderInput(name={self.name!r}, value={shown}, secret={self.secret})"

    __str__ = __repr__


@dataclass(frozen=True)
class SealedHeader:
    """A header at rest and in transit: ``value`` for a plain one, ``sealed`` (ciphertext) for a
    secret one -- exactly one of them is set."""

    name: str
    value: str = ""
    sealed: str = ""

    @property
    def secret(self) -> bool:
        return bool(self.sealed)

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "sealed": self.sealed} if self.sealed else {"name": self.name, "value": self.value}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> SealedHeader:
        sealed = str(d.get("sealed") or "")
        return SealedHeader(str(d["name"]), "" if sealed else str(d.get("value") or ""), sealed)


@dataclass(frozen=True)
class HeaderView:
    """A header as answers show it: the value of a plain one, nothing of a secret one."""

    name: str
    value: str
    secret: bool


def reserved_reason(name: str) -> str | None:
    """Why ``name`` may not be set by a tenant, or None if it may."""
    lowered = name.lower()
    if lowered in RESERVED_NAMES:
        return RESERVED_NAMES[lowered]
    return next((why for prefix, why in RESERVED_PREFIXES.items() if lowered.startswith(prefix)), None)


def check(headers: Sequence[HeaderInput], *, keep_allowed: frozenset[str] = frozenset()) -> tuple[HeaderInput, ...]:
    """The headers if every rule holds (order kept), else :class:`InvalidHeaders`.

    ``keep_allowed``: lower-cased names of the endpoint's current secret headers, whose value may
    be left empty to keep it (an update); elsewhere an empty value is refused."""
    if len(headers) > MAX_HEADERS:
        raise InvalidHeaders(f"headers: at most {MAX_HEADERS} custom headers, got {len(headers)}")
    seen: set[str] = set()
    total = 0
    for h in headers:
        if not h.name:
            raise InvalidHeaders("headers: a header name is empty")
        if len(h.name) > MAX_NAME_CHARS:
            raise InvalidHeaders(f"headers: name {h.name[:MAX_NAME_CHARS]!r}... is longer than "
                                 f"{MAX_NAME_CHARS} characters")
        if not _TOKEN.fullmatch(h.name):
            raise InvalidHeaders(f"headers: {h.name!r} is not a valid header name (letters, digits and "
                                 "!#$%&'*+-.^_`|~ only; no spaces or colons)")
        why = reserved_reason(h.name)
        if why is not None:
            raise InvalidHeaders(f"headers: {h.name!r} is reserved ({why}) and cannot be set")
        lowered = h.name.lower()
        if lowered in seen:
            raise InvalidHeaders(f"headers: {h.name!r} is given twice (header names are case-insensitive)")
        seen.add(lowered)
        label = "the secret value" if h.secret else repr(h.value[:40])
        if not h.value:
            if not (h.secret and lowered in keep_allowed):
                raise InvalidHeaders(f"headers: {h.name!r} has an empty value"
                                     + ("" if not h.secret else " (an empty secret value keeps the current one, "
                                                                "and this endpoint has no secret header of that name)"))
        elif len(h.value) > MAX_VALUE_CHARS:
            raise InvalidHeaders(f"headers: the value of {h.name!r} is longer than {MAX_VALUE_CHARS} characters")
        elif not _VALUE.fullmatch(h.value):
            # Never echo a secret value, not even in an error.
            raise InvalidHeaders(f"headers: {label} of {h.name!r} must be visible ASCII, spaces or tabs inside, "
                                 "without leading or trailing spaces and without line breaks")
        total += len(h.name) + len(h.value)
    if total > MAX_TOTAL_BYTES:
        raise InvalidHeaders(f"headers: names and values take {total} bytes together; at most {MAX_TOTAL_BYTES}")
    return tuple(headers)


def seal(
    headers: Sequence[HeaderInput],
    current: Sequence[SealedHeader],
    keyring: Keyring,
    *,
    tenant_id: str,
    endpoint_id: str,
    random_bytes: Callable[[int], bytes],
) -> tuple[SealedHeader, ...]:
    """The stored form of checked ``headers``: secret values sealed, an empty secret value taking
    the sealed value of the current header of that name. An unchanged secret keeps its
    ciphertext, so re-sending the same headers is no change."""
    kept = {h.name.lower(): h for h in current if h.secret}
    checked = check(headers, keep_allowed=frozenset(kept))
    out = []
    for h in checked:
        if not h.secret:
            out.append(SealedHeader(h.name, value=h.value))
        elif not h.value:
            out.append(SealedHeader(h.name, sealed=kept[h.name.lower()].sealed))
        else:
            previous = kept.get(h.name.lower())
            if previous is not None and _opens_to(keyring, previous.sealed, h.value, tenant_id, endpoint_id, h.name):
                out.append(SealedHeader(h.name, sealed=previous.sealed))
                continue
            out.append(SealedHeader(h.name, sealed=seal_header_value(
                keyring, h.value, tenant_id=tenant_id, endpoint_id=endpoint_id, name=h.name,
                nonce=random_bytes(NONCE_BYTES))))
    return tuple(out)


def _opens_to(keyring: Keyring, sealed: str, value: str, tenant_id: str, endpoint_id: str, name: str) -> bool:
    try:
        return constant_time_equals(open_header_value(keyring, sealed, tenant_id=tenant_id,
                                                      endpoint_id=endpoint_id, name=name), value)
    except SecretDecryptError:
        return False


def open_all(headers: Sequence[SealedHeader], keyring: Keyring, *, tenant_id: str, endpoint_id: str) -> dict[str, str]:
    """Name -> value to send, secret values opened (:class:`core.secrets.SecretDecryptError` if
    one does not open: the caller holds the endpoint rather than send without it)."""
    return {h.name: (open_header_value(keyring, h.sealed, tenant_id=tenant_id, endpoint_id=endpoint_id, name=h.name)
                     if h.secret else h.value) for h in headers}


def reseal(headers: Sequence[SealedHeader], keyring: Keyring, *, tenant_id: str, endpoint_id: str,
           random_bytes: Callable[[int], bytes]) -> tuple[SealedHeader, ...]:
    """Secret values sealed under another master key sealed again under the current one."""
    out = []
    for h in headers:
        if h.secret and sealed_with(h.sealed) != keyring.current_id:
            value = open_header_value(keyring, h.sealed, tenant_id=tenant_id, endpoint_id=endpoint_id, name=h.name)
            h = SealedHeader(h.name, sealed=seal_header_value(keyring, value, tenant_id=tenant_id,
                                                              endpoint_id=endpoint_id, name=h.name,
                                                              nonce=random_bytes(NONCE_BYTES)))
        out.append(h)
    return tuple(out)


def stale(headers: Sequence[SealedHeader], keyring: Keyring) -> int:
    """How many secret values are sealed under a master key other than the current one."""
    return sum(1 for h in headers if h.secret and sealed_with(h.sealed) != keyring.current_id)


def views(headers: Sequence[SealedHeader]) -> tuple[HeaderView, ...]:
    return tuple(HeaderView(h.name, "" if h.secret else h.value, h.secret) for h in headers)


def with_platform_headers(custom: Mapping[str, str], platform: Mapping[str, str]) -> dict[str, str]:
    """The request's headers: the custom ones first, then the platform's, which win over a custom
    header of the same name in any case (the control plane refuses such names; this keeps the
    signature headers intact even for a record that was not checked)."""
    taken = {name.lower() for name in platform}
    merged = {name: value for name, value in custom.items()
              if name.lower() not in taken and reserved_reason(name) is None}
    merged.update(platform)
    return merged


def parse_flag_list(items: Sequence[str], *, secret: bool) -> tuple[HeaderInput, ...]:
    """``Name: value`` texts (the CLI's ``--header``/``--secret-header``, the console's lines)."""
    out = []
    for item in items:
        name, sep, value = item.partition(":")
        if not sep:
            # A secret header's text may be the secret itself: it is not echoed.
            shown = "a secret header" if secret else repr(name.strip()[:MAX_NAME_CHARS])
            raise InvalidHeaders(f"headers: {shown} has no ':'; write NAME: VALUE")
        out.append(HeaderInput(name.strip(), value.strip(), secret))
    return tuple(out)
