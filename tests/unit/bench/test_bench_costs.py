"""The bench's newer figures' parts that need no stack: Cassandra's write counts as read from its
virtual table (bench/cassandra_writes.py), the idle sample's process groups and cores
(stack/cpu.py; by thread, bench/profilers.py), and the idle lines (bench/run.py)."""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import cassandra_writes, profilers
from bench.run import idle_line, idle_threads_line
from stack import cpu


def row(keyspace: str, table: str, count: int) -> SimpleNamespace:
    return SimpleNamespace(keyspace_name=keyspace, table_name=table, count=count)


def test_only_the_runs_keyspace_is_counted() -> None:
    rows = [row("webhooks_bench_x", "attempts", 5), row("webhooks", "attempts", 900),
            row("system", "local", 41), row("webhooks_bench_x", "deliveries", 0)]
    assert cassandra_writes.table_counts(rows, "webhooks_bench_x") == {"attempts": 5, "deliveries": 0}


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ({"a": 10, "b": 3}, {"a": 15, "b": 3}, {"a": 5}),  # unmoved tables left out
        ({"a": 10}, {"a": 10, "b": 4}, {"b": 4}),  # a table created in between counts from zero
        ({}, {}, {}),
    ],
)
def test_writes_between_two_readings(before: dict[str, int], after: dict[str, int],
                                     expected: dict[str, int]) -> None:
    assert cassandra_writes.delta(before, after) == expected


class FakeCounts:
    """Counts that move at each read until ``moves`` readings were taken, on a fake clock."""

    def __init__(self, moves: int) -> None:
        self.clock = [0.0]
        self.reads = 0
        self.moves = moves

    def read(self) -> dict[str, int]:
        self.reads += 1
        return {"attempts": min(self.reads, self.moves)}

    def sleep(self, s: float) -> None:
        self.clock[0] += s


def settle(c: FakeCounts, timeout_s: float = 30.0) -> dict[str, int]:
    return cassandra_writes.settled(c.read, quiet_s=2.0, timeout_s=timeout_s, clock=lambda: c.clock[0],
                                    sleep=c.sleep)


def test_settled_waits_until_the_counts_stop_moving() -> None:
    c = FakeCounts(moves=6)  # moves for 6 reads, 0.5 s apart, then still
    assert settle(c) == {"attempts": 6}
    assert c.clock[0] == pytest.approx(2.5 + 2.0)  # the last move at 2.5 s, then 2 s still


def test_settled_gives_up_after_its_timeout_on_counts_that_never_stop() -> None:
    c = FakeCounts(moves=10**6)
    assert settle(c, timeout_s=10.0) == {"attempts": 21}  # the reading at 10 s
    assert c.clock[0] == pytest.approx(10.0)


def test_the_whole_stack_is_every_part_with_a_pid_file_and_the_runs_own(tmp_path: Path) -> None:
    for part in ("kafka", "flink-tm", "flink-tm-2", "pushgateway"):
        (tmp_path / part).mkdir()
        (tmp_path / part / "pid").write_text("1")
    (tmp_path / "certs").mkdir()  # no pid file: not a process
    (tmp_path / "bench-outbox-x" / "postgres").mkdir(parents=True)  # a run's own, named by that run
    (tmp_path / "bench-outbox-x" / "postgres" / "pid").write_text("1")
    own = {"control-plane": [tmp_path / "bench-x-control-plane.pid"]}
    groups = cpu.whole_stack_groups(tmp_path, own)
    assert groups == {"flink-tm": [tmp_path / "flink-tm/pid"], "flink-tm-2": [tmp_path / "flink-tm-2/pid"],
                      "kafka": [tmp_path / "kafka/pid"], "pushgateway": [tmp_path / "pushgateway/pid"],
                      "bench-control-plane": [tmp_path / "bench-x-control-plane.pid"]}


def test_the_stack_groups_on_the_delivery_path_stay_as_they_were(tmp_path: Path) -> None:
    # cpu_ms_per_delivery stays comparable with earlier runs: the idle sample's wider set of
    # processes is its own.
    assert set(cpu.stack_groups(tmp_path, {"control-plane": []})) == {
        "taskmanagers", "jobmanager", "kafka", "cassandra", "control-plane"}


def test_every_server_of_the_stack_records_its_pid_where_the_idle_sample_looks(tmp_path: Path) -> None:
    # whole_stack_groups finds the stack's processes by lib.sh's layout (.run/<part>/pid): every
    # server is started through start_bg, which records it there, under a part the topology names.
    stack = Path(__file__).parents[3] / "stack"
    assert 'echo $! > "$RUN/$part/pid"' in (stack / "lib.sh").read_text()
    call = re.compile(r"^\s*start_bg (\S+) ", re.M)
    starters = {m.group(1) for f in stack.glob("*.sh") for m in call.finditer(f.read_text())}
    assert starters <= {'"$part"', "connect", "flink-jm", "flink-tm", "postgres", "pushgateway",
                        "prometheus", "s3proxy"}, "a server started outside start_bg's part layout"
    env = {"PATH": os.environ["PATH"], "WEBHOOKS_RUN_DIR": str(tmp_path), "TOPOLOGY": "single"}
    parts = subprocess.run(["bash", "-c", f"source {stack / 'lib.sh'} && topology_parts"], env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    assert set(parts) >= {"kafka", "cassandra", "flink-jm", "flink-tm", "connect", "postgres", "control-plane",
                          "prometheus", "pushgateway"}


def test_cores_are_cpu_seconds_over_wall_seconds_by_group_largest_first() -> None:
    u = cpu.Usage(cpu_s={"kafka": 3.0, "cassandra": 9.0, "prometheus": 0.0}, wall_s=30.0)
    assert u.cores == pytest.approx(0.4)
    assert list(u.cores_by_group().items()) == [("cassandra", 0.3), ("kafka", 0.1), ("prometheus", 0.0)]
    assert math.isnan(cpu.Usage().cores) and cpu.Usage().cores_by_group() == {}


def test_steal_is_the_hypervisors_share_of_every_cpu_tick_from_proc_stat() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice (guest is inside user)
    assert cpu.steal_and_total("cpu  40 0 10 40 1 0 1 8 3 0") == (8, 100)
    u = cpu.Usage(steal_ticks=8, machine_ticks=100)
    assert u.steal_pct == pytest.approx(8.0)
    assert math.isnan(cpu.Usage().steal_pct)  # no machine counters read
    assert "steal 8% of the machine" in cpu.Usage(cpu_s={"kafka": 1.0}, wall_s=1.0, steal_ticks=8,
                                                   machine_ticks=100).summary(10)


def test_the_idle_line_gives_the_total_then_each_process() -> None:
    u = cpu.Usage(cpu_s={"kafka": 3.0, "cassandra": 9.0}, wall_s=30.0)
    assert idle_line(u) == "bench-idle: cores=0.400 seconds=30.0 cassandra=0.300 kafka=0.100"


@pytest.mark.parametrize(("comm", "name"), [
    ("C2 CompilerThre", "C# CompilerThre"),  # C1 and C2 compilers: one entry
    ("GC Thread#11", "GC Thread##"),
    ("G1 Refine#0", "G# Refine##"),
    ("kafka-3-raft-io", "kafka-#-raft-io"),
    ("Source Data Fet", "Source Data Fet"),
])
def test_a_pools_threads_are_one_name(comm: str, name: str) -> None:
    assert profilers.thread_name(comm) == name


def test_cores_by_thread_name_are_each_threads_ticks_between_readings_under_its_last_name() -> None:
    hz = cpu.CLK_TCK
    before = {1: 0, 2: 10 * hz, 3: 50 * hz,  # thread 3 was "MutationStage-#" then (a pool's worker)
              4: 7 * hz}  # gone at the end: not counted
    after = {1: 3 * hz, 2: 16 * hz, 3: 53 * hz,
             5: 1 * hz,  # started in between: all its ticks count
             6: 0}
    names = {1: ("flink-tm", "C# CompilerThre"), 2: ("kafka", "data-plane-kafk"), 3: ("cassandra", "ReadStage-#"),
             5: ("kafka", "new-thread"), 6: ("flink-jm", "idle")}
    assert profilers.cores_by_thread_name(before, after, names, wall_s=30.0) == {
        ("kafka", "data-plane-kafk"): pytest.approx(0.2), ("cassandra", "ReadStage-#"): pytest.approx(0.1),
        ("flink-tm", "C# CompilerThre"): pytest.approx(0.1), ("kafka", "new-thread"): pytest.approx(1 / 30)}
    assert profilers.cores_by_thread_name(before, after, names, wall_s=0.0) == {}


def test_the_idle_threads_line_puts_jit_and_gc_apart_then_the_busiest() -> None:
    raw = {("flink-tm", "C2 CompilerThre"): 0.020, ("kafka", "C1 CompilerThre"): 0.010,
           ("cassandra", "GC Thread#0"): 0.003, ("cassandra", "G1 Conc#0"): 0.001,
           ("kafka", "data-plane-kafk"): 0.012, ("flink-tm", "Source Data Fet"): 0.005}
    threads = {(g, profilers.thread_name(comm)): c for (g, comm), c in raw.items()}
    assert idle_threads_line(threads, top=3) == (
        "bench-idle-threads: jit=0.030 gc=0.004 rest=0.017 | flink-tm:C#_CompilerThre=0.020 "
        "kafka:data-plane-kafk=0.012 kafka:C#_CompilerThre=0.010")
    assert idle_threads_line({}) == "bench-idle-threads: jit=0.000 gc=0.000 rest=0.000 | "


def test_this_process_threads_are_read(tmp_path: Path) -> None:
    (tmp_path / "me").mkdir()
    (tmp_path / "me" / "pid").write_text(str(os.getpid()))
    ticks, names = profilers.stack_threads(cpu.whole_stack_groups(tmp_path))
    assert ticks and all(group == "me" for group, _ in names.values())
    assert os.getpid() in ticks  # the main thread's id is the process id
    assert names[os.getpid()] == ("me", profilers.thread_name(Path("/proc/self/comm").read_text().strip()))


def test_a_live_pid_file_is_sampled_with_its_descendants(tmp_path: Path) -> None:
    (tmp_path / "me").mkdir()
    (tmp_path / "me" / "pid").write_text(str(os.getpid()))
    groups = cpu.whole_stack_groups(tmp_path)
    assert os.getpid() in cpu.pids_of(groups["me"])
