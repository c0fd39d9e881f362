"""Signing secrets at rest: round trip, binding, wrong key, redaction."""

from __future__ import annotations

import base64

import pytest

from core.secrets import (
    NONCE_BYTES,
    Redacted,
    SecretDecryptError,
    constant_time_equals,
    decrypt_secret,
    encrypt_secret,
    redact,
)
from core.signing import generate_secret

MASTER = bytes(range(32))
OTHER_MASTER = bytes(range(1, 33))
NONCE = b"\x07" * NONCE_BYTES
SECRET = generate_secret(bytes(range(100, 132)))


def _encrypt(nonce: bytes = NONCE) -> str:
    return encrypt_secret(MASTER, SECRET, tenant_id="t_1", endpoint_id="ep_1", key_version=3, nonce=nonce)


def _decrypt(
    ciphertext: str,
    master: bytes = MASTER,
    tenant_id: str = "t_1",
    endpoint_id: str = "ep_1",
    key_version: int = 3,
) -> str:
    return decrypt_secret(
        master, ciphertext, tenant_id=tenant_id, endpoint_id=endpoint_id, key_version=key_version
    )


def test_round_trip() -> None:
    ciphertext = _encrypt()
    assert SECRET not in ciphertext
    assert _decrypt(ciphertext) == SECRET


def test_output_is_deterministic_for_a_given_nonce_and_differs_across_nonces() -> None:
    assert _encrypt() == _encrypt()
    assert _encrypt() != _encrypt(nonce=b"\x08" * NONCE_BYTES)


@pytest.mark.parametrize(
    ("tenant_id", "endpoint_id", "key_version"),
    [("t_2", "ep_1", 3), ("t_1", "ep_2", 3), ("t_1", "ep_1", 2)],
    ids=["other-tenant", "other-endpoint", "other-version"],
)
def test_ciphertext_cannot_move_to_another_binding(
    tenant_id: str, endpoint_id: str, key_version: int
) -> None:
    with pytest.raises(SecretDecryptError, match="does not decrypt") as info:
        _decrypt(_encrypt(), tenant_id=tenant_id, endpoint_id=endpoint_id, key_version=key_version)
    assert "whsec_" not in str(info.value)


def test_wrong_master_key_fails() -> None:
    with pytest.raises(SecretDecryptError):
        _decrypt(_encrypt(), master=OTHER_MASTER)


def test_tampered_ciphertext_fails() -> None:
    raw = bytearray(base64.b64decode(_encrypt()))
    raw[-1] ^= 1
    with pytest.raises(SecretDecryptError):
        _decrypt(base64.b64encode(raw).decode())


@pytest.mark.parametrize("garbage", ["not base64!", "", base64.b64encode(b"\x02" + b"x" * 40).decode()])
def test_malformed_ciphertext_fails_cleanly(garbage: str) -> None:
    with pytest.raises(SecretDecryptError):
        _decrypt(garbage)


def test_key_and_nonce_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="master key"):
        encrypt_secret(b"short", SECRET, tenant_id="t", endpoint_id="e", key_version=1, nonce=NONCE)
    with pytest.raises(ValueError, match="nonce"):
        _encrypt(nonce=b"\x00" * 8)


def test_constant_time_equals() -> None:
    assert constant_time_equals("abc", b"abc")
    assert not constant_time_equals(b"abc", b"abd")
    assert not constant_time_equals("abc", "abcd")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"bad secret {SECRET} here", "bad secret whsec_[REDACTED] here"),
        (f"two: {SECRET},{SECRET}", "two: whsec_[REDACTED],whsec_[REDACTED]"),
        ("url-safe whsec_ab-_cd= end", "url-safe whsec_[REDACTED] end"),
        ("cut whsec_abc", "cut whsec_[REDACTED]"),
        ("nothing secret", "nothing secret"),
    ],
)
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_redacted_wrapper_hides_value_from_str_repr_and_fstrings() -> None:
    wrapped = Redacted(SECRET)
    assert SECRET not in repr(wrapped)
    assert SECRET not in str(wrapped)
    assert SECRET not in f"{wrapped} {[wrapped]}"
    assert wrapped.reveal() == SECRET


# -- master keys by id ----------------------------------------------------------

def test_a_keyring_seals_with_its_current_key_and_names_it() -> None:
    from core.secrets import Keyring, sealed_with

    ring = Keyring("k2", {"k2": OTHER_MASTER, "k1": MASTER})
    c = encrypt_secret(ring, SECRET, tenant_id="t_1", endpoint_id="ep_1", key_version=3, nonce=NONCE)
    assert sealed_with(c) == "k2" and sealed_with(_encrypt()) is None  # v1: sealed before ids
    assert _decrypt(c, master=ring) == SECRET  # type: ignore[arg-type]
    assert _decrypt(c, master=Keyring.single(OTHER_MASTER, "k2")) == SECRET  # type: ignore[arg-type]
    with pytest.raises(SecretDecryptError, match="sealed under master key 'k2', which is not configured"):
        _decrypt(c, master=Keyring.single(MASTER, "k1"))  # type: ignore[arg-type]
    with pytest.raises(SecretDecryptError):
        _decrypt(c, endpoint_id="ep_2", master=ring)  # type: ignore[arg-type]  # the binding still holds


def test_secrets_sealed_before_ids_open_under_any_key_of_the_ring() -> None:
    from core.secrets import Keyring

    legacy = _encrypt()  # v1, under MASTER
    assert _decrypt(legacy, master=Keyring("k2", {"k2": OTHER_MASTER, "k1": MASTER})) == SECRET  # type: ignore[arg-type]
    with pytest.raises(SecretDecryptError, match="does not decrypt"):
        _decrypt(legacy, master=Keyring.single(OTHER_MASTER))  # type: ignore[arg-type]


@pytest.mark.parametrize(("current", "keys", "error"), [
    ("k3", {"k1": MASTER}, "not in the keyring"),
    ("K1", {"K1": MASTER}, "a-z"),
    ("k1", {"k1": b"short"}, "must be 32 bytes"),
])
def test_a_bad_keyring_is_refused(current: str, keys: dict[str, bytes], error: str) -> None:
    from core.secrets import Keyring

    with pytest.raises(ValueError, match=error):
        Keyring(current, keys)


def test_a_keyring_never_shows_its_keys() -> None:
    from core.secrets import Keyring

    text = repr(Keyring("k1", {"k1": MASTER}))
    assert "k1" in text and MASTER.hex() not in text and str(MASTER) not in text
