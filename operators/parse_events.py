"""Parse CDC records into events; anything unreadable, or aimed at one endpoint without the
control plane's proof, goes to the dead-letter side output."""

from __future__ import annotations

import base64
import time

from pyflink.common.typeinfo import Types
from pyflink.datastream import OutputTag
from pyflink.datastream.functions import ProcessFunction, RuntimeContext

from core import target_proof
from core.ingest import IngestError, check_target, parse_event
from core.records import DeadLetter
from core.settings import Settings
from operators.keyed import keyed

DEAD_LETTERS = OutputTag("dead-letters", Types.STRING())


class ParseEvents(ProcessFunction):
    def __init__(self, settings: Settings, source_topic: str) -> None:
        # The TaskManagers' settings (core.settings.for_taskmanagers): the target-proof key is
        # derived from the master key in open(), on the TaskManager.
        self._settings = settings
        self._max = settings.ingest.max_payload_bytes
        self._topic = source_topic

    def open(self, runtime_context: RuntimeContext) -> None:
        self._refused = runtime_context.get_metrics_group().counter("events_dead_lettered")
        self._parsed = runtime_context.get_metrics_group().counter("events_parsed")
        # Proofs under any configured master key: during a rotation the control plane may still
        # hold the old one.
        self._target_keys = [target_proof.target_key(k) for k in self._settings.master_keyring().keys.values()]

    def process_element(self, value: str, ctx: ProcessFunction.Context):  # type: ignore[override]
        # The source decodes with ISO-8859-1, which maps every byte to one char: this gets the
        # record's exact original bytes back, garbage included.
        raw = value.encode("latin-1")
        arrived_ms = ctx.timestamp() or int(time.time() * 1000)
        try:
            event = parse_event(raw, self._max)
            check_target(event, self._target_keys)
        except IngestError as err:
            self._refused.inc()
            letter = DeadLetter(reason=err.reason, detail=err.detail,
                                original_base64=base64.b64encode(raw).decode(),
                                source_topic=self._topic, refused_at_ms=int(time.time() * 1000))
            yield DEAD_LETTERS, letter.to_json().decode()
            return
        self._parsed.inc()
        # Keyed by event id for fan-out (operators/keyed.py); fan-out receives (id, (event, arrival)).
        yield keyed(event.event_id, (event.event_id, (event, arrived_ms)))
