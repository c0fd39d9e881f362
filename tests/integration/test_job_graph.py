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


def _stream_nodes(settings):
    """The nodes of the stream graph execute() would submit (after the Python operators are configured)."""
    from jobs.delivery_job import build_pipeline, make_env

    env = make_env(settings)
    build_pipeline(env, settings)
    return list(env._generate_stream_graph().getStreamNodes().toArray())


def _edges(settings):  # (from operator name, to operator name, buffer timeout ms) of every exchange
    nodes = _stream_nodes(settings)
    names = {n.getId(): n.getOperatorName() for n in nodes}
    return [(names[e.getSourceId()], names[e.getTargetId()], e.getBufferTimeout())
            for n in nodes for e in n.getOutEdges()]


@pytest.mark.parametrize(("env", "event_path_ms", "other_ms"), [
    ({}, 0, 0),  # the defaults: no exchange of the job has an output flusher
    ({"WEBHOOKS_FLINK__BUFFER_TIMEOUT_MS": "3", "WEBHOOKS_FLINK__CONTROL_BUFFER_TIMEOUT_MS": "7"}, 3, 7),
])
def test_each_exchange_gets_the_buffer_timeout_of_its_path(env, event_path_ms, other_ms):
    # A buffer timeout belongs to the operator an edge leaves from. 0 is Flink's "flush after
    # every record": no output flusher thread waking every few ms on an idle TaskManager.
    edges = _edges(settings_with(env))
    event_path = [e for e in edges if e[0] in ("parse events", "dedupe + fan-out")]
    assert ("parse events", "dedupe + fan-out", event_path_ms) in event_path, edges
    assert ("dedupe + fan-out", "dispatch (per endpoint)", event_path_ms) in event_path, edges
    assert {e[2] for e in event_path} == {event_path_ms}, event_path
    rest = [e for e in edges if e not in event_path]
    assert len(rest) > 10 and {e[2] for e in rest} == {other_ms}, rest


def _source_props(settings):  # source name -> the consumer properties of the KafkaSource it runs
    from pyflink.java_gateway import get_gateway

    jvm = get_gateway().jvm

    def field(cls, name):
        f = cls._java_lang_class.getDeclaredField(name)
        f.setAccessible(True)
        return f

    factory_source = field(jvm.org.apache.flink.streaming.api.operators.SourceOperatorFactory, "source")
    props = field(jvm.org.apache.flink.connector.kafka.source.KafkaSource, "props")
    out = {}
    for node in _stream_nodes(settings):
        factory = node.getOperatorFactory()
        if factory is not None and factory.getClass().getSimpleName() == "SourceOperatorFactory":
            source = factory_source.get(factory)
            if source.getClass().getSimpleName() == "KafkaSource":
                out[node.getOperatorName()] = props.get(source)
    return out


def test_the_job_s_sources_keep_kafkas_fetch_wait():
    # The events source: after a broker dies, moved partitions join a consumer's fetch only when
    # the one in flight returns. The replays source: a job restart (a failover, a rescale) waits
    # until every task is cancelled, and a source's cancel waits for its fetch in flight
    # (core/settings.py, docs/operating.md "Recovery timelines").
    settings = settings_with({})
    k = settings.kafka
    sources = _source_props(settings)
    events, replays = sources[f"Source: Kafka: {k.events_topic}"], sources[f"Source: Kafka: {k.replays_topic}"]
    assert events.getProperty("fetch.max.wait.ms") is None
    assert replays.getProperty("fetch.max.wait.ms") is None


def test_side_outputs_reach_their_sinks_with_no_python_in_between():
    # PyFlink's get_side_output adds an identity map, a Python operator: each facts record would
    # cross from the JVM into Python and back before the sink. The side outputs are read in Java
    # (jobs/delivery_job.py: java_side_output), so the facts sink's input is the dispatcher itself
    # and the dead letters' are parsing and fan-out.
    settings = settings_with({"WEBHOOKS_ARCHIVE__STREAM": "true"})
    facts_sink = f"Kafka: {settings.kafka.archive_facts_topic}"
    edges = _edges(settings)
    into_facts = {src for src, dst, _ in edges if dst == f"{facts_sink}: Writer"}
    assert into_facts == {"dispatch (per endpoint)"}, edges
    into_dlq = {src for src, dst, _ in edges if dst == f"Kafka: {settings.kafka.dlq_topic}: Writer"}
    assert into_dlq == {"parse events", "dedupe + fan-out"}, edges
    assert not [n for n in _stream_nodes(settings) if n.getOperatorName() == "Map"]
