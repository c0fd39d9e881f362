"""Rescaling a running job in place (stack/flink_jobs.py): which vertices keep one subtask, and the
resource requirements sent to the adaptive scheduler. Pure: vertex names, edges and requirements
as the REST API gives them, no cluster."""

from __future__ import annotations

import pytest

from stack import flink_jobs
from stack.flink_jobs import ONE_SUBTASK, one_subtask_vertices, rescaled_requirements

# The delivery job's shape (jobs/delivery_job.py) as /jobs/:jobid and its plan show it: the
# endpoints topic read by a table source and normalized on one subtask, then parsed and keyed for
# dispatch on one subtask; events and replays at the job's parallelism.
NAMES = {
    "src-endpoints": "Source: endpoint_topic[1]",
    "normalize": "ChangelogNormalize[2] -> TableToDataSteam[3] -> parse endpoint configs -> "
                 "endpoint configs for dispatch",
    "src-events": "Source: Kafka: webhooks.events -> parse events",
    "src-replays": "Source: Kafka: webhooks.replays -> parse replay requests",
    "fan-out": "dedupe + fan-out",
    "dispatch": "dispatch (per endpoint) -> Kafka: webhooks.endpoint-signals: Writer",
    "dlq": "Kafka: webhooks.events.dlq: Writer",
}
INPUTS = {
    "normalize": ["src-endpoints"],
    "fan-out": ["src-events", "normalize"],
    "dispatch": ["fan-out", "src-replays", "normalize"],
    "dlq": ["src-events", "fan-out"],
}


def _req(lower: int, upper: int) -> dict[str, dict[str, int]]:
    return {"parallelism": {"lowerBound": lower, "upperBound": upper}}


def test_the_endpoints_reader_and_everything_upstream_of_it_keep_one_subtask():
    assert one_subtask_vertices(NAMES, INPUTS) == {"src-endpoints", "normalize"}


def test_a_marker_on_a_vertex_of_its_own_pins_it_and_its_inputs_only():
    names = {"a": "Source: endpoint_topic[1]", "b": "parse endpoint configs", "c": "endpoint configs for dispatch",
             "d": "dispatch (per endpoint)"}
    inputs = {"b": ["a"], "c": ["b"], "d": ["c"]}
    assert one_subtask_vertices(names, inputs) == {"a", "b", "c"}


def test_no_marker_pins_nothing():
    assert one_subtask_vertices({"a": "x", "b": "y"}, {"b": ["a"]}) == set()


def test_the_markers_are_the_jobs_two_one_subtask_operators():
    assert ONE_SUBTASK == ("parse endpoint configs", "endpoint configs for dispatch")


@pytest.mark.parametrize("target", [1, 4, 256])
def test_every_other_vertex_goes_to_the_target_with_lower_bound_one(target):
    current = {v: _req(1, 1 if v in ("src-endpoints", "normalize") else 2) for v in NAMES}
    body = rescaled_requirements(current, {"src-endpoints", "normalize"}, target, {v: 256 for v in NAMES})
    assert body == {v: _req(1, 1) if v in ("src-endpoints", "normalize") else _req(1, target) for v in NAMES}


def test_every_vertex_of_the_current_requirements_is_in_the_body():
    current = {"a": _req(1, 2), "b": _req(1, 1)}
    assert set(rescaled_requirements(current, {"b"}, 3)) == {"a", "b"}


def test_a_pinned_vertex_keeps_its_bounds_as_they_were():
    assert rescaled_requirements({"p": _req(1, 1)}, {"p"}, 8) == {"p": _req(1, 1)}


def test_beyond_a_vertex_max_parallelism_is_refused():
    with pytest.raises(ValueError, match="exceeds the max parallelism"):
        rescaled_requirements({"a": _req(1, 2)}, set(), 200, {"a": 128})


def test_a_pinned_vertex_with_a_small_max_parallelism_does_not_refuse():
    assert rescaled_requirements({"a": _req(1, 2), "p": _req(1, 1)}, {"p"}, 4, {"a": 128, "p": 1})["a"] == _req(1, 4)


@pytest.mark.parametrize("target", [0, -1])
def test_parallelism_below_one_is_refused(target):
    with pytest.raises(ValueError, match="at least 1"):
        rescaled_requirements({"a": _req(1, 2)}, set(), target)


@pytest.mark.parametrize(("config", "expected"), [
    ([{"key": "jobmanager.scheduler", "value": "adaptive"}], "adaptive"),
    ([{"key": "jobmanager.scheduler", "value": "Adaptive"}], "adaptive"),
    ([{"key": "jobmanager.scheduler", "value": "default"}], "default"),
    ([{"key": "rest.port", "value": "8081"}], "default"),  # unset: Flink's own
])
def test_the_scheduler_is_read_from_the_jobmanagers_configuration(monkeypatch, config, expected):
    monkeypatch.setattr(flink_jobs, "rest", lambda path, **_: config if path == "/jobmanager/config" else None)
    assert flink_jobs.scheduler() == expected


def test_a_rescale_in_place_on_the_default_scheduler_says_what_to_set(monkeypatch, capsys):
    monkeypatch.setattr(flink_jobs, "rest", lambda path, **_: [{"key": "jobmanager.scheduler", "value": "default"}])
    assert flink_jobs.main(["rescale", "0" * 32, "4"]) == 1
    assert "WEBHOOKS_FLINK_SCHEDULER=adaptive" in capsys.readouterr().err


@pytest.mark.parametrize(("stopped_at", "seconds", "text"), [
    (100.0, 2.5, "2.5 s"),
    (None, None, "not seen (a pause under the REST API's 3 s cache)"),  # no poll saw it: no figure, not 0
])
def test_the_pause_is_what_the_polls_saw_and_none_when_they_saw_none(stopped_at, seconds, text):
    r = flink_jobs.InPlaceRescale(requested_at=90.0, stopped_at=stopped_at, running_at=102.5)
    assert r.not_running_s == seconds
    assert r.not_running_text() == text
