"""One parser for every payload sent as ``application/json``: strict RFC 8259 JSON in UTF-8.

Python's ``json.loads`` accepts more than a receiver's parser may, and the schema check would
then judge a value that no receiver reads the same way. Refused here, unlike ``json.loads``:

* ``NaN``, ``Infinity``, ``-Infinity`` (not JSON; as floats they pass ``"minimum": 0``), and a
  number past the range of a double such as ``1e400`` (it reads as infinite: the same hole);
* bytes that are not UTF-8 (``json.loads`` decodes UTF-16 and UTF-32 by itself), and a UTF-8
  byte order mark (RFC 8259: a JSON text sent must not start with one);
* a lone surrogate escape such as ``"\\ud800"`` in a string or a key: the str it makes cannot be
  encoded as UTF-8, and receivers replace or refuse it;
* a key twice in one object: parsers disagree on which counts (``json.loads`` and JavaScript
  keep the last, some keep the first, some refuse it), so ``{"amount": -5, "amount": 5}`` passes
  a check that a first-wins receiver's reading fails (the costliest hook);
* nesting deeper than the parser's stack (``json.loads`` raises RecursionError, not ValueError).

The rest is ``json.loads``'s grammar, which is RFC 8259's: any value at the top, JSON whitespace
only, nothing after the value. An integer past Python's 4300-digit conversion limit is refused
too: valid JSON, but not a value to send anyone.

This is on the delivery path, so it stays close to ``json.loads``: one shared decoder, hooks that
run only on floats, non-finite constants and objects, and the surrogate check only on the rare
text that holds a surrogate escape.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any


class NotStrictJson(ValueError):
    """The bytes are not one strict RFC 8259 document in UTF-8; the message says why."""


class NotUtf8(NotStrictJson):
    """The bytes are not UTF-8 at all (for callers that report that apart, as ingest does)."""


_BOM = b"\xef\xbb\xbf"
# A \uD800-\uDFFF escape is the only way a surrogate gets into the document (the UTF-8 decode
# refuses encoded ones). Pairs are fine, Python joins them: a match only means "look closer".
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def loads(body: bytes) -> Any:
    """The document ``body`` holds, or :class:`NotStrictJson` saying why it is not strict JSON."""
    if body.startswith(_BOM):
        raise NotStrictJson("it starts with a byte order mark (RFC 8259: a JSON text sent has none)")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8(f"it is not UTF-8: {exc}") from None
    try:
        doc = _DECODER.decode(text)
        # "\\" first: a one-character search runs at memchr speed, far faster than the pattern's
        # (docs/performance.md#the-taskmanagers-interpreter).
        lone = "\\" in text and _SURROGATE_ESCAPE.search(text) is not None and _has_lone_surrogate(doc)
    except NotStrictJson:
        raise
    except RecursionError:
        raise NotStrictJson("it is nested too deeply to parse") from None
    except ValueError as exc:  # JSONDecodeError, or an integer past the digit limit
        raise NotStrictJson(f"it is not one JSON document: {exc}") from None
    if lone:
        raise NotStrictJson("a string or key holds a lone surrogate escape (\\ud800-\\udfff, unpaired)")
    return doc


def _constant(name: str) -> Any:
    raise NotStrictJson(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise NotStrictJson(f"the number {text[:40]} is past the range of a double (it reads as infinite)")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise NotStrictJson(f"the key {key[:80]!r} appears twice in one object")
            seen.add(key)
    return obj


def _has_lone_surrogate(doc: Any) -> bool:
    # Serialising without ASCII escapes and encoding as UTF-8 fails exactly on an unpaired
    # surrogate in any string or key, and does it in C.
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# Shared by every call: json.loads with hooks would build a decoder each time.
_DECODER = json.JSONDecoder(parse_float=_float, parse_constant=_constant, object_pairs_hook=_object)
