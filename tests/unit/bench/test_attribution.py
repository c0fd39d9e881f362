"""The archive bench's attribution of the job's share (bench/attribution.py), on small samples of
each tool's documented output written by hand: py-spy's raw collapsed stacks, `jfr print`'s
execution samples, `jcmd Thread.print`'s thread headers, /proc's per-thread stat."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from bench import attribution as attr
from bench.archive_sizing import Round, archive_cost
from core.settings import REPO_ROOT

SIDE = "pyflink/fn_execution/datastream/embedded/side_output_context.py"
OPS = "pyflink/fn_execution/datastream/embedded/operations.py"
EMB = "pyflink/fn_execution/embedded/operations.py"
CONV = "pyflink/fn_execution/embedded/converters.py"
MAP = "pyflink/datastream/data_stream.py"
APPEND_LINES = frozenset({247, 276, 277})


def F(function: str, file: str, line: int = 1) -> attr.PyFrame:
    return attr.PyFrame(function, file, line)


# ---- py-spy ----------------------------------------------------------------------------------------

# One line per stack (long ones split here only to fit the page). py-spy 0.4 on Python 3.11 names
# functions by their qualified names; a thread pemja attached has no Python name.
PROCESS_FUNC = "extract_process_function.<locals>.process_func"
RAW = "\n".join([
    f"thread (4242);OneInputFunctionOperation.process_element ({EMB}:86);{PROCESS_FUNC} ({OPS}:108);"
    f"SideOutputContext.collect ({SIDE}:34) 7",
    "thread (4242) 30",
    "thread (4243): Dummy-2;BaseEventLoop._run_once (asyncio/base_events.py:1922);select (selectors.py:468) 2",
    "thread (0x7F12AB);encode (core/archive_facts.py:121) 1",
    "<module> (x.py) 4",
]) + "\n"


def test_pyspy_raw_stacks_by_os_thread() -> None:
    stacks = attr.parse_pyspy_raw(RAW)
    assert stacks[attr.PyStack(4242, (F("OneInputFunctionOperation.process_element", EMB, 86),
                                      F(PROCESS_FUNC, OPS, 108), F("SideOutputContext.collect", SIDE, 34)))] == 7
    assert stacks[attr.PyStack(4242, ())] == 30  # the thread running Java: no Python frame
    assert stacks[attr.PyStack(4243, (F("BaseEventLoop._run_once", "asyncio/base_events.py", 1922),
                                      F("select", "selectors.py", 468)))] == 2
    assert stacks[attr.PyStack(None, (F("encode", "core/archive_facts.py", 121),))] == 1  # a pthread id only
    assert stacks[attr.PyStack(None, (F("<module>", "x.py", 0),))] == 4  # recorded without --threads
    assert sum(stacks.values()) == 44


@pytest.mark.parametrize(
    ("frames", "on_facts_task", "part"),
    [
        # building a fact, under the history store's append and the dispatcher's pass
        ((F("_element", "operators/dispatcher.py"), F("_write_created", "operators/history_store.py", 247),
          F("created_fact", "core/archive_facts.py")), False, "facts"),
        ((F("_facts_out", "operators/dispatcher.py"), F("encode", "core/archive_facts.py")), True, "facts"),
        ((F("process_func", OPS), F("_facts_out", "operators/dispatcher.py", 243)), True, "facts"),  # latin-1
        # py-spy 0.4 on Python 3.11 prints qualified names
        ((F("Dispatcher.process_element", "operators/dispatcher.py"),
          F("Dispatcher._facts_out", "operators/dispatcher.py", 243)), True, "facts"),
        ((F("process_func", OPS), F("SideOutputContext.collect", SIDE, 34)), True, "jvm_task"),
        ((F("process_func", OPS), F("SideOutputContext.collect", SIDE, 34),
          F("IdentityDataConverter.to_external", CONV)), True, "side_output"),
        ((F("Other.collect", "x/side_output_context.py"),), True, None),
        # the append itself (the innermost frame on an append line), and not another line
        ((F("_element", "operators/dispatcher.py"), F("_write_created", "operators/history_store.py", 247)),
         False, "facts"),
        ((F("_element", "operators/dispatcher.py"), F("_write_created", "operators/history_store.py", 245)),
         False, None),
        ((F("_write_created", "operators/history_store.py", 247), F("bind", "cassandra/query.py")), False, None),
        # the side output: in Python below collect (its converter, the identity map's call back into
        # Python), in the JVM when collect is innermost
        ((F("process_func", OPS), F("collect", SIDE, 34), F("to_external", CONV)), True, "side_output"),
        ((F("process_func", OPS), F("collect", SIDE, 34), F("process_element", EMB),
          F("process_element_func", OPS), F("process_func", OPS), F("process_element", MAP),
          F("<lambda>", MAP, 898)), True, "side_output"),
        ((F("process_element", EMB), F("process_func", OPS), F("collect", SIDE, 34)), True, "jvm_task"),
        ((F("process_func", OPS), F("collect", SIDE, 34)), False, None),  # parse's dead letters
        ((F("process_func", OPS),), True, None),  # a main output: not the facts'
        ((F("_run_once", "asyncio/base_events.py"),), True, None),
        ((), True, None),
    ],
)
def test_which_samples_are_the_facts(frames: tuple[attr.PyFrame, ...], on_facts_task: bool,
                                     part: str | None) -> None:
    assert attr.classify(frames, on_facts_task, APPEND_LINES) == part


def test_the_fact_appends_are_found_in_the_source() -> None:
    source = (
        "def f(self, d, facts, other):\n"          # 1
        "    if self.facts is not None:\n"         # 2
        "        self.facts.append(\n"             # 3
        "            archive_facts.created(d))\n"  # 4
        "    facts.extend(archive_facts.x(d))\n"   # 5
        "    other.append(d)\n"                    # 6
        "    facts.clear()\n"                      # 7
    )
    assert attr.fact_append_lines(source) == {3, 4, 5}


def test_the_history_stores_fact_appends_are_the_ones_found() -> None:
    source = (REPO_ROOT / "operators/history_store.py").read_text()
    lines = source.splitlines()
    found = attr.fact_append_lines(source)
    starts = {n for n in found if n - 1 not in found}
    # Each a statement that adds to the facts list; the store builds five kinds of fact.
    assert all("facts.append(" in lines[n - 1] or "facts.extend(" in lines[n - 1] for n in starts)
    assert len(starts) >= 5


def test_each_threads_cpu_is_split_by_its_samples() -> None:
    stacks = Counter({
        attr.PyStack(10, (F("encode", "core/archive_facts.py"),)): 10,
        attr.PyStack(10, (F("process_func", OPS), F("collect", SIDE))): 5,
        attr.PyStack(10, (F("process_func", OPS), F("collect", SIDE), F("<lambda>", MAP))): 5,
        attr.PyStack(10, ()): 80,
        attr.PyStack(11, (F("_run_once", "asyncio/base_events.py"),)): 50,
        attr.PyStack(12, (F("encode", "core/archive_facts.py"),)): 3,  # ended before the last reading
        attr.PyStack(None, (F("encode", "core/archive_facts.py"),)): 2,
    })
    names = {10: "dispatch (per endpoint) -> Kafka: facts.x: Writer (1/1)#0", 11: "Dummy-2",
             20: "kafka-producer-network-thread | archive-facts-x", 21: "kafka-producer-network-thread | producer-3"}
    is_facts = attr.facts_task("facts.x")
    tallies = attr.tally(stacks, lambda tid: tid is not None and is_facts(names.get(tid, "")), frozenset())
    assert tallies[10] == attr.ThreadTally(samples=100, facts=10, side_output=5, jvm_task=5)
    cpu = {10: 20.0, 11: 4.0, 20: 0.5, 21: 0.3}
    facts_producer = "kafka-producer-network-thread | archive-facts-x"
    share = attr.attribute(tallies, cpu, names, is_facts, lambda n: n == facts_producer, attr.JfrTally(9, 4, 3, 2, 1),
                           1)
    assert (share.facts_s, share.side_output_s, share.jvm_task_s) == pytest.approx((2.0, 1.0, 1.0))
    assert share.python_s == pytest.approx(3.0) and share.producer_thread_s == 0.5
    assert share.cpu_s == pytest.approx(4.5)
    assert (share.samples, share.facts_samples, share.side_output_samples, share.jvm_task_samples,
            share.unmeasured_samples) == (150, 10, 5, 5, 5)
    assert (share.threads, share.facts_tasks, share.producer_threads, share.pyspy_errors) == (4, 1, 1, 1)
    both = share.plus(share)
    assert both.cpu_s == pytest.approx(9.0) and both.jfr == attr.JfrTally(18, 8, 6, 4, 2)
    line = attr.ms_line(share, 1000)
    assert line.startswith("python=3.0000 jvm_task=1.0000 producer_thread=0.5000 total=4.5000 ")
    assert "samples n/N 20/150 " in line


@pytest.mark.parametrize(
    ("name", "facts"),
    [
        ("dispatch (per endpoint) -> (Kafka: webhooks.endpoint-signals.b: Writer, "
         "Kafka: webhooks.archive.facts.b: Writer) (1/1)#0", True),
        ("dispatch (per endpoint) -> Kafka: webhooks.archive.facts: Writer (1/1)#0", False),  # the stack's job
        ("dispatch (per endpoint) -> Kafka: webhooks.endpoint-signals.b: Writer (1/1)#0", False),  # facts off
    ],
)
def test_the_facts_task_is_the_one_chaining_the_runs_facts_sink(name: str, facts: bool) -> None:
    assert attr.facts_task("webhooks.archive.facts.b")(name) is facts


# ---- JFR and jcmd -----------------------------------------------------------------------------------

TASK = "dispatch (per endpoint) -> Kafka: facts.x: Writer (1/1)#0"
ACCUMULATOR = "org.apache.flink.kafka.shaded.org.apache.kafka.clients.producer.internals.RecordAccumulator"
JFR = f"""\
jdk.ExecutionSample {{
  startTime = 04:51:02.101 (2026-12-07)
  sampledThread = "{TASK}" (javaThreadId = 88)
  state = "STATE_RUNNABLE"
  stackTrace = [
    {ACCUMULATOR}.append(String, int, long, byte[], byte[], Header[], long, long, Cluster) line: 310
    org.apache.flink.connector.kafka.sink.KafkaWriter.write(Object, SinkWriter$Context) line: 203
    org.apache.flink.streaming.runtime.operators.sink.SinkWriterOperator.processElement(StreamRecord) line: 228
    org.apache.flink.streaming.api.operators.TimestampedCollector.collect(OutputTag, StreamRecord) line: 56
    {attr.SIDE_OUTPUT_JAVA}(String, Object) line: 97
    pemja.core.PythonInterpreter.invokeMethod(long, String, String, Object[])
    pemja.core.PythonInterpreter.invokeMethod(String, String, Object[]) line: 170
    ...
  ]
}}

jdk.ExecutionSample {{
  startTime = 04:51:02.111 (2026-12-07)
  sampledThread = "{TASK}" (javaThreadId = 88)
  state = "STATE_RUNNABLE"
  stackTrace = [
    org.apache.flink.streaming.api.utils.PythonTypeUtils$StringDataConverter.toInternal(Object) line: 1
    {attr.SIDE_OUTPUT_JAVA}(String, Object) line: 96
    pemja.core.object.PyIterator.next(long, long)
  ]
}}

jdk.ExecutionSample {{
  startTime = 04:51:02.115 (2026-12-07)
  sampledThread = "{TASK}" (javaThreadId = 88)
  state = "STATE_RUNNABLE"
  stackTrace = [
    pemja.core.object.PyIterator.next(long, long)
    {attr.PYTHON_MAP_JAVA}(StreamRecord) line: 120
    org.apache.flink.streaming.runtime.tasks.ChainingOutput.pushToOperator(StreamRecord) line: 99
    {attr.SIDE_OUTPUT_JAVA}(String, Object) line: 97
    pemja.core.PythonInterpreter.invokeMethod(long, String, String, Object[])
  ]
}}

jdk.ExecutionSample {{
  startTime = 04:51:02.121 (2026-12-07)
  sampledThread = "{TASK}" (javaThreadId = 88)
  state = "STATE_RUNNABLE"
  stackTrace = [
    org.apache.flink.connector.kafka.sink.KafkaWriter.write(Object, SinkWriter$Context) line: 203
    org.apache.flink.streaming.runtime.tasks.StreamTask.invoke() line: 1
  ]
}}

jdk.ExecutionSample {{
  startTime = 04:51:02.131 (2026-12-07)
  sampledThread = "Kafka: webhooks.events.x (1/1)#0" (javaThreadId = 90)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.lang.Thread.run() line: 833
  ]
}}

jdk.ExecutionSample {{
  startTime = 04:51:02.141 (2026-12-07)
  sampledThread = "{TASK}" (javaThreadId = 88)
  state = "STATE_RUNNABLE"
  stackTrace = null
}}
"""


def test_jfr_samples_as_printed() -> None:
    samples = list(attr.parse_jfr_samples(JFR.splitlines(keepends=True)))
    assert [s.thread for s in samples] == [TASK, TASK, TASK, TASK, "Kafka: webhooks.events.x (1/1)#0", TASK]
    first = samples[0].frames
    assert len(first) == 7 and first[1] == "org.apache.flink.connector.kafka.sink.KafkaWriter.write"
    assert first[4] == attr.SIDE_OUTPUT_JAVA and first[-1] == "pemja.core.PythonInterpreter.invokeMethod"
    assert samples[5].frames == ()


def test_jfr_samples_of_the_facts_task_by_where_they_run() -> None:
    samples = attr.parse_jfr_samples(JFR.splitlines())
    # 5 of the facts task; 3 inside Python, all under the side output: 1 in the sink's writer, 1 in
    # the identity Map's Java; the writer's frame outside Python (the signals sink's, or a flush)
    # is not counted.
    assert attr.tally_jfr(samples, attr.facts_task("facts.x")) == attr.JfrTally(5, 3, 3, 1, 1)


def test_thread_cpu_from_proc_stat() -> None:
    stat = ("10755 (dispatch (per e) R 1 2 3 4 5 6 7 8 9 10 1500 230 0 0 20 0 90 0 100 200 300\n")
    assert attr.stat_ticks(stat) == 1730
    assert attr.cpu_between({1: 100, 2: 50, 3: 10}, {1: 350, 2: 50, 4: 20}, 100) == {1: 2.5, 2: 0.0, 4: 0.2}


# ---- the bench's sum ---------------------------------------------------------------------------------

def rnd(mode: str, tm_s: float, job: attr.JobShare | None, jm_s: float = 0.1, cassandra_s: float = 0.3) -> Round:
    return Round(mode, 1000, {"taskmanagers": tm_s, "jobmanager": jm_s, "kafka": 0.2, "cassandra": cassandra_s,
                              "s3proxy": 0.01 if mode == "on" else 0.0}, 3800, {}, 0.0,
                 writer_cpu_s=0.05 if mode == "on" else 0.0, writer_deliveries=1000, job=job)


def test_the_job_share_is_the_attributed_one_when_every_facts_on_round_was_profiled() -> None:
    share = attr.JobShare(facts_s=0.003, side_output_s=0.001, jvm_task_s=0.003, producer_thread_s=0.002)
    cost = archive_cost([rnd("off", 1.0, share)], [rnd("on", 1.1, share)], audit=0.02, broker=0.004)
    assert cost.job_attributed == pytest.approx(0.009)
    assert cost.shares["taskmanagers"] == pytest.approx(0.1)  # on-off, beside it, not summed
    assert cost.total == pytest.approx(0.009 + 0.004 + 0.05 + 0.01 + 0.02)
    unprofiled = archive_cost([rnd("off", 1.0, None)], [rnd("on", 1.1, None)], audit=0.02, broker=0.004)
    assert unprofiled.job_attributed is None
    assert unprofiled.total == pytest.approx(0.1 + 0.004 + 0.05 + 0.01 + 0.02)


def test_the_broker_is_the_replay_and_noise_is_not_subtracted() -> None:
    """Kafka's on-off difference is shown, not summed (the replay is the broker's share); the
    JobManager's and Cassandra's are summed when positive and counted 0 when negative."""
    share = attr.JobShare(facts_s=0.003)
    more = archive_cost([rnd("off", 1.0, share, jm_s=0.1, cassandra_s=0.3)],
                        [rnd("on", 1.0, share, jm_s=0.11, cassandra_s=0.32)], audit=0.0, broker=0.005)
    assert more.total == pytest.approx(0.003 + 0.005 + 0.01 + 0.02 + 0.05 + 0.01)
    less = archive_cost([rnd("off", 1.0, share, jm_s=0.1, cassandra_s=0.3)],
                        [rnd("on", 1.0, share, jm_s=0.09, cassandra_s=0.25)], audit=0.0, broker=0.005)
    assert less.total == pytest.approx(0.003 + 0.005 + 0.05 + 0.01)


def test_thread_names_are_the_kernels_for_every_thread_of_a_process() -> None:
    import threading

    from bench.profilers import thread_names

    names = thread_names(os.getpid())
    assert threading.get_native_id() in names and all(len(n) <= 15 for n in names.values())


def test_with_the_kernels_names_every_producer_network_thread_counts() -> None:
    # /proc's names are 15 characters: the facts producer's thread cannot be told from the
    # signals' one, so both count (an upper bound).
    names = {1: "kafka-producer-", 2: "kafka-producer-", 3: "dispatch (per e"}
    share = attr.attribute({}, {1: 0.5, 2: 0.25, 3: 9.0}, names, lambda n: False,
                           lambda n: n.startswith(attr.PRODUCER_COMM), attr.JfrTally())
    assert share.producer_thread_s == 0.75 and share.producer_threads == 2
