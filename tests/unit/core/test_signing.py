"""Signing against fixed vectors and against the official Standard Webhooks verifier."""

from __future__ import annotations

import base64
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from core.signing import build_headers, generate_secret, secret_bytes, sign

# The example from the Standard Webhooks specification / reference libraries.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TS = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

# Computed independently with `openssl dgst -sha256 -mac HMAC -macopt hexkey:...`.
KEY_A = bytes(range(32))
KEY_B = bytes(range(32, 64))
BODY = b'{"id":"inv_9","amount":100}'
SIG_A = "v1,fQtlF3q+btonFSYPXJWVlRu0PxTPfDZuerVWWwk7I30="
SIG_B = "v1,YNNtQxpq8iZkxfffpDHl1JT/a75u36Ic0cG8FhuQMW4="


def test_spec_vector() -> None:
    headers = sign(SPEC_ID, SPEC_TS, SPEC_BODY, [(1, secret_bytes(SPEC_SECRET))])
    assert headers == {
        "webhook-id": SPEC_ID,
        "webhook-timestamp": str(SPEC_TS),
        "webhook-signature": SPEC_SIG,
    }


def test_two_secrets_sign_in_order_space_separated() -> None:
    headers = sign("dlv_0123", 1700000000, BODY, [(2, KEY_A), (1, KEY_B)])
    assert headers["webhook-signature"] == f"{SIG_A} {SIG_B}"


def test_generate_secret_round_trips() -> None:
    secret = generate_secret(KEY_A)
    assert secret == "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
    assert secret_bytes(secret) == KEY_A


@pytest.mark.parametrize("size", [0, 16, 31, 33])
def test_generate_secret_refuses_wrong_size(size: int) -> None:
    with pytest.raises(ValueError, match="32 random bytes"):
        generate_secret(b"\x00" * size)


@pytest.mark.parametrize("bad", ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_", "whsec_not*base64"])
def test_secret_bytes_refuses_without_echoing_the_secret(bad: str) -> None:
    with pytest.raises(ValueError) as info:
        secret_bytes(bad)
    payload = bad.removeprefix("whsec_")
    assert not payload or payload not in str(info.value)


@pytest.mark.parametrize("msg_id", ["", "a.b", "has space", "crlf\r\n", "tab\t"])
def test_sign_refuses_unsafe_ids(msg_id: str) -> None:
    with pytest.raises(ValueError):
        sign(msg_id, 1, BODY, [(1, KEY_A)])


def test_sign_needs_a_secret() -> None:
    with pytest.raises(ValueError, match="at least one"):
        sign("dlv_1", 1, BODY, [])


def _now() -> int:
    # The official verifier checks a 5-minute tolerance against the real clock.
    return int(time.time())


@pytest.mark.parametrize("live", [[(1, KEY_A)], [(2, KEY_B), (1, KEY_A)]])
def test_official_verifier_accepts_with_each_live_secret(live: list[tuple[int, bytes]]) -> None:
    headers = sign("dlv_abc", _now(), BODY, live)
    for _, key in live:
        assert Webhook(generate_secret(key)).verify(BODY, headers) == {"id": "inv_9", "amount": 100}


def test_official_verifier_rejects_tampered_body() -> None:
    headers = sign("dlv_abc", _now(), BODY, [(2, KEY_B), (1, KEY_A)])
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret(KEY_A)).verify(BODY.replace(b"100", b"999"), headers)


def test_official_verifier_rejects_other_secret_and_other_id() -> None:
    headers = sign("dlv_abc", _now(), BODY, [(1, KEY_A)])
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret(KEY_B)).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret(KEY_A)).verify(BODY, {**headers, "webhook-id": "dlv_other"})


def test_signs_exact_bytes_not_reserialised_json() -> None:
    # Same JSON value, different bytes: the signatures must differ.
    compact = sign("dlv_1", 1, b'{"a":1}', [(1, KEY_A)])["webhook-signature"]
    spaced = sign("dlv_1", 1, b'{"a": 1}', [(1, KEY_A)])["webhook-signature"]
    assert compact != spaced


def test_build_headers_adds_metadata() -> None:
    headers = build_headers(
        "dlv_0123",
        1700000000,
        BODY,
        [(2, KEY_A), (1, KEY_B)],
        event_type="invoice.paid",
        event_id="evt_1",
        occurred_at_ms=1_700_000_000_123,
        schema_version="2026-01-01",
        object_id="inv_9",
        object_version=7,
        attempt=3,
    )
    assert headers == {
        "webhook-id": "dlv_0123",
        "webhook-timestamp": "1700000000",  # the attempt's time (Standard Webhooks)
        "webhook-signature": f"{SIG_A} {SIG_B}",
        "content-type": "application/json",
        "webhook-event-type": "invoice.paid",
        "webhook-event-id": "evt_1",
        "webhook-occurred-at": "2023-11-14T22:13:20.123Z",
        "webhook-schema-version": "2026-01-01",
        "webhook-key-versions": "2 1",
        "webhook-signature-version": "v1",
        # Ordering metadata: a receiver drops an update older than the one it has.
        "webhook-object-id": "inv_9",
        "webhook-object-version": "7",
        "webhook-attempt": "3",
    }


def test_an_event_without_an_object_sends_no_object_headers() -> None:
    headers = build_headers("dlv_1", 1, BODY, [(1, KEY_A)], event_type="ping", event_id="evt_1",
                            occurred_at_ms=0, schema_version="1")
    assert not {"webhook-object-id", "webhook-object-version", "webhook-attempt"} & headers.keys()


def test_object_id_is_checked_for_header_injection() -> None:
    with pytest.raises(ValueError, match="line break"):
        build_headers("dlv_1", 1, BODY, [(1, KEY_A)], event_type="x", event_id="evt_1", occurred_at_ms=0,
                      schema_version="1", object_id="inv\nset-cookie: a=b")


def test_build_headers_refuses_header_injection() -> None:
    with pytest.raises(ValueError, match="line break"):
        build_headers(
            "dlv_1",
            1,
            BODY,
            [(1, KEY_A)],
            event_type="x\r\nset-cookie: a=b",
            event_id="evt_1",
            occurred_at_ms=0,
            schema_version="1",
        )


# -- ed25519 (v1a), verified with libsodium (PyNaCl): an implementation independent of ours --------

def _nacl_verify(whpk: str, headers: dict[str, str], body: bytes) -> list[bool]:
    """A receiver's check: every v1a signature in the header against the public key."""
    import nacl.exceptions
    import nacl.signing

    key = nacl.signing.VerifyKey(base64.b64decode(whpk.removeprefix("whpk_")))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    out = []
    for entry in headers["webhook-signature"].split(" "):
        version, _, sig = entry.partition(",")
        if version != "v1a":
            continue
        try:
            key.verify(signed, base64.b64decode(sig))
            out.append(True)
        except nacl.exceptions.BadSignatureError:
            out.append(False)
    return out


def test_ed25519_keys_have_the_standard_prefixes_and_sign_v1a() -> None:
    from core import signing

    whsk = signing.generate_key(signing.ED25519, bytes(range(32)))
    assert whsk.startswith("whsk_") and signing.scheme_of(whsk) == signing.ED25519
    whpk = signing.public_key(whsk)
    assert whpk.startswith("whpk_") and len(base64.b64decode(whpk[5:])) == 32
    body = b'{"type":"invoice.paid"}'
    headers = signing.sign("dlv_1", 1_700_000_000, body, [(1, signing.signing_material(whsk))])
    assert headers["webhook-signature"].startswith("v1a,")
    assert _nacl_verify(whpk, headers, body) == [True]
    # The same public key: libsodium derives it from the seed as we do.
    import nacl.signing
    assert nacl.signing.SigningKey(bytes(range(32))).verify_key.encode() == base64.b64decode(whpk[5:])


def test_ed25519_signatures_fail_for_other_bytes_ids_times_and_keys() -> None:
    from core import signing

    whsk = signing.generate_key(signing.ED25519, b"\x07" * 32)
    other = signing.public_key(signing.generate_key(signing.ED25519, b"\x08" * 32))
    body = b'{"a":1}'
    headers = signing.sign("dlv_1", 1_700_000_000, body, [(1, signing.signing_material(whsk))])
    assert _nacl_verify(signing.public_key(whsk), headers, body + b" ") == [False]
    assert _nacl_verify(signing.public_key(whsk), {**headers, "webhook-id": "dlv_2"}, body) == [False]
    assert _nacl_verify(signing.public_key(whsk), {**headers, "webhook-timestamp": "1700000001"}, body) == [False]
    assert _nacl_verify(other, headers, body) == [False]


def test_a_rotation_from_hmac_to_ed25519_signs_with_both() -> None:
    """During the overlap a receiver holding either the old whsec_ or the new whpk_ verifies."""
    from standardwebhooks.webhooks import Webhook

    from core import signing

    whsec = signing.generate_key(signing.HMAC_SHA256, b"\x01" * 32)
    whsk = signing.generate_key(signing.ED25519, b"\x02" * 32)
    body = b'{"rotating":true}'
    now = int(time.time())
    keys = [(2, signing.signing_material(whsk)), (1, signing.signing_material(whsec))]
    headers = signing.build_headers("dlv_9", now, body, keys, event_type="a.b", event_id="evt_1",
                                    occurred_at_ms=now * 1000, schema_version="1")
    assert headers["webhook-signature-version"] == "v1a v1" and headers["webhook-key-versions"] == "2 1"
    assert _nacl_verify(signing.public_key(whsk), headers, body) == [True]
    Webhook(whsec).verify(body, headers)  # the official library, HMAC side


@pytest.mark.parametrize(("scheme", "error"), [("rsa", "unknown signature scheme"), ("", "unknown signature scheme")])
def test_unknown_schemes_are_refused(scheme: str, error: str) -> None:
    from core import signing

    with pytest.raises(ValueError, match=error):
        signing.generate_key(scheme, b"\x00" * 32)


def test_a_malformed_ed25519_key_errors_without_echoing_it() -> None:
    from core import signing

    for bad in ("whsk_not-base64!", "whsk_" + base64.b64encode(b"short").decode()):
        with pytest.raises(ValueError) as err:
            signing.signing_material(bad)
        assert bad[5:] not in str(err.value)
