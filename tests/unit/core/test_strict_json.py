"""core/strict_json.py: one strict RFC 8259 document in UTF-8, or the reason it is not."""

from __future__ import annotations

from typing import Any

import pytest

from core import strict_json

ACCEPTED: list[tuple[str, bytes, Any]] = [
    # id                           bytes                                       document
    ("object", b'{"a":1,"b":[true,false,null]}', {"a": 1, "b": [True, False, None]}),
    ("any value at the top", b'"text"', "text"),
    ("a number at the top", b"-0.5e-3", -0.0005),
    ("JSON whitespace around", b' \t\r\n{"a":1}\n', {"a": 1}),
    ("non-ASCII as UTF-8", '{"n":"café ☕"}'.encode(), {"n": "café ☕"}),
    ("an escaped surrogate pair", b'"\\ud83d\\ude00"', "\U0001F600"),
    ("a pair, then a BMP escape", b'"\\ud83d\\ude00\\u00e9"', "\U0001F600é"),
    ("an escaped backslash before ud800", b'"\\\\ud800"', "\\ud800"),
    ("the largest double", b"[1.7976931348623157e308]", [1.7976931348623157e308]),
    ("an underflow is zero", b"[1e-400]", [0.0]),
    ("a big integer", b"[123456789012345678901234567890]", [123456789012345678901234567890]),
    ("the same key in two objects", b'[{"a":1},{"a":2}]', [{"a": 1}, {"a": 2}]),
    ("an empty object", b"{}", {}),
]


@pytest.mark.parametrize(("body", "doc"), [c[1:] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accepted(body: bytes, doc: Any) -> None:
    assert strict_json.loads(body) == doc


REFUSED: list[tuple[str, bytes, str]] = [
    # id                           bytes                                  the message says
    ("NaN", b'{"a":NaN}', "NaN is not a JSON number"),
    ("Infinity", b"[Infinity]", "Infinity is not a JSON number"),
    ("-Infinity", b"[-Infinity]", "-Infinity is not a JSON number"),
    ("past a double", b"[1e400]", "past the range of a double"),
    ("past a double, negative", b"[-1.0e309]", "past the range of a double"),
    ("a lone high surrogate", b'"\\ud800"', "lone surrogate"),
    ("a lone low surrogate", b'"\\uDC00"', "lone surrogate"),
    ("a high surrogate then text", b'"\\ud83dx"', "lone surrogate"),
    ("a pair reversed", b'"\\ude00\\ud83d"', "lone surrogate"),
    ("a lone surrogate in a key", b'{"\\udbff":1}', "lone surrogate"),
    ("a lone surrogate beside a pair", b'["\\ud83d\\ude00","\\ud800"]', "lone surrogate"),
    ("a key twice", b'{"a":-5,"a":5}', "the key 'a' appears twice"),
    ("a key twice, nested", b'{"x":{"b":1,"c":2,"b":3}}', "the key 'b' appears twice"),
    ("a key twice by escape", b'{"a":1,"\\u0061":2}', "the key 'a' appears twice"),
    ("trailing data", b'{"a":1} {"b":2}', "Extra data"),
    ("empty", b"", "Expecting value"),
    ("a UTF-8 byte order mark", b'\xef\xbb\xbf{"a":1}', "byte order mark"),
    ("UTF-16 with its BOM", '{"a":1}'.encode("utf-16"), "not UTF-8"),
    ("UTF-16 without one", '{"a":1}'.encode("utf-16-be"), "not one JSON document"),
    ("UTF-32", '{"a":1}'.encode("utf-32"), "not UTF-8"),
    ("latin-1", '"café"'.encode("latin-1"), "not UTF-8"),
    ("an encoded surrogate", b'"\xed\xa0\x80"', "not UTF-8"),
    ("an overlong encoding", b'"\xc0\xaf"', "not UTF-8"),
    ("a raw control character", b'"a\x01b"', "Invalid control character"),
    ("a single quote", b"{'a':1}", "not one JSON document"),
    ("a trailing comma", b"[1,]", "not one JSON document"),
    ("a leading zero", b"[01]", "not one JSON document"),
    ("nested past the stack", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ("an integer past the digit limit", b"[" + b"9" * 5000 + b"]", "not one JSON document"),
]


@pytest.mark.parametrize(("body", "says"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused(body: bytes, says: str) -> None:
    with pytest.raises(strict_json.NotStrictJson, match=says.replace("(", r"\(")):
        strict_json.loads(body)


def test_not_utf8_is_told_apart() -> None:
    with pytest.raises(strict_json.NotUtf8):
        strict_json.loads(b"\xff{}")
    with pytest.raises(strict_json.NotStrictJson) as info:
        strict_json.loads(b"{NaN}")
    assert not isinstance(info.value, strict_json.NotUtf8)
