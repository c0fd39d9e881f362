"""The cluster topology as configuration: stack/topologies/cluster.env read by the project's own
Settings, the topic specs it yields, and stack/lib.sh choosing, recording and guarding the
topology in a run directory of the test's own (no server is started; a "running" part is this
test's own process's pid)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.settings import REPO_ROOT, FlinkSettings, KafkaSettings
from stack.isolation import settings_with
from stack.topics import topic_specs

TOPOLOGIES = REPO_ROOT / "stack" / "topologies"


def env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return dict(pairs)  # type: ignore[arg-type]


def test_the_cluster_file_is_the_shape_the_readme_states() -> None:
    s = settings_with(env_file(TOPOLOGIES / "cluster.env"))
    assert s.kafka.bootstrap_servers == "127.0.0.1:9092,127.0.0.1:9192,127.0.0.1:9292"
    assert (s.kafka.replication_factor, s.kafka.min_insync_replicas) == (3, 2)
    assert s.cassandra.contact_points == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert (s.cassandra.replication_factor, s.cassandra.consistency) == (3, "LOCAL_QUORUM")
    assert (s.flink.parallelism, s.flink.max_parallelism) == (2, 256)
    # The natural ports: clients such as webhookctl keep their defaults.
    assert (s.control_plane.port, s.cassandra.port, s.flink.rest_port) == (50051, 9042, 8081)


def test_the_beside_file_moves_every_port_and_nothing_else() -> None:
    beside = settings_with({**env_file(TOPOLOGIES / "cluster.env"), **env_file(TOPOLOGIES / "cluster-beside.env")})
    assert beside.kafka.bootstrap_servers == "127.0.0.1:19092,127.0.0.1:19192,127.0.0.1:19292"
    assert (beside.control_plane.port, beside.cassandra.port, beside.flink.rest_port) == (50061, 19042, 18081)
    assert (beside.kafka.replication_factor, beside.cassandra.replication_factor) == (3, 3)


@pytest.mark.parametrize(("rf", "min_isr"), [(1, 1), (3, 2)])
def test_every_topic_gets_the_settings_replication(rf: int, min_isr: int) -> None:
    specs = topic_specs(KafkaSettings(replication_factor=rf, min_insync_replicas=min_isr))
    assert {t.replication_factor for t in specs} == {rf}
    assert {t.config["min.insync.replicas"] for t in specs} == {str(min_isr)}


@pytest.mark.parametrize(("build", "message"), [
    (lambda: KafkaSettings(replication_factor=1, min_insync_replicas=2), "min_insync_replicas (2) exceeds"),
    (lambda: FlinkSettings(parallelism=4, max_parallelism=2), "parallelism (4) exceeds"),
])
def test_settings_no_write_or_job_could_run_with_are_refused(build: object, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        build()  # type: ignore[operator]


def test_max_parallelism_left_to_flink_by_default() -> None:
    # Savepoints of the single-node stack were taken with Flink's own choice; an explicit value
    # different from theirs would refuse to restore them.
    assert FlinkSettings().max_parallelism is None


def lib(run_dir: Path, commands: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOKS_") and k != "TOPOLOGY"}
    return subprocess.run(["bash", "-c", f'source "{REPO_ROOT}/stack/lib.sh"; {commands}'], capture_output=True,
                          text=True, timeout=30, env={**base, "WEBHOOKS_RUN_DIR": str(run_dir), **env})


def test_the_default_is_the_single_node_stack(tmp_path: Path) -> None:
    out = lib(tmp_path, "echo $TOPOLOGY; topology_parts")
    assert out.stdout.split() == ["single", "kafka", "cassandra", "flink-jm", "flink-tm", "control-plane",
                                  "postgres", "connect", "pushgateway", "prometheus"], out.stderr


def test_the_recorded_topology_is_what_later_commands_act_on(tmp_path: Path) -> None:
    started = lib(tmp_path, "record_topology", TOPOLOGY="cluster")
    assert started.returncode == 0, started.stderr
    later = lib(tmp_path, "echo $TOPOLOGY $WEBHOOKS_KAFKA__REPLICATION_FACTOR; topology_parts")  # no TOPOLOGY
    assert later.stdout.split() == ["cluster", "3", "kafka-1", "kafka-2", "kafka-3", "cassandra-1", "cassandra-2",
                                    "cassandra-3", "flink-jm", "flink-tm", "flink-tm-2", "control-plane",
                                    "control-plane-2", "postgres", "connect", "pushgateway", "prometheus"]


def test_the_environment_wins_over_the_topology_file(tmp_path: Path) -> None:
    out = lib(tmp_path, "echo $WEBHOOKS_KAFKA_PORT $WEBHOOKS_FLINK__PARALLELISM", TOPOLOGY="cluster",
              WEBHOOKS_KAFKA_PORT="19092")
    assert out.stdout.split() == ["19092", "2"]


@pytest.mark.parametrize(("running", "wanted"), [("kafka", "cluster"), ("cassandra-2", "single")])
def test_one_topology_does_not_start_while_the_other_runs(tmp_path: Path, running: str, wanted: str) -> None:
    (tmp_path / "topology").write_text("single\n" if wanted == "cluster" else "cluster\n")
    (tmp_path / running).mkdir()
    (tmp_path / running / "pid").write_text(str(os.getpid()))  # alive: this test
    out = lib(tmp_path, "echo sourced; record_topology", TOPOLOGY=wanted)  # any script: up, job, down
    assert out.returncode != 0 and "sourced" not in out.stdout
    assert f"({running}, pid {os.getpid()}): 'make down' first" in out.stderr
    assert (tmp_path / "topology").read_text().strip() != wanted  # not recorded
    same = lib(tmp_path, "echo sourced")  # the running topology itself is untouched
    assert same.returncode == 0 and "sourced" in same.stdout


def test_an_unknown_topology_is_refused(tmp_path: Path) -> None:
    out = lib(tmp_path, "true", TOPOLOGY="clustr")
    assert out.returncode != 0 and "unknown TOPOLOGY 'clustr'" in out.stderr


def test_the_audits_and_harnesses_driver_reads_and_writes_at_the_settings_consistency() -> None:
    # The archive audit (control_plane.archive.audit) counts an hour through this driver: at the
    # driver's own default (LOCAL_ONE) a replica that missed a quorum-acknowledged write would
    # report a gap that is not there.
    from cassandra import ConsistencyLevel
    from cassandra.cluster import EXEC_PROFILE_DEFAULT

    from stack.isolation import harness_cluster

    cluster = harness_cluster(settings_with(env_file(TOPOLOGIES / "cluster.env")))  # not connected
    profile = cluster.profile_manager.profiles[EXEC_PROFILE_DEFAULT]
    assert profile.consistency_level == ConsistencyLevel.LOCAL_QUORUM
    assert profile.serial_consistency_level == ConsistencyLevel.LOCAL_SERIAL


def test_status_lists_every_node_of_the_recorded_topology(tmp_path: Path) -> None:
    (tmp_path / "topology").write_text("cluster\n")
    (tmp_path / "cassandra-2").mkdir()
    (tmp_path / "cassandra-2" / "pid").write_text(str(os.getpid()))  # alive: this test
    out = lib(tmp_path, f'bash "{REPO_ROOT}/stack/status.sh"')
    table = out.stdout.split("  Flink dashboard", 1)[0]  # the parts, before the addresses
    states = dict(line.split(None, 1) for line in table.splitlines())
    assert states.pop("topology") == "cluster"
    assert states.pop("cassandra-2") == f"running (pid {os.getpid()})"
    assert {"kafka-1", "kafka-2", "kafka-3", "cassandra-1", "cassandra-3", "flink-jm", "flink-tm", "flink-tm-2",
            "control-plane", "control-plane-2", "postgres", "connect", "pushgateway", "prometheus"} <= states.keys()
    assert set(states.values()) == {"stopped"}


def test_the_cost_report_reads_every_live_part_and_only_those(tmp_path: Path) -> None:
    from stack.cluster_cost import measure

    for part, pid in (("kafka-1", os.getpid()), ("kafka-2", 2**22 + 1)):  # above pid_max: never alive
        (tmp_path / part).mkdir()
        (tmp_path / part / "pid").write_text(str(pid))
    rows = measure(tmp_path, 0)
    assert [name for name, _, _ in rows] == ["kafka-1"]
    assert rows[0][1] > 0  # this process's resident memory
