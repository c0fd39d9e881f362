"""Stable operator uids. Savepoints map state to operators by these strings: renaming one loses
that operator's state on upgrade. tests/unit/test_job_uids.py pins them."""

EVENTS_SOURCE = "events-source"
ENDPOINTS_SOURCE = "endpoints-source"
REPLAYS_SOURCE = "replays-source"
PARSE_EVENTS = "parse-events"
PARSE_ENDPOINTS = "parse-endpoint-configs"
PARSE_REPLAYS = "parse-replays"
DEAD_LETTER_SINK = "dead-letter-sink"
FAN_OUT = "fan-out"
DISPATCH = "dispatch"
DISPATCH_CONFIGS = "dispatch-endpoint-configs"
SIGNALS_SINK = "endpoint-signals-sink"

ALL = (EVENTS_SOURCE, ENDPOINTS_SOURCE, REPLAYS_SOURCE, PARSE_EVENTS, PARSE_ENDPOINTS, PARSE_REPLAYS,
       DEAD_LETTER_SINK, FAN_OUT, DISPATCH, DISPATCH_CONFIGS, SIGNALS_SINK)
