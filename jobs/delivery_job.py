"""The delivery job: CDC events -> parse -> dedupe + fan-out -> per-endpoint dispatch -> history.

`build_pipeline(env, settings)` assembles the whole job; `main()` is what `flink run -py` calls.
Settings come from the environment of the submitting process (WEBHOOKS_*) and travel with the
operators, so the TaskManagers need no configuration of their own.
"""

from __future__ import annotations

import logging
from typing import Any

from pyflink.common import Configuration, WatermarkStrategy
from pyflink.common.serialization import SimpleStringSchema
from pyflink.common.typeinfo import TypeInformation, Types
from pyflink.datastream import DataStream, KeyedStream, OutputTag, StreamExecutionEnvironment
from pyflink.datastream.checkpointing_mode import CheckpointingMode
from pyflink.datastream.connectors.base import DeliveryGuarantee
from pyflink.datastream.connectors.kafka import (
    KafkaOffsetResetStrategy,
    KafkaOffsetsInitializer,
    KafkaRecordSerializationSchema,
    KafkaSink,
    KafkaSource,
)
from pyflink.java_gateway import get_gateway
from pyflink.table import StreamTableEnvironment

from core.settings import Settings, for_taskmanagers, load_settings_or_exit
from jobs import uids
from operators.dispatch_input import DISPATCH_INPUT
from operators.dispatcher import ARCHIVE_FACTS, Dispatcher, key_config
from operators.endpoint_configs import ENDPOINT_CONFIGS, ParseEndpointRecord
from operators.fanout import FanOut
from operators.keyed import KEYED_RECORD
from operators.parse_events import DEAD_LETTERS, ParseEvents
from operators.replays import ParseReplays

# Bytes are carried as ISO-8859-1 strings: a lossless 1:1 mapping of bytes to chars, so the
# dead-letter topic gets the original bytes back even when they are not UTF-8.
RAW = SimpleStringSchema("ISO-8859-1")


def _source(settings: Settings, topic: str, group_suffix: str, from_earliest: bool) -> KafkaSource:
    """Every source keeps Kafka's fetch wait (500 ms): after a broker dies, moved partitions join
    a consumer's fetch only when the one in flight returns, and a restart of the job waits for
    each source's fetch in flight as it cancels the tasks (core/settings.py)."""
    k = settings.kafka
    start = (KafkaOffsetsInitializer.earliest() if from_earliest else
             KafkaOffsetsInitializer.committed_offsets(KafkaOffsetResetStrategy.EARLIEST))
    builder = (KafkaSource.builder()
               .set_bootstrap_servers(k.bootstrap_servers)
               .set_topics(topic)
               .set_group_id(f"{k.consumer_group}.{group_suffix}")
               .set_starting_offsets(start)
               .set_value_only_deserializer(RAW)
               .set_property("commit.offsets.on.checkpoint", "true")
               .set_property("partition.discovery.interval.ms", "60000"))
    for key, value in k.java_failover().items():  # the platform's reconnect back-off (core/settings.py)
        builder = builder.set_property(key, value)
    return builder.build()


def _endpoint_topic(env: StreamExecutionEnvironment, settings: Settings) -> DataStream:
    """The compacted endpoints topic as a changelog: upsert-kafka reads it from the start, keeps the
    latest value per key, and turns tombstones into DELETE rows (PyFlink's DataStream Kafka source
    cannot see null values). Its uids come from the table planner (`table.exec.uid.generation`)."""
    k = settings.kafka
    failover = "".join(f",\n            'properties.{key}' = '{value}'" for key, value in k.java_failover().items())
    t_env = StreamTableEnvironment.create(env)
    t_env.get_config().set("table.exec.uid.generation", "ALWAYS")
    # One reader, one normalizer: at parallelism > 1 the planner would hash configs and clock
    # ticks (different keys) through different subtasks, and fan-out could read a tick before a
    # config published ahead of it. The topic is one small partition; one subtask reads it.
    t_env.get_config().set("table.exec.resource.default-parallelism", "1")
    t_env.execute_sql(f"""
        CREATE TEMPORARY TABLE endpoint_topic (
            endpoint_id STRING,
            config STRING,
            PRIMARY KEY (endpoint_id) NOT ENFORCED
        ) WITH (
            'connector' = 'upsert-kafka',
            'topic' = '{k.endpoints_topic}',
            'properties.bootstrap.servers' = '{k.bootstrap_servers}',
            'properties.group.id' = '{k.consumer_group}.endpoints',
            'key.format' = 'raw',
            'value.format' = 'raw',
            'value.fields-include' = 'EXCEPT_KEY'{failover}
        )""")
    configs = t_env.to_changelog_stream(t_env.from_path("endpoint_topic"))
    # Translating the table leaves the planner's parallelism (1) as the environment's default: every
    # operator added after it (fan-out, dispatch) ran on one subtask whatever flink.parallelism said,
    # and the planner's own operators get their one subtask only from that default. So pin those
    # and give the environment the job's parallelism back.
    _one_subtask(configs._j_data_stream.getTransformation())
    env.set_parallelism(settings.flink.parallelism)
    return configs


def _one_subtask(j_transformation: Any) -> None:
    """A (Java) transformation and everything upstream of it at parallelism 1."""
    j_transformation.setParallelism(1)
    for j_input in j_transformation.getInputs():
        _one_subtask(j_input)


def _string_sink(settings: Settings, topic: str, properties: dict[str, str] | None = None) -> KafkaSink:
    # At-least-once: flushed on every checkpoint, so nothing acknowledged by a checkpoint is lost.
    builder = (KafkaSink.builder()
               .set_bootstrap_servers(settings.kafka.bootstrap_servers)
               .set_record_serializer(KafkaRecordSerializationSchema.builder()
                                      .set_topic(topic).set_value_serialization_schema(RAW).build())
               .set_delivery_guarantee(DeliveryGuarantee.AT_LEAST_ONCE)
               # What every producer of the platform uses (the Kafka client's own default, stated
               # here): a write is acknowledged once min.insync.replicas replicas have it, and the
               # producer's retries neither duplicate nor reorder.
               .set_property("acks", "all")
               .set_property("enable.idempotence", "true"))
    for key, value in {**settings.kafka.java_failover(), **(properties or {})}.items():
        builder = builder.set_property(key, value)
    return builder.build()


# The archive facts: nobody waits for them (the writer rolls every archive.roll_s), so they
# travel in few large, compressed produce requests -- the broker's cost is per request and byte,
# and a batch the producer compressed is stored as it is.
ARCHIVE_FACTS_PRODUCER = {"linger.ms": "200", "batch.size": str(1 << 20)}


def keyed_by_first_field(stream: DataStream, key_type: TypeInformation, value_type: TypeInformation) -> KeyedStream:
    """Key a stream of keyed records (operators/keyed.py) by their first field, in Java.

    This is what ``key_by`` does after its Python operator: same selector, same key type, so keyed
    state and savepoints are unchanged (a savepoint's empty state of a dropped operator is skipped
    on restore). Used for fan-out's input (the parse output) and the dispatcher's (the union of
    fan-out, replays and configs, after which ``key_by``'s operator could not even chain). It also
    lets the event path's buffer timeout sit on the operator the exchange leaves from.
    """
    j_keyed = stream._j_data_stream.keyBy(get_gateway().jvm.KeyByKeySelector(),
                                          Types.ROW([key_type]).get_java_type_info())
    return KeyedStream(j_keyed, value_type, stream)


def java_side_output(stream: DataStream, tag: OutputTag) -> DataStream:
    """A side output read in Java, for a sink. PyFlink's ``get_side_output`` follows it with an
    identity map, a Python operator of its own: each record would cross into Python and back, and
    the map would not chain with the operator that emitted it. A ``Types.STRING()`` tag's records
    are Java strings already, all a string sink needs."""
    return DataStream(stream._j_data_stream.getSideOutput(tag.get_java_output_tag()))


def build_pipeline(env: StreamExecutionEnvironment, settings: Settings) -> None:
    k = settings.kafka
    no_wm = WatermarkStrategy.no_watermarks()

    events = (env.from_source(_source(settings, k.events_topic, "events", False), no_wm, "events")
              .uid(uids.EVENTS_SOURCE).name("Kafka: " + k.events_topic))
    # Parallelism 1 from the topic to the broadcast, so fan-out reads configs and clock ticks in
    # the topic's order at any job parallelism (one upstream channel per fan-out subtask).
    endpoint_records = (_endpoint_topic(env, settings)
                        .flat_map(ParseEndpointRecord(), Types.PICKLED_BYTE_ARRAY())
                        .set_parallelism(1)
                        .uid(uids.PARSE_ENDPOINTS).name("parse endpoint configs"))
    replays = (env.from_source(_source(settings, k.replays_topic, "replays", False), no_wm, "replays")
               .uid(uids.REPLAYS_SOURCE).name("Kafka: " + k.replays_topic)
               .flat_map(ParseReplays(), DISPATCH_INPUT)
               .uid(uids.PARSE_REPLAYS).name("parse replay requests"))

    parsed = (events.process(ParseEvents(for_taskmanagers(settings), k.events_topic), KEYED_RECORD)
              .set_buffer_timeout(settings.flink.buffer_timeout_ms)  # the event path (make_env)
              .uid(uids.PARSE_EVENTS).name("parse events"))
    deliveries = (keyed_by_first_field(parsed, Types.STRING(), Types.PICKLED_BYTE_ARRAY())
                  .connect(endpoint_records.broadcast(ENDPOINT_CONFIGS))
                  .process(FanOut(settings.flink.dedupe_ttl_s, settings.dispatch.retry_deadline_s,
                                  settings.control_plane.config_clock_interval_ms,
                                  settings.control_plane.config_clock_skew_ms,
                                  settings.control_plane.config_clock_stale_after_ms, k.events_topic,
                                  settings.tracing if settings.tracing.enabled else None),
                           DISPATCH_INPUT)
                  .set_buffer_timeout(settings.flink.buffer_timeout_ms)
                  .uid(uids.FAN_OUT).name("dedupe + fan-out"))
    # Refused records: unreadable or untrusted ones from parsing, event-id conflicts from fan-out.
    (java_side_output(parsed, DEAD_LETTERS).union(java_side_output(deliveries, DEAD_LETTERS))
     .sink_to(_string_sink(settings, k.dlq_topic)).uid(uids.DEAD_LETTER_SINK).name("Kafka: " + k.dlq_topic))

    # Configs reach the dispatcher keyed by endpoint, in its one keyed input: a config change
    # drives its endpoint at once (a re-enable drains the held backlog, a new URL is used).
    keyed_configs = (endpoint_records.flat_map(key_config, DISPATCH_INPUT)
                     .set_parallelism(1)  # chained: one endpoint's configs stay in order
                     .uid(uids.DISPATCH_CONFIGS).name("endpoint configs for dispatch"))
    to_dispatch = deliveries.union(replays, keyed_configs)
    signals = (keyed_by_first_field(to_dispatch, Types.STRING(), Types.PICKLED_BYTE_ARRAY())
               .process(Dispatcher(for_taskmanagers(settings)), Types.STRING())
               .uid(uids.DISPATCH).name("dispatch (per endpoint)"))
    signals.sink_to(_string_sink(settings, k.signals_topic)).uid(uids.SIGNALS_SINK).name("Kafka: " + k.signals_topic)
    if settings.archive.stream:
        # The history's facts for the archive writer (control_plane/archive/writer.py), flushed on
        # every checkpoint like the signals: what a checkpoint acknowledges is in Kafka.
        (java_side_output(signals, ARCHIVE_FACTS)
         .sink_to(_string_sink(settings, k.archive_facts_topic, ARCHIVE_FACTS_PRODUCER))
         .uid(uids.ARCHIVE_FACTS_SINK).name("Kafka: " + k.archive_facts_topic))


def make_env(settings: Settings) -> StreamExecutionEnvironment:
    conf = Configuration()
    conf.set_string("python.execution-mode", settings.flink.python_execution_mode)
    conf.set_string("pipeline.name", settings.flink.job_name)
    if settings.flink.checkpoint_dir:
        conf.set_string("execution.checkpointing.dir", settings.flink.checkpoint_dir)
    if settings.flink.pipeline_jars:
        conf.set_string("pipeline.jars", ";".join(settings.flink.pipeline_jars))
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(settings.flink.parallelism)
    if settings.flink.max_parallelism is not None:
        env.set_max_parallelism(settings.flink.max_parallelism)
    # Every exchange but the event path's two (set on their streams in build_pipeline): configs,
    # ticks, replays, dead letters, and the table planner's own.
    env.set_buffer_timeout(settings.flink.control_buffer_timeout_ms)
    env.enable_checkpointing(settings.flink.checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
    return env


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    settings = load_settings_or_exit("delivery-job")
    env = make_env(settings)
    build_pipeline(env, settings)
    env.execute(settings.flink.job_name)


if __name__ == "__main__":
    main()
