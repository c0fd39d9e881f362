"""The dispatcher's input envelope: what fan-out, replay parsing and config keying emit to it.

Every input of the dispatcher (:mod:`operators.dispatcher`) is a keyed record
(:mod:`operators.keyed`), so the job keys their union with no extra Python operator. The value
is what ``process_element`` receives: ``(key, (kind, item))``, ``kind`` one of the names below.
Kept apart from the dispatcher so its senders do not import the operator itself.
"""

from __future__ import annotations

from typing import Any

from pyflink.common import Row

from operators.keyed import KEYED_RECORD, keyed

NEW = "delivery"
REPLAY = "replay"
CONFIG = "config"
SNAPSHOT = "fanout-snapshot"
REDRIVE = "redrive"

DISPATCH_INPUT = KEYED_RECORD


def for_dispatch(key: str, kind: str, item: Any) -> Row:
    return keyed(key, (key, (kind, item)))
