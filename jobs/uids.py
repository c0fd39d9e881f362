"""Stable operator uids. Savepoints map state to operators by these strings: renaming one loses
that operator's state on upgrade. tests/unit/jobs/test_job_uids.py pins them. The endpoints-topic
source is a table source whose uids the planner derives (table.exec.uid.generation = ALWAYS)."""

EVENTS_SOURCE = "events-source"
REPLAYS_SOURCE = "replays-source"
PARSE_EVENTS = "parse-events"
PARSE_ENDPOINTS = "parse-endpoint-configs"
PARSE_REPLAYS = "parse-replays"
DEAD_LETTER_SINK = "dead-letter-sink"
FAN_OUT = "fan-out"
DISPATCH = "dispatch"
DISPATCH_CONFIGS = "dispatch-endpoint-configs"
SIGNALS_SINK = "endpoint-signals-sink"
ARCHIVE_FACTS_SINK = "archive-facts-sink"

ALL = (EVENTS_SOURCE, REPLAYS_SOURCE, PARSE_EVENTS, PARSE_ENDPOINTS, PARSE_REPLAYS,
       DEAD_LETTER_SINK, FAN_OUT, DISPATCH, DISPATCH_CONFIGS, SIGNALS_SINK, ARCHIVE_FACTS_SINK)
