"""The endpoints topic as a broadcast stream: one shared state descriptor and its parser.

The topic is read through Flink's upsert-kafka table source, which understands a compacted
topic: the latest value per key, and a tombstone (null value) as a DELETE row that still carries
the key and the last value. A tombstone is turned into that last config with status ``deleted``
one version up, so downstream a tombstone and an explicit ``deleted`` config mean the same.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from pyflink.common import Row, RowKind
from pyflink.common.typeinfo import Types
from pyflink.datastream.functions import FlatMapFunction, RuntimeContext
from pyflink.datastream.state import MapStateDescriptor

from core.records import CLOCK_KEY, EndpointConfig, EndpointStatus, UnreadableConfig, parse_endpoint_topic_value

log = logging.getLogger(__name__)

# endpoint_id -> latest EndpointConfig. Fan-out also keeps the config clock under CLOCK_KEY.
ENDPOINT_CONFIGS = MapStateDescriptor("endpoint-configs", Types.STRING(), Types.PICKLED_BYTE_ARRAY())


class ParseEndpointRecord(FlatMapFunction):
    """Configs and clock ticks from the control plane. Unknown fields are ignored and an unknown
    status reads as "not active" (:meth:`EndpointStatus.tolerant`); a record that cannot be read
    at all becomes an :class:`UnreadableConfig` for its key -- counted (``configs_refused``),
    logged, and holding that endpoint in the dispatcher -- never silently skipped."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self._refused = runtime_context.get_metrics_group().counter("configs_refused")

    def flat_map(self, value: Row):  # type: ignore[override]
        kind = value.get_row_kind()
        if kind is RowKind.UPDATE_BEFORE or value[1] is None:
            return  # the old side of an update; or a tombstone for a key never seen
        try:
            record = parse_endpoint_topic_value(value[1].encode("utf-8"))
        except (ValueError, KeyError, TypeError) as exc:
            self._refused.inc()
            log.error("unreadable endpoints-topic record for key %r: %s", value[0], exc)
            if value[0] is not None and value[0] != CLOCK_KEY:
                yield UnreadableConfig(endpoint_id=str(value[0]), reason=f"{type(exc).__name__}: {exc}")
            return
        if kind is RowKind.DELETE:
            if isinstance(record, EndpointConfig):
                yield replace(record, status=EndpointStatus.DELETED, config_version=record.config_version + 1)
            return
        yield record
