"""Fan-out snapshots made durable by the dispatcher, which already owns the batched history writer.

Fan-out sends one :class:`core.fanout.FanoutSnapshot` per event, keyed ``~fanout:<event_id>`` so
it shares no key with an endpoint. The snapshot stays in keyed state until Cassandra confirms its
row: a checkpoint taken meanwhile carries it (and its confirmation timer), so a TaskManager lost
after the source committed the event's offset still writes the row after the restore. A failed
write is counted and redone on the next timer; reconciliation reports any row still missing.

The pairs fan-out skipped (endpoints pinned to other schema majors) ride in the snapshot, so their
history rows (status ``skipped``, listed for their endpoint) are written in the same batch, kept
and redone with it (:meth:`operators.history_store.CassandraHistory.write_snapshot`).
"""

from __future__ import annotations

import logging
from typing import Any

from pyflink.common.typeinfo import Types
from pyflink.datastream.functions import RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor

from core.fanout import FanoutSnapshot
from operators.history_store import CassandraHistory
from operators.write_batcher import Completion

log = logging.getLogger(__name__)

SNAPSHOT_KEY_PREFIX = "~fanout:"


def snapshot_key(event_id: str) -> str:
    return SNAPSHOT_KEY_PREFIX + event_id


class SnapshotWriter:
    def __init__(self, rc: RuntimeContext, history: CassandraHistory, failures: Any, recheck_ms: int) -> None:
        self._state = rc.get_state(ValueStateDescriptor("fanout-snapshot", Types.PICKLED_BYTE_ARRAY()))
        self._history = history
        self._failures = failures
        self._recheck_ms = recheck_ms
        self._writes: dict[str, Completion] = {}  # this incarnation's writes, by key

    def received(self, key: str, snapshot: FanoutSnapshot, ctx: Any, now_ms: int) -> None:
        self._state.update(snapshot)
        self._write(key, snapshot, ctx, now_ms)

    def on_timer(self, key: str, ctx: Any, now_ms: int) -> None:
        write = self._writes.pop(key, None)
        if write is not None and not write.done():
            self._writes[key] = write
            self._history.flush_if_due()
            ctx.timer_service().register_processing_time_timer(now_ms + self._recheck_ms)
            return
        if write is not None and write.exception() is None:
            self._state.clear()
            return
        snapshot = self._state.value()
        if snapshot is None:
            return
        if write is not None:  # failed; None means a restore handed us the snapshot unconfirmed
            self._failures.inc()
            log.warning("fan-out snapshot of event %s not written (%s): writing it again",
                        snapshot.event_id, type(write.exception()).__name__)
        self._write(key, snapshot, ctx, now_ms)

    def _write(self, key: str, snapshot: FanoutSnapshot, ctx: Any, now_ms: int) -> None:
        self._writes[key] = self._history.write_snapshot(snapshot)
        self._history.flush_if_due()
        ctx.timer_service().register_processing_time_timer(now_ms + self._recheck_ms)
