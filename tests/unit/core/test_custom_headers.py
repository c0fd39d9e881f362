"""Custom headers per endpoint: the rules, sealing, opening and merging (core.custom_headers)."""

from __future__ import annotations

import itertools

import pytest

from core import custom_headers as ch
from core.custom_headers import HeaderInput, InvalidHeaders, SealedHeader
from core.secrets import Keyring, SecretDecryptError, sealed_with

RING = Keyring.single(bytes(range(32)), "k1")
RING2 = Keyring("k2", {"k1": bytes(range(32)), "k2": bytes(range(2, 34))})
SECRET = "sk_live_0123456789abcdef"


def counter_bytes():
    """Distinct, reproducible nonces."""
    n = itertools.count(1)
    return lambda size: next(n).to_bytes(size, "big")


def H(name: str, value: str = "v", secret: bool = False) -> HeaderInput:
    return HeaderInput(name, value, secret)


@pytest.mark.parametrize("headers", [
    [],
    [H("Authorization", "Bearer abc.def")],
    [H("X-Api-Key", SECRET, secret=True), H("X-Tenant", "acme")],
    [H("x-a", "a\tb c")],
    [H("!#$%&'*+-.^_`|~09azAZ", "x")],
    [H("X-Long", "v" * ch.MAX_VALUE_CHARS)],
    [H(f"X-{i}", "v") for i in range(ch.MAX_HEADERS)],
    [H("N" * ch.MAX_NAME_CHARS, "v")],
    [H("Accept", "application/json"), H("Cookie", "a=b")],
], ids=["none", "authorization", "secret-and-plain", "inner-space-tab", "all-tchars", "max-value",
        "max-count", "max-name", "ordinary-request-headers"])
def test_accepted(headers):
    assert ch.check(headers) == tuple(headers)


@pytest.mark.parametrize("headers, message", [
    # reserved names, any case
    ([H("webhook-signature")], "'webhook-signature' is reserved (the platform's own header"),
    ([H("Webhook-Id")], "'Webhook-Id' is reserved"),
    ([H("WEBHOOK-FUTURE-THING")], "reserved"),
    ([H("Host")], "'Host' is reserved (HTTP framing"),
    ([H("content-length")], "reserved (HTTP framing"),
    ([H("Content-Type")], "reserved (HTTP framing"),
    ([H("content-encoding")], "reserved (HTTP framing"),
    ([H("Transfer-Encoding")], "reserved (HTTP framing"),
    ([H("expect")], "reserved (HTTP framing"),
    ([H("trailer")], "reserved (HTTP framing"),
    ([H("Connection")], "reserved (a hop-by-hop header"),
    ([H("keep-alive")], "hop-by-hop"),
    ([H("proxy-connection")], "hop-by-hop"),
    ([H("Proxy-Authorization")], "hop-by-hop"),
    ([H("proxy-authenticate")], "hop-by-hop"),
    ([H("TE")], "hop-by-hop"),
    ([H("upgrade")], "hop-by-hop"),
    ([H("User-Agent")], "set by the sender"),
    ([H("accept-encoding")], "set by the sender"),
    # names
    ([H("")], "a header name is empty"),
    ([H("X Bad")], "'X Bad' is not a valid header name"),
    ([H("X:Bad")], "not a valid header name"),
    ([H(":authority")], "not a valid header name"),
    ([H("X-é")], "not a valid header name"),
    ([H("N" * (ch.MAX_NAME_CHARS + 1))], f"longer than {ch.MAX_NAME_CHARS} characters"),
    ([H("X-Dup"), H("x-dup")], "'x-dup' is given twice"),
    # values
    ([H("X-A", "")], "'X-A' has an empty value"),
    ([H("X-A", "a\r\nX-Injected: 1")], "must be visible ASCII"),
    ([H("X-A", "a\nb")], "must be visible ASCII"),
    ([H("X-A", "a\x00b")], "must be visible ASCII"),
    ([H("X-A", " padded")], "without leading or trailing spaces"),
    ([H("X-A", "padded ")], "without leading or trailing spaces"),
    ([H("X-A", "naïve")], "must be visible ASCII"),
    ([H("X-A", "v" * (ch.MAX_VALUE_CHARS + 1))], f"longer than {ch.MAX_VALUE_CHARS} characters"),
    # limits
    ([H(f"X-{i}") for i in range(ch.MAX_HEADERS + 1)], f"at most {ch.MAX_HEADERS} custom headers"),
    ([H(f"X-{i}", "v" * 2000) for i in range(4)], f"at most {ch.MAX_TOTAL_BYTES}"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_refused(headers, message):
    with pytest.raises(InvalidHeaders, match=message.replace("(", r"\(").replace(")", r"\)")):
        ch.check(headers)


@pytest.mark.parametrize("value", ["sekrit\nx", " sekrit", "sekrit ", "sekrit\x00"])
def test_a_refused_secret_value_is_never_echoed(value):
    with pytest.raises(InvalidHeaders) as info:
        ch.check([H("X-Key", value, secret=True)])
    assert "sekrit" not in str(info.value)
    assert "the secret value of 'X-Key'" in str(info.value)


def test_empty_secret_value_is_refused_without_a_current_secret_of_that_name():
    with pytest.raises(InvalidHeaders, match="has no secret header of that name"):
        ch.check([H("X-Key", "", secret=True)])
    assert ch.check([H("X-Key", "", secret=True)], keep_allowed=frozenset({"x-key"}))


def test_repr_hides_secret_values():
    assert SECRET not in repr(H("X-Key", SECRET, secret=True))
    assert SECRET not in str(H("X-Key", SECRET, secret=True))
    assert "'plain'" in repr(H("X-Tag", "plain"))


def _seal(headers, current=(), ring=RING, endpoint_id="ep_1"):
    return ch.seal(headers, current, ring, tenant_id="t_1", endpoint_id=endpoint_id, random_bytes=counter_bytes())


def test_seal_keeps_plain_values_and_seals_secret_ones():
    sealed = _seal([H("X-Tag", "acme"), H("X-Key", SECRET, secret=True)])
    assert sealed[0] == SealedHeader("X-Tag", value="acme")
    assert sealed[1].name == "X-Key" and sealed[1].value == "" and sealed[1].secret
    assert SECRET not in sealed[1].sealed
    assert ch.open_all(sealed, RING, tenant_id="t_1", endpoint_id="ep_1") == {"X-Tag": "acme", "X-Key": SECRET}


def test_empty_secret_value_keeps_the_current_ciphertext():
    first = _seal([H("X-Key", SECRET, secret=True)])
    again = _seal([H("x-key", "", secret=True), H("X-New", "n")], current=first)
    assert again[0].sealed == first[0].sealed and again[0].name == "x-key"
    assert ch.open_all(again, RING, tenant_id="t_1", endpoint_id="ep_1")["x-key"] == SECRET


def test_the_same_secret_sent_again_keeps_its_ciphertext_so_nothing_changes():
    first = _seal([H("X-Key", SECRET, secret=True)])
    assert _seal([H("X-Key", SECRET, secret=True)], current=first) == first
    changed = _seal([H("X-Key", SECRET + "2", secret=True)], current=first)
    assert changed != first


def test_a_plain_header_cannot_keep_a_secret_by_an_empty_value():
    first = _seal([H("X-Key", SECRET, secret=True)])
    with pytest.raises(InvalidHeaders, match="empty value"):
        _seal([H("X-Key", "")], current=first)


@pytest.mark.parametrize("tenant_id, endpoint_id, name", [
    ("t_2", "ep_1", "X-Key"), ("t_1", "ep_2", "X-Key"), ("t_1", "ep_1", "X-Other")])
def test_a_sealed_value_opens_only_where_it_was_sealed(tenant_id, endpoint_id, name):
    sealed = _seal([H("X-Key", SECRET, secret=True)])[0]
    moved = SealedHeader(name, sealed=sealed.sealed)
    with pytest.raises(SecretDecryptError, match="does not decrypt") as info:
        ch.open_all([moved], RING, tenant_id=tenant_id, endpoint_id=endpoint_id)
    assert SECRET not in str(info.value)


def test_the_binding_ignores_the_case_of_the_name():
    sealed = _seal([H("X-Key", SECRET, secret=True)])[0]
    assert ch.open_all([SealedHeader("x-KEY", sealed=sealed.sealed)], RING, tenant_id="t_1",
                       endpoint_id="ep_1") == {"x-KEY": SECRET}


def test_reseal_moves_secret_values_to_the_current_master_key():
    sealed = _seal([H("X-Tag", "acme"), H("X-Key", SECRET, secret=True)])
    assert ch.stale(sealed, RING2) == 1 and ch.stale(sealed, RING) == 0
    moved = ch.reseal(sealed, RING2, tenant_id="t_1", endpoint_id="ep_1", random_bytes=counter_bytes())
    assert sealed_with(moved[1].sealed) == "k2" and moved[0] == sealed[0]
    assert ch.stale(moved, RING2) == 0
    assert ch.open_all(moved, RING2, tenant_id="t_1", endpoint_id="ep_1")["X-Key"] == SECRET


def test_views_never_show_a_secret_value():
    sealed = _seal([H("X-Tag", "acme"), H("X-Key", SECRET, secret=True)])
    assert ch.views(sealed) == (ch.HeaderView("X-Tag", "acme", False), ch.HeaderView("X-Key", "", True))


@pytest.mark.parametrize("header", [SealedHeader("X-Tag", value="acme"), SealedHeader("X-Key", sealed="AQID")])
def test_record_form_round_trips(header):
    assert SealedHeader.from_dict(header.to_dict()) == header
    assert set(header.to_dict()) == ({"name", "sealed"} if header.secret else {"name", "value"})


@pytest.mark.parametrize("custom, platform, expected", [
    ({"X-Key": "k"}, {"webhook-id": "m"}, {"X-Key": "k", "webhook-id": "m"}),
    # a record the control plane did not check cannot replace the platform's headers
    ({"Webhook-Id": "forged", "X-Key": "k"}, {"webhook-id": "m"}, {"X-Key": "k", "webhook-id": "m"}),
    ({"USER-AGENT": "x"}, {"user-agent": "platform"}, {"user-agent": "platform"}),
    ({"Content-Length": "1", "Host": "evil"}, {}, {}),
], ids=["merged", "platform-wins", "case-insensitive", "reserved-dropped"])
def test_with_platform_headers(custom, platform, expected):
    assert ch.with_platform_headers(custom, platform) == expected


@pytest.mark.parametrize("items, secret, expected", [
    (["X-Tag: acme"], False, (H("X-Tag", "acme"),)),
    (["Authorization:Bearer a:b"], True, (H("Authorization", "Bearer a:b", True),)),
    (["X-Key:"], True, (H("X-Key", "", True),)),
], ids=["plain", "value-with-colon", "keep-secret"])
def test_parse_flag_list(items, secret, expected):
    assert ch.parse_flag_list(items, secret=secret) == expected


def test_parse_flag_list_does_not_echo_a_secret_without_a_colon():
    with pytest.raises(InvalidHeaders) as info:
        ch.parse_flag_list(["sk_live_only"], secret=True)
    assert "sk_live_only" not in str(info.value)
    with pytest.raises(InvalidHeaders, match="'X-Tag' has no ':'"):
        ch.parse_flag_list(["X-Tag"], secret=False)
