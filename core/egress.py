"""The one egress policy for customer-supplied URLs: which targets the platform may connect to.

A webhook URL is attacker-controlled input that makes our workers open connections (SSRF). The
control plane runs :func:`parse_target` when an endpoint is created or changed, so the customer
gets a clear refusal at once; the dispatcher runs the same function again before every attempt,
and :func:`check_resolved` on every DNS answer at connect time, because a name that resolved to a
public address yesterday can resolve to 169.254.169.254 today (DNS rebinding). Both call sites
import this module; there is no second implementation to drift.

Rules (each refusal is an :class:`EgressRefused` with a stable ``reason_code`` and a message a
customer can act on):

* only ``https``, only approved ports, no userinfo, no control characters or backslashes;
* hostnames are mapped with IDNA/UTS-46 before any check, so ``ＬＯＣＡＬＨＯＳＴ`` and
  ``１２７．０．０．１`` are judged as what they become;
* names that never belong to a public service (``localhost``, ``*.local``, ``*.internal``,
  single-label names that the resolver would complete with a search domain, ...) are refused;
* an IPv4 literal is parsed the way the OS parses it (``inet_aton``: ``2130706433``,
  ``0177.0.0.1``, ``0x7f.1``, ``127.1`` are all 127.0.0.1), IPv6 literals with :mod:`ipaddress`;
* an address is allowed only if it is public unicast: :func:`check_ip` refuses loopback,
  private, link-local, CGNAT, multicast, broadcast, reserved, documentation, benchmarking, ULA,
  site-local, cloud metadata, and IPv6 forms that embed a refused IPv4 address.

Nothing here opens a socket or asks DNS: ``socket.inet_aton`` is a pure string parser.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

import idna

if TYPE_CHECKING:
    from core.settings import EgressSettings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORT = 443


class EgressRefused(Exception):
    """A target the policy refuses. ``reason_code`` is stable (metrics, API errors); ``message``
    is for people and names the rule, never a secret."""

    def __init__(self, reason_code: str, message: str) -> None:
        super().__init__(f"{reason_code}: {message}")
        self.reason_code = reason_code
        self.message = message


@dataclass(frozen=True)
class EgressPolicy:
    """Ports beyond 443 that endpoints may use, and development-only address exceptions.

    ``dev_allow_cidrs`` lets the listed networks through the public-unicast rule so tests and a
    local stack can reach receivers on loopback. It is for development only: in production it must
    be empty, and the job and control plane log loudly when it is not. Cloud metadata addresses
    stay refused even inside an allowed network.
    """

    allowed_ports: frozenset[int] = frozenset({DEFAULT_PORT})
    dev_allow_cidrs: tuple[IPNetwork, ...] = ()

    @staticmethod
    def from_settings(settings: EgressSettings) -> EgressPolicy:
        # strict=True: "127.0.0.1/8" is a typo for a network and should fail at start-up.
        return EgressPolicy(
            allowed_ports=frozenset(settings.allowed_ports) | {DEFAULT_PORT},
            dev_allow_cidrs=tuple(ipaddress.ip_network(c, strict=True) for c in settings.dev_allow_cidrs),
        )


@dataclass(frozen=True)
class Target:
    """A URL that passed the policy, in the one canonical form the dispatcher connects to."""

    scheme: str
    host: str  # IDNA ASCII, lower case, no trailing dot; an IP literal in canonical form
    port: int
    path_and_query: str  # percent-encoded, starts with "/"; the fragment is never sent
    is_ip_literal: bool
    ip: IPAddress | None

    @property
    def url(self) -> str:
        """The canonical URL; sending this (not the customer's text) removes parser mismatches."""
        host = self.host
        if isinstance(self.ip, ipaddress.IPv6Address):
            host = "[" + host.replace("%", "%25") + "]"
        return f"{self.scheme}://{host}:{self.port}{self.path_and_query}"


# --- address rules -----------------------------------------------------------------------------

# Instance metadata services hand out cloud credentials. Refused even inside dev_allow_cidrs.
CLOUD_METADATA: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean
        "169.254.170.2",  # AWS ECS task metadata
        "169.254.169.253",  # AWS VPC DNS
        "169.254.169.123",  # AWS time sync
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud (legacy)
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "fd00:ec2::253",  # AWS VPC DNS over IPv6
        "fd00:ec2::123",  # AWS time sync over IPv6
    )
)


def _table(rows: Iterable[tuple[str, str, str]]) -> tuple[tuple[IPNetwork, str, str], ...]:
    return tuple((ipaddress.ip_network(net), code, label) for net, code, label in rows)


# First match wins, so narrower networks come before the wider ones that contain them.
_BLOCKED_V4 = _table(
    [
        ("255.255.255.255/32", "broadcast", "the limited broadcast address"),
        ("0.0.0.0/8", "unspecified", "'this network' (0.0.0.0/8)"),
        ("10.0.0.0/8", "private", "private (RFC 1918, 10.0.0.0/8)"),
        ("100.64.0.0/10", "cgnat", "carrier-grade NAT shared space (100.64.0.0/10)"),
        ("127.0.0.0/8", "loopback", "loopback (127.0.0.0/8)"),
        ("169.254.0.0/16", "link_local", "link-local (169.254.0.0/16)"),
        ("172.16.0.0/12", "private", "private (RFC 1918, 172.16.0.0/12)"),
        ("192.0.0.0/24", "reserved", "IETF protocol assignments (192.0.0.0/24)"),
        ("192.0.2.0/24", "documentation", "documentation (TEST-NET-1, 192.0.2.0/24)"),
        ("192.88.99.0/24", "reserved", "the deprecated 6to4 relay anycast (192.88.99.0/24)"),
        ("192.168.0.0/16", "private", "private (RFC 1918, 192.168.0.0/16)"),
        ("198.18.0.0/15", "benchmarking", "benchmarking (198.18.0.0/15)"),
        ("198.51.100.0/24", "documentation", "documentation (TEST-NET-2, 198.51.100.0/24)"),
        ("203.0.113.0/24", "documentation", "documentation (TEST-NET-3, 203.0.113.0/24)"),
        ("224.0.0.0/4", "multicast", "multicast (224.0.0.0/4)"),
        ("240.0.0.0/4", "reserved", "reserved (240.0.0.0/4)"),
    ]
)

_BLOCKED_V6 = _table(
    [
        ("::/128", "unspecified", "the unspecified address (::)"),
        ("::1/128", "loopback", "loopback (::1)"),
        ("64:ff9b:1::/48", "reserved", "local-use NAT64 (64:ff9b:1::/48)"),
        ("100::/64", "reserved", "discard-only (100::/64)"),
        ("2001::/23", "reserved", "IETF protocol assignments (2001::/23)"),
        ("2001:db8::/32", "documentation", "documentation (2001:db8::/32)"),
        ("3fff::/20", "documentation", "documentation (3fff::/20)"),
        ("5f00::/16", "reserved", "SRv6 SIDs (5f00::/16)"),
        ("fc00::/7", "private", "unique local (fc00::/7)"),
        ("fe80::/10", "link_local", "link-local (fe80::/10)"),
        ("fec0::/10", "site_local", "site-local (fec0::/10)"),
        ("ff00::/8", "multicast", "multicast (ff00::/8)"),
    ]
)
# Outside these, nothing is public unicast: IANA allocates global unicast from 2000::/3 only.
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")


def _embedded_v4(ip: ipaddress.IPv6Address) -> list[tuple[ipaddress.IPv4Address, str]]:
    """IPv4 addresses that traffic to ``ip`` actually reaches, with the embedding's name.

    A refused IPv4 address must not come back in through an IPv6 spelling of it: the kernel
    connects ``::ffff:a.b.c.d`` over IPv4, and 6to4/NAT64/Teredo gateways forward to the embedded
    address.
    """
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None:
        return [(ip.ipv4_mapped, "IPv4-mapped")]
    if ip in _NAT64_WELL_KNOWN:
        return [(low32, "NAT64")]
    if ip.sixtofour is not None:
        return [(ip.sixtofour, "6to4")]
    if ip.teredo is not None:
        server, client = ip.teredo  # the client is stored bit-inverted; ipaddress undoes that
        return [(client, "Teredo client"), (server, "Teredo server")]
    if ip in _IPV4_COMPATIBLE and int(ip) > 1:  # :: and ::1 have rows of their own
        return [(low32, "IPv4-compatible")]
    return []


def _in_any(ip: IPAddress, networks: Iterable[IPNetwork]) -> bool:
    return any(ip in net for net in networks)


def check_ip(ip: IPAddress, policy: EgressPolicy) -> None:
    """Return if ``ip`` may be connected to; raise :class:`EgressRefused` saying why not."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        # A zone id only says which interface; the address bits decide (and only link-local
        # addresses carry one, which are refused below).
        ip = ipaddress.IPv6Address(int(ip))
    if ip in CLOUD_METADATA:
        raise EgressRefused("cloud_metadata", f"{ip} is a cloud instance-metadata address")
    if _in_any(ip, policy.dev_allow_cidrs):
        return
    if isinstance(ip, ipaddress.IPv6Address):
        for inner, how in _embedded_v4(ip):
            try:
                check_ip(inner, policy)
            except EgressRefused as refused:
                raise EgressRefused(
                    refused.reason_code, f"{ip} embeds IPv4 {inner} ({how}); {refused.message}"
                ) from None
        if ip in _IPV4_COMPATIBLE and int(ip) > 1:
            raise EgressRefused("reserved", f"{ip} is a deprecated IPv4-compatible address (::/96)")
        table = _BLOCKED_V6
    else:
        table = _BLOCKED_V4
    for net, code, label in table:
        if ip in net:
            raise EgressRefused(code, f"{ip} is {label}, not a public address")
    # IPv4-mapped and NAT64 addresses sit outside 2000::/3 but were judged by their IPv4 above.
    if (
        isinstance(ip, ipaddress.IPv6Address)
        and ip not in _GLOBAL_UNICAST_V6
        and ip.ipv4_mapped is None
        and ip not in _NAT64_WELL_KNOWN
    ):
        raise EgressRefused("reserved", f"{ip} is outside IPv6 global unicast (2000::/3)")


def check_resolved(addresses: Sequence[str], policy: EgressPolicy) -> None:
    """Refuse a DNS answer unless EVERY A/AAAA address in it is allowed.

    Checking only the first would let a name answer [public, 127.0.0.1] and leave the choice to
    happy-eyeballs ordering; refusing the whole answer is simpler to reason about.
    """
    if not addresses:
        raise EgressRefused("no_addresses", "the host name resolved to no addresses")
    for text in addresses:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            raise EgressRefused("invalid_address", f"resolver returned a non-address {text!r}") from None
        check_ip(ip, policy)


# --- URL rules ---------------------------------------------------------------------------------

# Names that never identify a public HTTPS service; refusing them early gives a clearer error
# than the address check would (which still runs on whatever they resolve to).
_BLOCKED_SUFFIXES = (
    "localhost",
    "local",
    "internal",
    "localdomain",
    "home.arpa",
    "arpa",
    "lan",
    "intranet",
    "corp",
    "test",
    "invalid",
    "example",
)
# Characters the URL parsers disagree about; refusing them removes the disagreement.
_FORBIDDEN_URL_CHARS = frozenset("\\") | frozenset(chr(c) for c in range(0x21)) | {"\x7f"}
_ASCII_HOST = re.compile(r"[a-z0-9._-]+")
# Printable ASCII that may stay as-is in a path or query; everything else is percent-encoded.
_PATH_SAFE = "!#$%&'()*+,/:;=?@[]~"


def _parse_ipv4_like_os(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address the OS resolver would take ``host`` to be, without any DNS.

    glibc's getaddrinfo tries inet_aton before DNS, and inet_aton accepts 1-4 parts in decimal,
    octal (leading 0) or hex (0x): ``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``127.1``.
    """
    try:
        packed = socket.inet_aton(host)
    except OSError:
        return None
    return ipaddress.IPv4Address(packed)


def _looks_numeric(label: str) -> bool:
    # WHATWG's "ends in a number": such a host is meant as an IPv4 literal, so if inet_aton
    # refused it, it is a malformed address (e.g. 1.2.3.999), not a name to send to DNS.
    if label.startswith(("0x", "0X")):
        return all(c in "0123456789abcdefABCDEF" for c in label[2:])
    return label.isdigit()


def _normalise_name(raw: str) -> str:
    """UTS-46 map (case fold, full-width forms, ideographic dots), then IDNA-encode to ASCII."""
    try:
        mapped = idna.uts46_remap(raw, std3_rules=False, transitional=False)
    except idna.IDNAError as exc:
        raise EgressRefused("invalid_host", f"host name is not valid IDNA: {exc}") from None
    # One trailing dot is the DNS root ("example.com."); anything more is an empty label.
    host = mapped[:-1] if mapped.endswith(".") else mapped
    if host.endswith(".") or host.startswith(".") or ".." in host:
        raise EgressRefused("invalid_host", f"host name {host!r} has an empty label")
    return host


def _refuse_special_name(host: str) -> None:
    for suffix in _BLOCKED_SUFFIXES:
        if host == suffix or host.endswith("." + suffix):
            raise EgressRefused(
                "blocked_hostname", f"{host!r} is under .{suffix}, which is never a public service"
            )
    if "." not in host:
        raise EgressRefused(
            "single_label_host",
            f"{host!r} is a single-label name; the resolver would complete it with an internal "
            "search domain. Use a fully qualified public name.",
        )


def parse_target(url: str, policy: EgressPolicy) -> Target:
    """Parse and judge a customer URL; the returned :class:`Target` is what may be connected to.

    DNS answers for a host name are judged later, at connect time, by :func:`check_resolved`.
    """
    bad = sorted({c for c in url if c in _FORBIDDEN_URL_CHARS})
    if bad:
        raise EgressRefused("invalid_url", f"URL contains forbidden characters {bad!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise EgressRefused("invalid_url", f"URL does not parse: {exc}") from None
    if parts.scheme != "https":
        raise EgressRefused("scheme", f"only https URLs are allowed, not {parts.scheme or 'none'!r}")
    if "@" in parts.netloc:
        raise EgressRefused("userinfo", "credentials in the URL (user:pass@) are not allowed")
    port = DEFAULT_PORT if port is None else port
    allowed = policy.allowed_ports | {DEFAULT_PORT}
    if port not in allowed:
        raise EgressRefused("port", f"port {port} is not allowed; allowed ports: {sorted(allowed)}")

    # netloc without the port; urlsplit's .hostname would lower-case and drop brackets for us but
    # also hide whether the host was bracketed, which decides IPv6 vs name.
    raw_host = parts.netloc.rsplit(":", 1)[0] if not parts.netloc.endswith("]") else parts.netloc
    if raw_host.startswith("["):
        ip = _parse_bracketed(raw_host)
        check_ip(ip, policy)
        return _target(str(ip), port, parts.path, parts.query, ip)
    if not raw_host:
        raise EgressRefused("empty_host", "URL has no host")
    if "%" in raw_host:
        raise EgressRefused("invalid_host", "percent-encoding is not allowed in a host name")

    host = _normalise_name(raw_host)
    if not host:
        raise EgressRefused("empty_host", "URL has no host")
    if host.isascii() and not _ASCII_HOST.fullmatch(host):
        # Mapping can produce ASCII the raw check never saw (U+3000 -> " ", U+FF0F -> "/"), and
        # inet_aton would accept "8.8.8.8 anything"; only letters, digits, "-", "." and "_" pass.
        raise EgressRefused("invalid_host", f"host name {host!r} contains characters a host name cannot")
    if host.isascii():
        v4 = _parse_ipv4_like_os(host)
        if v4 is not None:
            check_ip(v4, policy)
            return _target(str(v4), port, parts.path, parts.query, v4)
        if _looks_numeric(host.rsplit(".", 1)[-1]):
            raise EgressRefused("invalid_host", f"{host!r} looks like an IPv4 address but is not a valid one")
    try:
        ascii_host = idna.encode(host, uts46=False).decode("ascii")
    except idna.IDNAError as exc:
        raise EgressRefused("invalid_host", f"host name is not valid IDNA: {exc}") from None
    _refuse_special_name(ascii_host)
    return _target(ascii_host, port, parts.path, parts.query, None)


def _parse_bracketed(raw_host: str) -> ipaddress.IPv6Address:
    inner = raw_host[1:].split("]", 1)[0].replace("%25", "%", 1)
    try:
        return ipaddress.IPv6Address(inner)
    except ValueError:
        raise EgressRefused("invalid_host", f"{raw_host!r} is not an IPv6 address") from None


def _target(host: str, port: int, path: str, query: str, ip: IPAddress | None) -> Target:
    path_and_query = quote(path or "/", safe=_PATH_SAFE)
    if query:
        path_and_query += "?" + quote(query, safe=_PATH_SAFE)
    return Target(
        scheme="https",
        host=host,
        port=port,
        path_and_query=path_and_query,
        is_ip_literal=ip is not None,
        ip=ip,
    )
