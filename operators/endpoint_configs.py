"""The endpoints topic as a broadcast stream: one shared state descriptor and its parser."""

from __future__ import annotations

import logging

from pyflink.common.typeinfo import Types
from pyflink.datastream.functions import FlatMapFunction
from pyflink.datastream.state import MapStateDescriptor

from core.records import parse_endpoint_topic_value

log = logging.getLogger(__name__)

# endpoint_id -> latest EndpointConfig. Fan-out also keeps the config clock under CLOCK_KEY.
ENDPOINT_CONFIGS = MapStateDescriptor("endpoint-configs", Types.STRING(), Types.PICKLED_BYTE_ARRAY())


class ParseEndpointRecord(FlatMapFunction):
    """Configs and clock ticks from the control plane. A record we cannot read is logged and
    skipped: the control plane is the only producer, and its republisher re-sends the config."""

    def flat_map(self, value: str):  # type: ignore[override]
        try:
            yield parse_endpoint_topic_value(value.encode("latin-1"))
        except (ValueError, KeyError, TypeError) as exc:
            log.error("unreadable endpoints-topic record skipped: %s", exc)
