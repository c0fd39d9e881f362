"""A rescale in place (stack/flink_jobs.rescale_in_place) keeps the delivery job's one-subtask
operators at one subtask by their names (stack.flink_jobs.ONE_SUBTASK). These must be the names
build_pipeline gives the operators it pins with set_parallelism(1): a renamed one would be
rescaled with the rest, and fan-out could then read configs and clock ticks out of order."""

from __future__ import annotations

import ast
from pathlib import Path

from jobs import uids
from stack.flink_jobs import ONE_SUBTASK


def _pinned_names() -> set[str]:
    """Names given by `.name("...")` to a chain that says `.set_parallelism(1)` before it."""
    source = Path(uids.__file__).with_name("delivery_job.py").read_text()
    pinned = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "name"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            continue
        link: ast.expr = node.func.value
        while isinstance(link, ast.Call) and isinstance(link.func, ast.Attribute):
            if (link.func.attr == "set_parallelism" and link.args and isinstance(link.args[0], ast.Constant)
                    and link.args[0].value == 1):
                pinned.add(node.args[0].value)
                break
            link = link.func.value
    return pinned


def test_the_names_a_rescale_keeps_at_one_subtask_are_those_the_job_pins():
    assert _pinned_names() == set(ONE_SUBTASK)
