"""Manual replays and reconciliation's redrives from the control plane, keyed like deliveries (by
endpoint). The record's ``schema`` says which it is."""

from __future__ import annotations

import logging

from pyflink.datastream.functions import FlatMapFunction

from core.ingest import parse_redrive
from core.records import REDRIVE_SCHEMA_V1, ReplayRequest, record_schema
from operators.dispatch_input import REDRIVE, REPLAY, for_dispatch

log = logging.getLogger(__name__)


class ParseReplays(FlatMapFunction):
    def flat_map(self, value: str):  # type: ignore[override]
        raw = value.encode("latin-1")
        try:
            if record_schema(raw) == REDRIVE_SCHEMA_V1:
                d = parse_redrive(raw)
                yield for_dispatch(d.endpoint_id, REDRIVE, d)
                return
            r = ReplayRequest.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("unreadable replay request skipped: %s", exc)
            return
        yield for_dispatch(r.endpoint_id, REPLAY, r)
