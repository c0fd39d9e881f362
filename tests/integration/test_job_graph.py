"""The job graph build_pipeline makes, read from Flink's execution plan (a local JVM, no cluster):
every operator that is not pinned to one subtask runs at the configured parallelism."""

from __future__ import annotations

import json

import pytest

from stack.isolation import settings_with

pytestmark = pytest.mark.integration

# Pinned to one subtask on purpose (jobs/delivery_job.py): the endpoints topic's reader and the
# planner's normalizer, and the two operators that keep one endpoint's configs in order.
ONE_SUBTASK = ("TableSourceScan", "ChangelogNormalize", "ConstraintEnforcer", "TableToDataStream",
               "parse endpoint configs", "endpoint configs for dispatch")


def test_every_operator_not_pinned_to_one_subtask_runs_at_the_configured_parallelism():
    from jobs.delivery_job import build_pipeline, make_env

    settings = settings_with({"WEBHOOKS_FLINK__PARALLELISM": "3"})
    env = make_env(settings)
    build_pipeline(env, settings)
    nodes = {n["contents"]: n["parallelism"] for n in json.loads(env.get_execution_plan())["nodes"]}
    pinned = {c: p for c, p in nodes.items() if any(name in c for name in ONE_SUBTASK)}
    assert pinned and set(pinned.values()) == {1}, pinned
    rest = {c: p for c, p in nodes.items() if c not in pinned}
    # The table planner sets the environment's default parallelism to its own (1) when it
    # translates the endpoints table: fan-out and dispatch fell to one subtask at any setting.
    assert {c: p for c, p in rest.items() if p != 3} == {}
    assert any("dispatch" in c for c in rest) and any("fan-out" in c for c in rest)
