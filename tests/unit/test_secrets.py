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
BINDING = {"tenant_id": "t_1", "endpoint_id": "ep_1", "key_version": 3}


def _encrypt(**overrides: object) -> str:
    args: dict[str, object] = {**BINDING, "nonce": NONCE, **overrides}
    return encrypt_secret(MASTER, SECRET, **args)  # type: ignore[arg-type]


def test_round_trip() -> None:
    ciphertext = _encrypt()
    assert SECRET not in ciphertext
    assert decrypt_secret(MASTER, ciphertext, **BINDING) == SECRET  # type: ignore[arg-type]


def test_output_is_deterministic_for_a_given_nonce_and_differs_across_nonces() -> None:
    assert _encrypt() == _encrypt()
    assert _encrypt() != _encrypt(nonce=b"\x08" * NONCE_BYTES)


@pytest.mark.parametrize(
    "binding",
    [
        {**BINDING, "tenant_id": "t_2"},
        {**BINDING, "endpoint_id": "ep_2"},
        {**BINDING, "key_version": 2},
    ],
    ids=["other-tenant", "other-endpoint", "other-version"],
)
def test_ciphertext_cannot_move_to_another_binding(binding: dict[str, object]) -> None:
    with pytest.raises(SecretDecryptError, match="does not decrypt") as info:
        decrypt_secret(MASTER, _encrypt(), **binding)  # type: ignore[arg-type]
    assert "whsec_" not in str(info.value)


def test_wrong_master_key_fails() -> None:
    with pytest.raises(SecretDecryptError):
        decrypt_secret(OTHER_MASTER, _encrypt(), **BINDING)  # type: ignore[arg-type]


def test_tampered_ciphertext_fails() -> None:
    raw = bytearray(base64.b64decode(_encrypt()))
    raw[-1] ^= 1
    with pytest.raises(SecretDecryptError):
        decrypt_secret(MASTER, base64.b64encode(raw).decode(), **BINDING)  # type: ignore[arg-type]


@pytest.mark.parametrize("garbage", ["not base64!", "", base64.b64encode(b"\x02" + b"x" * 40).decode()])
def test_malformed_ciphertext_fails_cleanly(garbage: str) -> None:
    with pytest.raises(SecretDecryptError):
        decrypt_secret(MASTER, garbage, **BINDING)  # type: ignore[arg-type]


def test_key_and_nonce_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="master key"):
        encrypt_secret(b"short", SECRET, nonce=NONCE, **BINDING)  # type: ignore[arg-type]
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
