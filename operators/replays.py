"""Manual replays from the control plane, keyed like deliveries (by endpoint)."""

from __future__ import annotations

import logging

from pyflink.datastream.functions import FlatMapFunction

from core.records import ReplayRequest
from operators.dispatcher import REPLAY

log = logging.getLogger(__name__)


class ParseReplays(FlatMapFunction):
    def flat_map(self, value: str):  # type: ignore[override]
        try:
            r = ReplayRequest.from_json(value.encode("latin-1"))
        except (ValueError, KeyError, TypeError) as exc:
            log.error("unreadable replay request skipped: %s", exc)
            return
        yield r.endpoint_id, (REPLAY, r)
