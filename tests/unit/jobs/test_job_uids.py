"""Savepoints map state to operators by uid: a renamed or dropped uid silently loses state on an
upgrade. These values are pinned; changing one is a deliberate, documented state migration."""

import ast
from pathlib import Path

from jobs import uids

PINNED = {
    "EVENTS_SOURCE": "events-source",
    "REPLAYS_SOURCE": "replays-source",
    "PARSE_EVENTS": "parse-events",
    "PARSE_ENDPOINTS": "parse-endpoint-configs",
    "PARSE_REPLAYS": "parse-replays",
    "DEAD_LETTER_SINK": "dead-letter-sink",
    "FAN_OUT": "fan-out",
    "DISPATCH": "dispatch",
    "DISPATCH_CONFIGS": "dispatch-endpoint-configs",
    "SIGNALS_SINK": "endpoint-signals-sink",
    "ARCHIVE_FACTS_SINK": "archive-facts-sink",
}


def test_uids_are_pinned():
    assert {name: getattr(uids, name) for name in PINNED} == PINNED
    assert sorted(uids.ALL) == sorted(PINNED.values())


def test_every_uid_is_assigned_by_build_pipeline_exactly_once():
    source = Path(uids.__file__).with_name("delivery_job.py").read_text()
    used = [
        node.args[0].attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "uid"
        and node.args and isinstance(node.args[0], ast.Attribute)
    ]
    assert sorted(used) == sorted(PINNED)
