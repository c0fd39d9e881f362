"""Gauge values published from the task thread, as Flink counters moved by the difference.

Why not ``metric_group.gauge(name, fn)``: in thread mode a Python gauge is a callable that Flink's
metric reporter thread invokes through pemja, into the interpreter the task thread is running at
that moment. Measured on this stack: the TaskManager died with SIGSEGV in
``_PyEval_EvalFrameDefault`` under ``MetricGauge.getValue`` (reporter thread) in the middle of a
benchmark run, killing every job on it, and at shutdown in ``take_gil``. A counter lives on the
Java side: the reporter reads a long, and only the task thread ever calls into Python.

So a gauge here is a counter whose count is kept equal to the value last ``set``: Flink's
Prometheus reporters export counters as gauges under the same name, so the series, recording
rules and alerts are unchanged. The value is as fresh as the last ``set``; the operators set
their gauges on the passes they make anyway and keep a refresh timer while a value that ages
(an "oldest ... age") is non-zero.
"""

from __future__ import annotations

from typing import Any, Protocol


class _Counter(Protocol):
    def inc(self, n: int = 1) -> None: ...

    def dec(self, n: int = 1) -> None: ...


class TaskGauge:
    __slots__ = ("_counter", "value")

    def __init__(self, counter: _Counter) -> None:
        self._counter = counter
        self.value = 0

    def set(self, value: int) -> None:
        delta = int(value) - self.value
        if delta > 0:
            self._counter.inc(delta)
        elif delta < 0:
            self._counter.dec(-delta)
        self.value += delta


class TaskGauges:
    """Named gauges of one metric group, made on first use."""

    def __init__(self, group: Any) -> None:
        self._group = group
        self._gauges: dict[str, TaskGauge] = {}

    def set(self, name: str, value: int) -> None:
        g = self._gauges.get(name)
        if g is None:
            g = self._gauges[name] = TaskGauge(self._group.counter(name))
        g.set(value)

    def get(self, name: str) -> int:
        g = self._gauges.get(name)
        return g.value if g is not None else 0
