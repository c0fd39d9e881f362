"""The egress policy: tables of refused and allowed URLs, and properties over address notations."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from core.egress import (
    CLOUD_METADATA,
    EgressPolicy,
    EgressRefused,
    IPAddress,
    check_ip,
    check_resolved,
    parse_target,
)
from core.settings import EgressSettings

POLICY = EgressPolicy(allowed_ports=frozenset({443, 8443}))
ADDRESS_CODES = {
    "broadcast",
    "unspecified",
    "private",
    "cgnat",
    "loopback",
    "link_local",
    "reserved",
    "documentation",
    "benchmarking",
    "multicast",
    "site_local",
    "cloud_metadata",
}


def refusal(url: str, policy: EgressPolicy = POLICY) -> EgressRefused:
    with pytest.raises(EgressRefused) as info:
        parse_target(url, policy)
    return info.value


# --- tables ------------------------------------------------------------------------------------

REFUSED_URLS = [
    # scheme, port, credentials, malformed URLs
    ("http://example.com/", "scheme"),
    ("ftp://example.com/", "scheme"),
    ("file:///etc/passwd", "scheme"),
    ("gopher://example.com:70/", "scheme"),
    ("//example.com/", "scheme"),
    ("example.com", "scheme"),
    ("https://example.com:80/", "port"),
    ("https://example.com:22/", "port"),
    ("https://example.com:0/", "port"),
    ("https://example.com:99999/", "invalid_url"),
    ("https://example.com:44x/", "invalid_url"),
    ("https://user:pass@example.com/", "userinfo"),
    ("https://user@example.com/", "userinfo"),
    ("https://@example.com/", "userinfo"),
    ("https://example.com@127.0.0.1/", "userinfo"),
    ("https://example.com\\@127.0.0.1/", "invalid_url"),
    ("https://exa mple.com/", "invalid_url"),
    ("https://example.com/\r\nHost: evil", "invalid_url"),
    ("https://example.com\t/", "invalid_url"),
    ("https:///path", "empty_host"),
    ("https:example.com", "empty_host"),
    ("https://:443/", "empty_host"),
    ("https://./", "empty_host"),
    ("https://ex%61mple.com/", "invalid_host"),
    ("https://a..b.com/", "invalid_host"),
    ("https://example.com../", "invalid_host"),
    ("https://xn--zz.com/", "invalid_host"),
    ("https://[v1.fe]/", "invalid_host"),
    ("https://[127.0.0.1]/", "invalid_url"),
    ("https://1.2.3.999/", "invalid_host"),
    ("https://0x1g.0x7f/", "invalid_host"),
    ("https://256.256.256.256/", "invalid_host"),
    ("https://8.8.8.8\u3000evil.com/", "invalid_host"),  # maps to a space; inet_aton would stop there
    ("https://127.0.0.1\uff0fx/", "invalid_url"),  # full-width solidus: urlsplit's NFKC check
    ("https://exa\u00a0mple.com/", "invalid_host"),  # no-break space
    # names that are never public services
    ("https://localhost/", "blocked_hostname"),
    ("https://LOCALHOST./", "blocked_hostname"),
    ("https://api.localhost/", "blocked_hostname"),
    ("https://printer.local/", "blocked_hostname"),
    ("https://metadata.google.internal/computeMetadata/v1/", "blocked_hostname"),
    ("https://db.internal/", "blocked_hostname"),
    ("https://router.home.arpa/", "blocked_hostname"),
    ("https://1.0.0.127.in-addr.arpa/", "blocked_hostname"),
    ("https://ｌｏｃａｌｈｏｓｔ/", "blocked_hostname"),  # full-width, folded by UTS-46
    ("https://kubernetes/", "single_label_host"),
    ("https://metadata/", "single_label_host"),
    # IPv4 literals in every notation inet_aton accepts
    ("https://127.0.0.1/", "loopback"),
    ("https://127.1/", "loopback"),
    ("https://127.0.1/", "loopback"),
    ("https://2130706433/", "loopback"),
    ("https://0x7f000001/", "loopback"),
    ("https://0X7F.1/", "loopback"),
    ("https://0x7f.0x0.0x0.0x1/", "loopback"),
    ("https://0177.0.0.1/", "loopback"),
    ("https://017700000001/", "loopback"),
    ("https://127.000.000.001/", "loopback"),
    ("https://127.0.0.1.:443/", "loopback"),
    ("https://１２７．０．０．１/", "loopback"),  # full-width digits and dots
    ("https://127。0。0。1/", "loopback"),  # ideographic full stops
    ("https://0/", "unspecified"),
    ("https://0.0.0.0/", "unspecified"),
    ("https://10.0.0.1/", "private"),
    ("https://012.1/", "private"),  # octal 012 = 10
    ("https://172.16.0.1/", "private"),
    ("https://172.31.255.255/", "private"),
    ("https://192.168.1.1/", "private"),
    ("https://3232235777/", "private"),  # 192.168.1.1
    ("https://100.64.0.1/", "cgnat"),
    ("https://100.127.255.255/", "cgnat"),
    ("https://169.254.1.1/", "link_local"),
    ("https://224.0.0.1/", "multicast"),
    ("https://239.255.255.250/", "multicast"),
    ("https://255.255.255.255/", "broadcast"),
    ("https://0xffffffff/", "broadcast"),
    ("https://240.0.0.1/", "reserved"),
    ("https://192.0.0.8/", "reserved"),
    ("https://192.88.99.1/", "reserved"),
    ("https://192.0.2.10/", "documentation"),
    ("https://198.51.100.10/", "documentation"),
    ("https://203.0.113.10/", "documentation"),
    ("https://198.18.0.1/", "benchmarking"),
    ("https://198.19.255.255/", "benchmarking"),
    # cloud metadata
    ("https://169.254.169.254/latest/meta-data/", "cloud_metadata"),
    ("https://0xa9fea9fe/", "cloud_metadata"),
    ("https://2852039166/", "cloud_metadata"),
    ("https://169.254.170.2/v2/credentials", "cloud_metadata"),
    ("https://100.100.100.200/", "cloud_metadata"),
    ("https://[fd00:ec2::254]/", "cloud_metadata"),
    ("https://[::ffff:169.254.169.254]/", "cloud_metadata"),
    # IPv6 literals
    ("https://[::1]/", "loopback"),
    ("https://[0:0:0:0:0:0:0:1]/", "loopback"),
    ("https://[::]/", "unspecified"),
    ("https://[fe80::1]/", "link_local"),
    ("https://[fe80::1%25eth0]/", "link_local"),
    ("https://[fec0::1]/", "site_local"),
    ("https://[fc00::1]/", "private"),
    ("https://[fd12:3456::1]/", "private"),
    ("https://[ff02::1]/", "multicast"),
    ("https://[2001:db8::1]/", "documentation"),
    ("https://[3fff::1]/", "documentation"),
    ("https://[100::1]/", "reserved"),
    ("https://[2001:10::1]/", "reserved"),
    ("https://[5f00::1]/", "reserved"),
    ("https://[4000::1]/", "reserved"),
    ("https://[64:ff9b:1::a00:1]/", "reserved"),
    # IPv6 forms that embed a refused IPv4 address
    ("https://[::ffff:127.0.0.1]/", "loopback"),
    ("https://[::ffff:7f00:1]/", "loopback"),
    ("https://[::ffff:10.1.2.3]/", "private"),
    ("https://[::127.0.0.1]/", "loopback"),
    ("https://[::8.8.8.8]/", "reserved"),  # IPv4-compatible is deprecated even when public
    ("https://[2002:7f00:1::]/", "loopback"),
    ("https://[2002:a9fe:a9fe::1]/", "cloud_metadata"),
    ("https://[2002:c0a8:101::]/", "private"),
    ("https://[64:ff9b::127.0.0.1]/", "loopback"),
    ("https://[64:ff9b::a9fe:a9fe]/", "cloud_metadata"),
    ("https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "loopback"),  # Teredo client 127.0.0.1
    ("https://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/", "private"),  # Teredo client 10.0.0.1
]


@pytest.mark.parametrize(("url", "code"), REFUSED_URLS)
def test_refused_urls(url: str, code: str) -> None:
    refused = refusal(url)
    assert refused.reason_code == code, str(refused)
    assert refused.message and refused.message in str(refused)


ALLOWED_URLS = [
    ("https://example.com", "https://example.com:443/"),
    ("https://Example.COM./hook?x=1#frag", "https://example.com:443/hook?x=1"),
    ("HTTPS://api.example.com:443/a/b", "https://api.example.com:443/a/b"),
    ("https://api.example.com:8443/a", "https://api.example.com:8443/a"),
    ("https://api.example.com:08443/a", "https://api.example.com:8443/a"),
    ("https://bücher.example.org/ä?q=ü", "https://xn--bcher-kva.example.org:443/%C3%A4?q=%C3%BC"),
    ("https://ＥＸＡＭＰＬＥ．ｃｏｍ/", "https://example.com:443/"),
    ("https://xn--bcher-kva.example.org/", "https://xn--bcher-kva.example.org:443/"),
    ("https://hooks.example.com/p%20q?a=%2F", "https://hooks.example.com:443/p%20q?a=%2F"),
    ("https://8.8.8.8/", "https://8.8.8.8:443/"),
    ("https://134744072/", "https://8.8.8.8:443/"),
    ("https://0x8.0x8.0x8.0x8/", "https://8.8.8.8:443/"),
    ("https://1.1/", "https://1.0.0.1:443/"),
    ("https://[2606:4700:4700::1111]/", "https://[2606:4700:4700::1111]:443/"),
    ("https://[::ffff:8.8.8.8]/", "https://[::ffff:808:808]:443/"),
    ("https://[2002:808:808::1]/", "https://[2002:808:808::1]:443/"),
    ("https://[64:ff9b::8.8.8.8]/", "https://[64:ff9b::808:808]:443/"),
    ("https://localhost.example.com/", "https://localhost.example.com:443/"),
    ("https://internal.example.com/", "https://internal.example.com:443/"),
]


@pytest.mark.parametrize(("url", "canonical"), ALLOWED_URLS)
def test_allowed_urls(url: str, canonical: str) -> None:
    assert parse_target(url, POLICY).url == canonical


def test_target_fields() -> None:
    target = parse_target("https://0x8.8.2056/x?y=1", POLICY)
    assert (target.scheme, target.host, target.port, target.path_and_query) == (
        "https",
        "8.8.8.8",
        443,
        "/x?y=1",
    )
    assert target.is_ip_literal and target.ip == ipaddress.IPv4Address("8.8.8.8")
    named = parse_target("https://Hooks.Example.com./", POLICY)
    assert (named.host, named.is_ip_literal, named.ip) == ("hooks.example.com", False, None)


def test_only_443_without_extra_ports() -> None:
    assert refusal("https://example.com:8443/", EgressPolicy()).reason_code == "port"
    assert parse_target("https://example.com/", EgressPolicy()).port == 443


def test_refusal_messages_are_readable() -> None:
    assert str(refusal("http://example.com/")) == (
        "scheme: only https URLs are allowed, not 'http'"
    )
    assert str(refusal("https://0x7f.1/")) == (
        "loopback: 127.0.0.1 is loopback (127.0.0.0/8), not a public address"
    )
    assert "embeds IPv4 127.0.0.1 (6to4)" in str(refusal("https://[2002:7f00:1::]/"))


# --- dev_allow_cidrs ---------------------------------------------------------------------------

DEV = EgressPolicy(
    allowed_ports=frozenset({443}),
    dev_allow_cidrs=(ipaddress.ip_network("127.0.0.2/32"), ipaddress.ip_network("169.254.0.0/16")),
)


def test_dev_allow_lets_listed_addresses_through_and_nothing_else() -> None:
    assert parse_target("https://127.0.0.2/", DEV).host == "127.0.0.2"
    assert parse_target("https://[::ffff:127.0.0.2]/", DEV).ip is not None
    assert refusal("https://127.0.0.1/", DEV).reason_code == "loopback"
    assert refusal("https://127.0.0.3/", DEV).reason_code == "loopback"


def test_dev_allow_never_unlocks_cloud_metadata() -> None:
    assert parse_target("https://169.254.1.1/", DEV).host == "169.254.1.1"
    assert refusal("https://169.254.169.254/", DEV).reason_code == "cloud_metadata"


def test_dev_allow_does_not_unlock_names() -> None:
    # Loopback receivers are reached through fake resolvers or literals, never "localhost".
    assert refusal("https://localhost/", DEV).reason_code == "blocked_hostname"


def test_from_settings() -> None:
    policy = EgressPolicy.from_settings(
        EgressSettings(allowed_ports=[8443], dev_allow_cidrs=["127.0.0.0/8", "::1/128"])
    )
    assert policy.allowed_ports == frozenset({443, 8443})
    assert policy.dev_allow_cidrs == (
        ipaddress.ip_network("127.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    )
    assert EgressPolicy.from_settings(EgressSettings()) == EgressPolicy()
    with pytest.raises(ValueError):
        EgressPolicy.from_settings(EgressSettings(dev_allow_cidrs=["127.0.0.1/8"]))


# --- check_resolved ----------------------------------------------------------------------------


def test_check_resolved_refuses_if_any_answer_is_refused() -> None:
    check_resolved(["8.8.8.8", "2606:4700:4700::1111"], POLICY)
    with pytest.raises(EgressRefused) as info:
        check_resolved(["8.8.8.8", "127.0.0.1"], POLICY)
    assert info.value.reason_code == "loopback"
    with pytest.raises(EgressRefused) as info:
        check_resolved(["2606:4700:4700::1111", "fe80::1%eth0"], POLICY)
    assert info.value.reason_code == "link_local"


def test_check_resolved_refuses_empty_and_garbage() -> None:
    with pytest.raises(EgressRefused, match="no_addresses"):
        check_resolved([], POLICY)
    with pytest.raises(EgressRefused, match="invalid_address"):
        check_resolved(["example.com"], POLICY)


# --- properties --------------------------------------------------------------------------------

BLOCKED_V4_NETWORKS = [
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
]


@st.composite
def blocked_v4(draw: st.DrawFn) -> ipaddress.IPv4Address:
    net = draw(st.sampled_from(BLOCKED_V4_NETWORKS))
    offset = draw(st.integers(0, net.num_addresses - 1))
    return net[offset]


def _is_public_v4(ip: ipaddress.IPv4Address) -> bool:
    # An oracle independent of core.egress: the stdlib's view plus what it still calls global.
    return (
        ip.is_global
        and not ip.is_multicast
        and ip not in ipaddress.IPv4Network("192.0.0.0/24")
        and ip not in ipaddress.IPv4Network("192.88.99.0/24")
        and ip not in CLOUD_METADATA
    )


public_v4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address).filter(_is_public_v4)


def _render(ip: ipaddress.IPv4Address, style: str) -> str:
    """Spell an address the ways inet_aton (and so the OS resolver) accepts."""
    n = int(ip)
    o = ip.packed
    if style == "dotted":
        return str(ip)
    if style == "decimal":
        return str(n)
    if style == "hex":
        return hex(n)
    if style == "octal":
        return "0" + format(n, "o")
    if style == "octal-octets":
        return ".".join("0" + format(b, "o") for b in o)
    if style == "hex-octets":
        return ".".join(hex(b) for b in o)
    if style == "short-a.b":
        return f"{o[0]}.{n & 0xFFFFFF}"
    if style == "short-a.b.c":
        return f"{o[0]}.{o[1]}.{n & 0xFFFF}"
    if style == "mixed":
        return f"{hex(o[0]).upper().replace('X', 'x')}.0{format(o[1], 'o')}.{n & 0xFFFF}"
    if style == "full-width":
        return "".join(chr(0xFF10 + int(c)) if c.isdigit() else "．" for c in str(ip))
    raise AssertionError(style)


STYLES = st.sampled_from(
    [
        "dotted",
        "decimal",
        "hex",
        "octal",
        "octal-octets",
        "hex-octets",
        "short-a.b",
        "short-a.b.c",
        "mixed",
        "full-width",
    ]
)


@given(blocked_v4(), STYLES)
def test_every_notation_of_a_blocked_ipv4_is_refused(ip: ipaddress.IPv4Address, style: str) -> None:
    refused = refusal(f"https://{_render(ip, style)}/")
    assert refused.reason_code in ADDRESS_CODES
    assert str(ip) in refused.message


@given(public_v4, STYLES)
def test_every_notation_of_a_public_ipv4_is_allowed(ip: ipaddress.IPv4Address, style: str) -> None:
    target = parse_target(f"https://{_render(ip, style)}/", POLICY)
    assert target.ip == ip and target.host == str(ip)


def _mapped(v4: ipaddress.IPv4Address, _: int) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address((0xFFFF << 32) | int(v4))


def _compatible(v4: ipaddress.IPv4Address, _: int) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(int(v4))


def _six_to_four(v4: ipaddress.IPv4Address, noise: int) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address((0x2002 << 112) | (int(v4) << 80) | (noise & (2**80 - 1)))


def _nat64(v4: ipaddress.IPv4Address, _: int) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address((0x64FF9B << 96) | int(v4))


def _teredo(v4: ipaddress.IPv4Address, noise: int) -> ipaddress.IPv6Address:
    server = 0x41_36_E3_78  # 65.54.227.120, a public Teredo server
    flags_port = noise & 0xFFFF_FFFF
    return ipaddress.IPv6Address(
        (0x2001_0000 << 96) | (server << 64) | (flags_port << 32) | (int(v4) ^ 0xFFFF_FFFF)
    )


Embedding = Callable[[ipaddress.IPv4Address, int], ipaddress.IPv6Address]
EMBEDDINGS: st.SearchStrategy[Embedding] = st.sampled_from(
    [_mapped, _compatible, _six_to_four, _nat64, _teredo]
)


@example(ipaddress.IPv4Address("0.0.0.0"), _compatible, 0)
@example(ipaddress.IPv4Address("0.0.0.1"), _compatible, 0)
@given(blocked_v4(), EMBEDDINGS, st.integers(0, 2**80 - 1))
def test_every_ipv6_embedding_of_a_blocked_ipv4_is_refused(
    ip: ipaddress.IPv4Address, embed: Embedding, noise: int
) -> None:
    v6 = embed(ip, noise)
    refused = refusal(f"https://[{v6}]/")
    assert refused.reason_code in ADDRESS_CODES
    if v6 in (ipaddress.IPv6Address("::"), ipaddress.IPv6Address("::1")):
        # IPv4-compatible 0.0.0.0 / 0.0.0.1 *are* :: and ::1, refused as such before any
        # embedding is looked at (found by hypothesis).
        assert refused.reason_code in ("unspecified", "loopback"), refused
    else:
        assert f"embeds IPv4 {ip}" in refused.message
    with pytest.raises(EgressRefused):
        check_resolved([str(v6)], POLICY)


@given(public_v4, st.sampled_from([_mapped, _six_to_four, _nat64]), st.integers(0, 2**80 - 1))
def test_embeddings_of_a_public_ipv4_are_allowed(
    ip: ipaddress.IPv4Address, embed: Embedding, noise: int
) -> None:
    check_ip(embed(ip, noise), POLICY)


def _is_public_v6(ip: ipaddress.IPv6Address) -> bool:
    return (
        ip.is_global
        and ip in ipaddress.IPv6Network("2000::/3")
        and ip not in ipaddress.IPv6Network("2001::/16")  # IETF assignments, Teredo, db8
        and ip not in ipaddress.IPv6Network("2002::/16")  # 6to4: judged by its IPv4
        and ip not in ipaddress.IPv6Network("3fff::/20")  # documentation (RFC 9637)
    )


@given(st.integers(0x2000 << 112, (0x4000 << 112) - 1).map(ipaddress.IPv6Address))
def test_random_public_ipv6_is_allowed(ip: ipaddress.IPv6Address) -> None:
    assume(_is_public_v6(ip))
    check_ip(ip, POLICY)
    assert parse_target(f"https://[{ip}]:8443/", POLICY).ip == ip


@given(public_v4)
def test_random_public_ipv4_is_allowed_by_check_resolved(ip: ipaddress.IPv4Address) -> None:
    check_resolved([str(ip)], POLICY)


@given(st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address))
def test_outside_global_unicast_only_embeddings_can_pass(ip: ipaddress.IPv6Address) -> None:
    assume(ip not in ipaddress.IPv6Network("2000::/3"))
    try:
        check_ip(ip, POLICY)
    except EgressRefused:
        return
    assert ip.ipv4_mapped is not None or ip in ipaddress.IPv6Network("64:ff9b::/96")


@given(st.sampled_from(sorted(CLOUD_METADATA, key=str)))
def test_cloud_metadata_refused_even_when_dev_allowed(ip: IPAddress) -> None:
    everything = EgressPolicy(
        dev_allow_cidrs=(ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
    )
    with pytest.raises(EgressRefused, match="cloud_metadata"):
        check_ip(ip, everything)
