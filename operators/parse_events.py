"""Parse CDC records into events; anything unreadable goes to the dead-letter side output."""

from __future__ import annotations

import base64
import time

from pyflink.common.typeinfo import Types
from pyflink.datastream import OutputTag
from pyflink.datastream.functions import ProcessFunction, RuntimeContext

from core.ingest import IngestError, parse_event
from core.records import DeadLetter

DEAD_LETTERS = OutputTag("dead-letters", Types.STRING())


class ParseEvents(ProcessFunction):
    def __init__(self, max_payload_bytes: int, source_topic: str) -> None:
        self._max = max_payload_bytes
        self._topic = source_topic

    def open(self, runtime_context: RuntimeContext) -> None:
        self._refused = runtime_context.get_metrics_group().counter("events_dead_lettered")
        self._parsed = runtime_context.get_metrics_group().counter("events_parsed")

    def process_element(self, value: str, ctx: ProcessFunction.Context):  # type: ignore[override]
        # The source decodes with ISO-8859-1, which maps every byte to one char: this gets the
        # record's exact original bytes back, garbage included.
        raw = value.encode("latin-1")
        arrived_ms = ctx.timestamp() or int(time.time() * 1000)
        try:
            event = parse_event(raw, self._max)
        except IngestError as err:
            self._refused.inc()
            letter = DeadLetter(reason=err.reason, detail=err.detail,
                                original_base64=base64.b64encode(raw).decode(),
                                source_topic=self._topic, refused_at_ms=int(time.time() * 1000))
            yield DEAD_LETTERS, letter.to_json().decode()
            return
        self._parsed.inc()
        yield event.event_id, (event, arrived_ms)
