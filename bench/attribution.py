"""The delivery job's archive work, attributed from profiles of the job that does it: what
`make bench-archive` counts as the job's share, instead of a difference between two jobs.

The job runs its Python inside the TaskManager's JVM (``python.execution-mode: thread``, with
pemja's one interpreter): every task thread of a Python operator is also a thread of that
interpreter. Three readings over a measured phase, each taken by a tool outside the job
(bench/profilers.py runs them); this module only reads their output and does the arithmetic.

* **py-spy** (``record --threads --format raw``, idle samples left out) samples every thread of
  the interpreter whenever the OS has it running: with Python frames on its stack, or with none
  while the thread runs Java between its calls into Python. So on each such thread, facts
  samples / all samples x the thread's CPU over the phase (/proc/<tm>/task/<tid>/stat) is the
  facts' CPU on that thread, and the threads' sum is ``python`` + ``jvm_task`` below.
* **JDK Flight Recorder** (``jdk.ExecutionSample``, read with ``jfr print``) on the task thread
  that chains the facts sink: what its Java does under the side output (the pemja call, the
  sink's writer, the Kafka producer's append). JFR samples a thread only while it runs Java --
  not while it runs Python or native code -- so its counts say *what* the crossing's JVM side
  is; they are not a share of the thread's CPU and are printed, not multiplied.
* the producers' **network threads** (``kafka-producer-network-thread | <client.id>``, which
  the kernel's 15-character names do not tell apart): all their CPU is counted as the facts', an
  upper bound.

What counts as the facts' (the frames, as py-spy names them: function and file):

* ``python``, the facts' own (``facts``): any frame of core/archive_facts.py (building each
  fact, encoding a record); the dispatcher's ``_facts_out`` (operators/dispatcher.py: one record
  per call, its latin-1 text); operators/history_store.py as the innermost frame on a line that
  appends to the facts list (found from its source, ``fact_append_lines``).
* ``python``, the side output's (``side_output``): Python running nested under PyFlink's
  ``SideOutputContext.collect`` (pyflink/fn_execution/datastream/embedded/side_output_context.py,
  called by ``process_func`` in datastream/embedded/operations.py for each ``(OutputTag, value)``
  result). That is the value's converter (embedded/converters.py) and, mostly, the identity map
  PyFlink's ``get_side_output`` adds (``ds.map(lambda i: i)``, pyflink/datastream/data_stream.py:
  a Python operator chained after the side output, "Map" in the task's name), which the JVM calls
  back into for each record before the sink.
* ``jvm_task``: samples whose innermost Python frame is that ``collect`` itself. The thread is
  then in its call of the Java operator's ``SideOutputContext.collectSideOutputById`` through
  pemja, which runs synchronously: the Python string turned into a Java one,
  ``TimestampedCollector.collect``, the chained Map's Java (the string back into Python and its
  result out again), then the chained ``SinkWriterOperator.processElement`` -> ``KafkaWriter.write``
  (serialising with ISO-8859-1) -> ``KafkaProducer.send`` (appending to a batch).
* ``producer_thread``: the facts producer's network thread, all of it.

The side output's parts count only on the task thread whose name holds the facts sink's
(``facts_task``): a side output elsewhere (dead letters of parse and fan-out) is not the archive's.

Not attributed (and so not in the job's share): the facts sink's flush at a checkpoint (Java on
the task thread outside Python, indistinguishable by stack from the signals sink's flush, and
mostly a wait); garbage collection and JIT compilation of the facts' Java objects; the broker's
work (Kafka's own process, counted apart).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

# ---- what is matched ----------------------------------------------------------------------------

# (file, function; None: any function of the file) of the Python frames that build and encode
# the facts. Files are matched by their end: py-spy shortens a path to its packages
# ("core/archive_facts.py"), and the job's files live in a directory Flink unpacked them to.
# Functions by their qualified name's last part: py-spy 0.4 prints the qualified name on Python
# 3.11 ("Dispatcher._facts_out"), older ones the bare one.
FACTS_CODE: tuple[tuple[str, str | None], ...] = (
    ("core/archive_facts.py", None),
    ("operators/dispatcher.py", "Dispatcher._facts_out"),
)
HISTORY_STORE = "operators/history_store.py"
# PyFlink 2.2's side output in thread mode: the Python half of the crossing to the JVM.
SIDE_OUTPUT_COLLECT = ("pyflink/fn_execution/datastream/embedded/side_output_context.py", "SideOutputContext.collect")

# The JVM's side of that call, as JFR names methods (package.Class.method).
SIDE_OUTPUT_JAVA = ("org.apache.flink.streaming.api.operators.python.embedded."
                    "AbstractEmbeddedDataStreamPythonFunctionOperator$SideOutputContext.collectSideOutputById")
SINK_WRITER_JAVA = ("org.apache.flink.streaming.runtime.operators.sink.SinkWriterOperator.processElement",
                    "org.apache.flink.connector.kafka.sink.KafkaWriter.write")
# The chained identity Map's Java (the Python operator get_side_output adds), as JFR names it: the
# declaring class of processElement.
PYTHON_MAP_JAVA = ("org.apache.flink.streaming.api.operators.python.embedded."
                   "AbstractOneInputEmbeddedPythonFunctionOperator.processElement")
# A Java frame of pemja below a sample: that Java runs inside a call into Python.
PEMJA_JAVA = "pemja.core."

# The Kafka producers' network threads as the kernel names them (/proc/<pid>/task/<tid>/comm: the
# JVM gives each native thread the first 15 characters of its Java name,
# "kafka-producer-network-thread | <client.id>"): the facts sink's and the others' alike.
PRODUCER_COMM = "kafka-producer-"

Part = Literal["facts", "side_output", "jvm_task"]


def facts_task(facts_topic: str) -> Callable[[str], bool]:
    """Whether a Java thread name is that of a task chaining the facts sink: Flink names a task
    thread after its chain of operators, and the sink is named "Kafka: <topic>" (jobs/delivery_job.py).
    The colon keeps a run's own topic (``<topic>.bench-x``) apart from the stack's."""
    marker = f"Kafka: {facts_topic}:"
    return lambda name: marker in name


def fact_append_lines(source: str) -> frozenset[int]:
    """The lines of ``source`` (operators/history_store.py) that add to the facts list: calls of
    ``append``/``extend`` on a name or attribute called ``facts``, all their lines."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("append", "extend") and _names_facts(node.func.value)):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return frozenset(lines)


def _names_facts(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "facts") or (
        isinstance(node, ast.Attribute) and node.attr == "facts")


# ---- py-spy -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PyFrame:
    function: str
    file: str  # as py-spy printed it ("" for none)
    line: int  # 0 when py-spy gave none


@dataclass(frozen=True)
class PyStack:
    tid: int | None  # the OS thread id (py-spy's --threads reads it on Python >= 3.11); None: unknown
    frames: tuple[PyFrame, ...]  # outermost first, as py-spy writes them; empty: no Python running


_THREAD_FRAME = re.compile(r"thread \((?P<id>0x[0-9A-Fa-f]+|\d+)\)(?:: .*)?")
_FRAME = re.compile(r"(?P<function>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)")


def parse_pyspy_raw(text: str) -> Counter[PyStack]:
    """py-spy's ``--format raw`` (collapsed stacks, "frame;frame;... count", each frame
    "function (file:line)"), recorded with ``--threads``: the first frame is then
    "thread (<os tid>)" or "thread (<os tid>): <Python thread name>" (a hex pthread id when py-spy
    could not read the OS one)."""
    out: Counter[PyStack] = Counter()
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        names = stack.split(";")
        tid: int | None = None
        head = _THREAD_FRAME.fullmatch(names[0])
        if head:
            names = names[1:]
            ident = head["id"]
            tid = None if ident.startswith("0x") else int(ident)
        out[PyStack(tid, tuple(_py_frame(n) for n in names if n))] += int(count)
    return out


def _py_frame(text: str) -> PyFrame:
    m = _FRAME.fullmatch(text)
    if m is None:
        return PyFrame(text, "", 0)
    return PyFrame(m["function"], m["file"], int(m["line"] or 0))


def _is(frame: PyFrame, where: tuple[str, str | None]) -> bool:
    file, function = where
    return frame.file.endswith(file) and (
        function is None or frame.function.rsplit(".", 1)[-1] == function.rsplit(".", 1)[-1])


def classify(frames: tuple[PyFrame, ...], on_facts_task: bool, append_lines: frozenset[int]) -> Part | None:
    """Which part of the facts' work one py-spy sample is, if any (the module's docstring)."""
    if not frames:
        return None
    if on_facts_task:
        for i, f in enumerate(frames):
            if _is(f, SIDE_OUTPUT_COLLECT):
                return "jvm_task" if i == len(frames) - 1 else "side_output"
    if any(_is(f, code) for f in frames for code in FACTS_CODE):
        return "facts"
    leaf = frames[-1]
    if leaf.file.endswith(HISTORY_STORE) and leaf.line in append_lines:
        return "facts"
    return None


@dataclass
class ThreadTally:
    samples: int = 0
    facts: int = 0
    side_output: int = 0
    jvm_task: int = 0


def tally(stacks: Mapping[PyStack, int], is_facts_task: Callable[[int | None], bool],
          append_lines: frozenset[int]) -> dict[int | None, ThreadTally]:
    """py-spy's samples per OS thread: all of them, and the facts' by part."""
    out: dict[int | None, ThreadTally] = {}
    for stack, n in stacks.items():
        t = out.setdefault(stack.tid, ThreadTally())
        t.samples += n
        part = classify(stack.frames, is_facts_task(stack.tid), append_lines)
        if part is not None:
            setattr(t, part, getattr(t, part) + n)
    return out


# ---- JFR and the thread dump --------------------------------------------------------------------

@dataclass(frozen=True)
class JfrSample:
    thread: str  # the Java thread's name
    frames: tuple[str, ...]  # "package.Class.method", innermost first, as JFR lists them


def parse_jfr_samples(lines: Iterable[str]) -> Iterator[JfrSample]:
    """``jfr print --events jdk.ExecutionSample --stack-depth N``, read as it streams:

        jdk.ExecutionSample {
          startTime = 04:51:02.101 (2026-12-07)
          sampledThread = "name" (javaThreadId = 42)
          state = "STATE_RUNNABLE"
          stackTrace = [
            package.Class.method(ArgType, ...) line: 12
            ...
          ]
        }

    A stack deeper than N ends with a "..." line (its outermost frames left out)."""
    thread: str | None = None
    frames: list[str] = []
    in_stack = in_event = False
    for raw in lines:
        line = raw.strip()
        if not in_event:
            if line == "jdk.ExecutionSample {":
                in_event, thread, frames = True, None, []
            continue
        if in_stack:
            if line == "]":
                in_stack = False
            elif line and line != "...":
                frames.append(line.split("(", 1)[0])
        elif line.startswith("sampledThread = "):
            value = line[len("sampledThread = "):]
            thread = value[value.find('"') + 1:value.rfind('"')] if value.count('"') >= 2 else value
        elif line.startswith("stackTrace = ["):
            in_stack = not line.endswith("]")  # "stackTrace = null" or "[]": none
        elif line == "}":
            in_event = False
            yield JfrSample(thread or "", tuple(frames))


@dataclass
class JfrTally:
    """JFR's execution samples of the task threads chaining the facts sink."""
    samples: int = 0
    in_python: int = 0  # Java running inside a call into Python (a pemja frame below it)
    side_output: int = 0  # of those, under the side output's collectSideOutputById
    sink_writer: int = 0  # of those, in the facts sink's writer (SinkWriterOperator / KafkaWriter)
    python_map: int = 0  # of those, in the chained identity Map's Java, not in the writer

    def plus(self, o: JfrTally) -> JfrTally:
        return JfrTally(self.samples + o.samples, self.in_python + o.in_python, self.side_output + o.side_output,
                        self.sink_writer + o.sink_writer, self.python_map + o.python_map)


def tally_jfr(samples: Iterable[JfrSample], is_facts_task: Callable[[str], bool]) -> JfrTally:
    t = JfrTally()
    for s in samples:
        if not is_facts_task(s.thread):
            continue
        t.samples += 1
        if not any(f.startswith(PEMJA_JAVA) for f in s.frames):
            continue
        t.in_python += 1
        if SIDE_OUTPUT_JAVA in s.frames:
            t.side_output += 1
            # Innermost first: the writer's and the Map's frames sit above (before) the side output's.
            above = s.frames[:s.frames.index(SIDE_OUTPUT_JAVA)]
            if any(f in SINK_WRITER_JAVA for f in above):
                t.sink_writer += 1
            elif PYTHON_MAP_JAVA in above:
                t.python_map += 1
    return t


# ---- CPU and the shares -------------------------------------------------------------------------

def stat_ticks(stat: str) -> int:
    """utime + stime, in clock ticks, of a /proc/<pid>/task/<tid>/stat line (the name in
    parentheses may hold spaces: fields are counted after its closing one)."""
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_between(before: Mapping[int, int], after: Mapping[int, int], ticks_per_s: int) -> dict[int, float]:
    """CPU seconds of each thread between two readings of ticks by OS thread id; a thread that
    started in between counts from zero, one that ended is missing (its ticks went with it)."""
    return {tid: (t - before.get(tid, 0)) / ticks_per_s for tid, t in after.items()}


@dataclass(frozen=True)
class JobShare:
    """The facts' CPU seconds in one TaskManager (or summed over several) over a phase."""
    facts_s: float = 0.0  # python: the facts' own code
    side_output_s: float = 0.0  # python: PyFlink's side output and its identity map
    jvm_task_s: float = 0.0
    producer_thread_s: float = 0.0
    samples: int = 0  # py-spy's, on threads whose CPU was read
    facts_samples: int = 0
    side_output_samples: int = 0
    jvm_task_samples: int = 0
    unmeasured_samples: int = 0  # on threads with no CPU reading (ended, or no OS id): left out
    threads: int = 0  # interpreter threads sampled
    facts_tasks: int = 0  # task threads found chaining the facts sink
    producer_threads: int = 0
    pyspy_errors: int = 0
    jfr: JfrTally = field(default_factory=JfrTally)

    @property
    def python_s(self) -> float:
        return self.facts_s + self.side_output_s

    @property
    def cpu_s(self) -> float:
        return self.python_s + self.jvm_task_s + self.producer_thread_s

    def plus(self, o: JobShare) -> JobShare:
        return JobShare(
            self.facts_s + o.facts_s, self.side_output_s + o.side_output_s, self.jvm_task_s + o.jvm_task_s,
            self.producer_thread_s + o.producer_thread_s, self.samples + o.samples,
            self.facts_samples + o.facts_samples, self.side_output_samples + o.side_output_samples,
            self.jvm_task_samples + o.jvm_task_samples, self.unmeasured_samples + o.unmeasured_samples,
            self.threads + o.threads, self.facts_tasks + o.facts_tasks, self.producer_threads + o.producer_threads,
            self.pyspy_errors + o.pyspy_errors, self.jfr.plus(o.jfr))


def attribute(tallies: Mapping[int | None, ThreadTally], cpu_s: Mapping[int, float], names: Mapping[int, str],
              is_facts_task: Callable[[str], bool], is_producer: Callable[[str], bool], jfr: JfrTally,
              pyspy_errors: int = 0) -> JobShare:
    """One TaskManager's facts CPU over a phase: each interpreter thread's CPU split by its py-spy
    samples, plus the facts producer's network thread(s) whole. ``names``: OS thread id -> thread
    name (a thread dump's Java names, or the kernel's); ``cpu_s``: OS thread id -> CPU seconds over
    the phase; ``is_producer``: which names are counted as the facts producer's network thread."""
    seconds = {"facts": 0.0, "side_output": 0.0, "jvm_task": 0.0}
    counts = dict.fromkeys(seconds, 0)
    samples = unmeasured = 0
    for tid, t in tallies.items():
        if tid is None or tid not in cpu_s or not t.samples:
            unmeasured += t.samples
            continue
        samples += t.samples
        for part in seconds:
            n = getattr(t, part)
            counts[part] += n
            seconds[part] += cpu_s[tid] * n / t.samples
    producers = [tid for tid, name in names.items() if is_producer(name)]
    return JobShare(seconds["facts"], seconds["side_output"], seconds["jvm_task"],
                    sum(cpu_s.get(tid, 0.0) for tid in producers), samples, counts["facts"], counts["side_output"],
                    counts["jvm_task"], unmeasured, len(tallies), sum(1 for n in names.values() if is_facts_task(n)),
                    len(producers), pyspy_errors, jfr)


def ms_line(share: JobShare, deliveries: int) -> str:
    """The bench's line for the attributed share, ms of CPU per delivery."""
    def ms(s: float) -> float:
        return s * 1000 / deliveries if deliveries else 0.0
    j = share.jfr
    facts_n = share.facts_samples + share.side_output_samples + share.jvm_task_samples
    return (f"python={ms(share.python_s):.4f} jvm_task={ms(share.jvm_task_s):.4f} "
            f"producer_thread={ms(share.producer_thread_s):.4f} total={ms(share.cpu_s):.4f} "
            f"(python: the facts' own {ms(share.facts_s):.4f}, the side output's and its identity map's "
            f"{ms(share.side_output_s):.4f}; samples n/N {facts_n}/{share.samples} py-spy on {share.threads} "
            f"interpreter threads ({share.facts_samples} facts, {share.side_output_samples} side output, "
            f"{share.jvm_task_samples} in its call into the JVM), {share.unmeasured_samples} more on threads "
            f"not measured, {share.pyspy_errors} py-spy errors; JFR (--jfr): "
            f"{j.in_python}/{j.samples} Java samples inside Python, {j.side_output} under collectSideOutputById: "
            f"{j.sink_writer} in the sink's writer, {j.python_map} in the identity Map's Java; "
            f"{share.producer_threads} producer network thread(s) counted as the facts')")
