"""Gauges of the job's operators: values set from the task thread, never Python callables that
Flink's reporter thread would call into the interpreter (operators/task_gauges.py says why)."""

from __future__ import annotations

import ast
from pathlib import Path

from operators.task_gauges import TaskGauge, TaskGauges

REPO = Path(__file__).resolve().parents[3]


class FakeCounter:
    def __init__(self) -> None:
        self.count = 0
        self.calls = 0

    def inc(self, n: int = 1) -> None:
        self.count += n
        self.calls += 1

    def dec(self, n: int = 1) -> None:
        self.count -= n
        self.calls += 1


class FakeGroup:
    def __init__(self) -> None:
        self.counters: dict[str, FakeCounter] = {}

    def counter(self, name: str) -> FakeCounter:
        return self.counters.setdefault(name, FakeCounter())


def test_the_counter_follows_every_value_set_up_and_down() -> None:
    c = FakeCounter()
    g = TaskGauge(c)
    for value in (5, 12, 3, 0, 7, 7):
        g.set(value)
        assert c.count == value == g.value
    assert c.calls == 5  # setting the same value again calls nothing


def test_named_gauges_are_made_once_and_read_back() -> None:
    group = FakeGroup()
    gauges = TaskGauges(group)
    gauges.set("pending_new", 4)
    gauges.set("pending_new", 1)
    gauges.set("oldest_new_age_ms", 1500)
    assert {n: c.count for n, c in group.counters.items()} == {"pending_new": 1, "oldest_new_age_ms": 1500}
    assert gauges.get("pending_new") == 1 and gauges.get("never_set") == 0


def _gauge_registrations(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "gauge"]


def test_no_operator_registers_a_python_gauge() -> None:
    """A Python gauge is called by the reporter thread while the task thread runs Python: the
    TaskManager crashed with SIGSEGV under MetricGauge.getValue. What the job ships must not
    register one."""
    found = {str(p.relative_to(REPO)): lines for d in ("operators", "jobs")
             for p in sorted((REPO / d).glob("*.py")) if (lines := _gauge_registrations(p))}
    assert found == {}


def test_every_count_the_driver_keeps_is_exported() -> None:
    """The dispatcher exports the driver's counts by a fixed list of names; a count missing from it
    raised KeyError in the task thread (held the endpoint as an internal error) the first time
    it was kept -- an operator's skip on the real stack found it."""
    from operators.dispatcher import LABELLED, METRICS

    package = Path(__file__).parents[3] / "core" / "endpoint_driver"
    kept = set()
    for node in (n for f in sorted(package.glob("*.py")) for n in ast.walk(ast.parse(f.read_text()))):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "counts"
                and isinstance(node.slice, ast.Constant | ast.JoinedStr)):
            s = node.slice
            name = s.value if isinstance(s, ast.Constant) else s.values[0].value  # type: ignore[attr-defined]
            kept.add(str(name).partition(":")[0])
    assert len(kept) >= 15, kept  # the walk found them
    assert kept - set(METRICS) - set(LABELLED) == set()
