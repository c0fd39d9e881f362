"""Node faults on the cluster topology (tests/faults/test_chaos_cluster_nodes.py): the cluster
brought up by the stack scripts beside the running stack (stack/topologies/cluster-beside.env, a
run directory of its own), its nodes killed, paused and restarted by the pids those scripts
recorded there, a tenant producing at a steady rate across several endpoints while that happens,
and the figures a verdict needs beyond tests/support/faults.py (which Kafka node leads a
topic, first-attempt p99 over a window, the longest silence of a tenant's endpoints).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from cassandra.cluster import Cluster, Session
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from core.records import delivery_id_for
from core.settings import REPO_ROOT, Settings
from stack.isolation import harness_cluster, settings_with
from tests.e2e.test_cluster_topology import TOPOLOGIES, env_file, script
from tests.support.chaos_cluster import silence_after
from tests.support.faults import _alive, endpoints, first_request_at
from tests.support.figures import p99
from tests.support.helpers import event, eventually, new_tenant
from tests.support.receiver import Receiver

RUN_DIR = REPO_ROOT / ".run" / "chaos-cluster-nodes"


@dataclass
class ClusterStack:
    """The cluster topology running from ``run_dir``: its scripts' environment, the settings every
    process reads, a channel to each control-plane replica and a driver session on the keyspace."""
    env: dict[str, str]
    settings: Settings
    run_dir: Path
    replicas: list[grpc.Channel]
    session: Session
    driver: Cluster

    def pid(self, part: str) -> int:
        return int((self.run_dir / part / "pid").read_text())

    def send(self, part: str, sig: signal.Signals) -> float:
        """``sig`` to the process group of ``part`` (start_bg runs each server under setsid);
        returns when it was sent (epoch s). SIGKILL waits until the process is gone."""
        pid = self.pid(part)
        at = time.time()
        os.killpg(pid, sig)
        if sig == signal.SIGKILL:
            eventually(lambda: not _alive(pid) or None, timeout=60, interval=0.2, what=f"{part} gone")
        return at

    def start(self, script_name: str) -> None:
        """`stack/<script> start` then `ready`: the scripts start only the parts not running."""
        script(self.env, f"stack/{script_name}", "start", timeout=300)
        script(self.env, f"stack/{script_name}", "ready", timeout=600)

    def kafka_leaders(self, topic: str) -> Counter[int]:
        """Broker id -> partitions of ``topic`` it leads."""
        meta = AdminClient({"bootstrap.servers": self.settings.kafka.bootstrap_servers}).list_topics(topic, timeout=20)
        return Counter(p.leader for p in meta.topics[topic].partitions.values())

    def leaders_moved(self, topic: str, victim: int, since: float, timeout: float = 30) -> float | None:
        """Seconds from ``since`` until no partition of ``topic`` is led by broker ``victim`` (the
        controller fenced it: its session lapsed), polled every half second; None if not within
        ``timeout``."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with contextlib.suppress(KafkaException):  # a request that went to the dead broker
                if victim not in self.kafka_leaders(topic):
                    return time.time() - since
            time.sleep(0.5)
        return None

    def in_sync(self, topic: str) -> list[int]:
        """Replicas in sync per partition of ``topic``."""
        meta = AdminClient({"bootstrap.servers": self.settings.kafka.bootstrap_servers}).list_topics(topic, timeout=20)
        return [len(p.isrs) for p in meta.topics[topic].partitions.values()]

    def cassandra_up(self) -> list[str]:
        return sorted(h.address for h in self.driver.metadata.all_hosts() if h.is_up)


@contextlib.contextmanager
def cluster_stack(receiver: Receiver, certs: Path) -> Iterator[ClusterStack]:
    """Bring the cluster up beside the running stack with the job submitted (what an earlier run
    left in ``RUN_DIR`` stopped by its pids and wiped first); stack/down.sh with the same run
    directory at the end, whatever happened."""
    # One run at a time: a second run (two `make chaos-cluster` at once in the shared checkout)
    # would wipe this cluster mid-fault and start its own on the same ports (it happened).
    RUN_DIR.parent.mkdir(parents=True, exist_ok=True)
    with open(RUN_DIR.parent / "chaos-cluster-nodes.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AssertionError(f"another run of the node faults holds {lock.name}: its cluster uses the "
                                 "same ports and run directory; run them one at a time") from None
        yield from _cluster_stack(receiver, certs)


def _cluster_stack(receiver: Receiver, certs: Path) -> Iterator[ClusterStack]:
    port = int((receiver.base_url or "").rsplit(":", 1)[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBHOOKS_", "TOPOLOGY", "LOCAL_RECEIVERS"))}
    env.update(env_file(TOPOLOGIES / "cluster-beside.env"))  # first: lib.sh keeps what is set
    env.update({
        "WEBHOOKS_RUN_DIR": str(RUN_DIR),
        "TOPOLOGY": "cluster",
        # The tour's switch (endpoints on loopback), the session receiver's port and the test CA.
        "LOCAL_RECEIVERS": "1",
        "WEBHOOKS_EGRESS__ALLOWED_PORTS": json.dumps([443, port]),
        "WEBHOOKS_DISPATCH__CA_BUNDLE": str(certs / "ca.pem"),
    })
    if RUN_DIR.exists():
        script(env, "stack/down.sh")
        script(env, "stack/postgres.sh", "destroy")
        subprocess.run(["rm", "-rf", str(RUN_DIR)], check=True)
    started = time.monotonic()
    try:
        script(env, "stack/up.sh", timeout=900)
        script(env, "stack/job.sh", "submit", timeout=600)
        print(f"\ncluster up with the job running in {time.monotonic() - started:.0f} s")
        settings = settings_with({**env_file(TOPOLOGIES / "cluster.env"), **env})
        driver = harness_cluster(settings)
        replicas = [grpc.insecure_channel(f"127.0.0.1:{settings.control_plane.port + i}") for i in range(2)]
        # Fresh and loaded, the ring failed the control plane's first Paxos writes (CreateTenant
        # answered INTERNAL: "CAS operation result is unknown - proposal accepted by 1 but not a
        # quorum"); the faults start once a tenant can be created on each replica.
        for ch in replicas:
            eventually(functools.partial(_tenant_created, ch, settings), timeout=180, interval=3,
                       what="a tenant created through the replica")
        try:
            yield ClusterStack(env, settings, RUN_DIR, replicas, driver.connect(settings.cassandra.keyspace), driver)
        finally:
            for ch in replicas:
                ch.close()
            driver.shutdown()
    finally:
        # SIGCONT first: a node a failed test left stopped would not stop on SIGTERM.
        for part_dir in RUN_DIR.glob("cassandra-*"):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
                os.killpg(int((part_dir / "pid").read_text()), signal.SIGCONT)
        script(env, "stack/down.sh")
        status = script(env, "stack/status.sh")
        assert "running" not in status, status


def _tenant_created(ch: grpc.Channel, settings: Settings) -> bool | None:
    try:
        new_tenant(ch, settings)
    except grpc.RpcError as e:
        print(f"control plane not ready: {e.code().name} {e.details()}")
        return None
    return True


class LoadTenant:
    """A tenant whose ``n`` endpoints get every event it produces at ``per_s`` events a second,
    from one long-lived acks=all idempotent producer: the load a fault runs under. Only events
    Kafka acknowledged are expected (a broker may be the fault)."""

    def __init__(self, channel: grpc.Channel, settings: Settings, receiver: Receiver, name: str, n: int = 4,
                 per_s: float = 5.0) -> None:
        self.tenant_id, self.endpoint_ids = endpoints(channel, settings, receiver, n, name)
        self.paths = [f"/ep/{name}-{self.tenant_id}-{i}" for i in range(n)]
        self._settings, self._per_s = settings, per_s
        self.produced: dict[str, float] = {}  # delivery_id -> produce time
        self.unacked = 0
        self._producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 0,
                                   **settings.kafka.librdkafka_failover()})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"load-{name}")

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(1 / self._per_s):
            e = event(self.tenant_id, "order.shipped", f'{{"load":{n}}}'.encode())
            at = time.time()
            acked: list[bool] = []
            self._producer.produce(self._settings.kafka.events_topic, key=e.event_id.encode(), value=e.to_json(),
                                   on_delivery=lambda err, _m, acked=acked: acked.append(err is None))
            self._producer.flush(30)
            if acked == [True]:
                self.produced.update({delivery_id_for(e.event_id, ep): at for ep in self.endpoint_ids})
            else:
                self.unacked += 1
            n += 1

    def acked_between(self, start: float, end: float) -> int:
        """Events Kafka acknowledged that were produced in [start, end)."""
        return sum(1 for t in self.produced.values() if start <= t < end) // len(self.endpoint_ids)

    def __enter__(self) -> LoadTenant:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def p99_ms(receiver: Receiver, produced: dict[str, float], start: float, end: float) -> float | None:
    """First-attempt latency p99 (ms) of the deliveries produced in [start, end) (None: none)."""
    window = {d: t for d, t in produced.items() if start <= t < end}
    first = first_request_at(receiver, set(window))
    return p99((first[d] - window[d]) * 1000 for d in window if d in first)


def ack_p99_ms(produced: dict[str, float], acked_at: dict[str, float], start: float, end: float) -> float | None:
    """Of the deliveries produced in [start, end), the p99 of the time Kafka took to acknowledge
    their event (ms): the part of the first-attempt latency spent before the platform could read
    it, which a fault of Kafka itself lengthens."""
    return p99((acked_at[d] - t) * 1000 for d, t in produced.items() if start <= t < end and d in acked_at)


def pause_s(receiver: Receiver, paths: list[str], since: float) -> float:
    """The longest time after ``since`` that any of ``paths`` went without a request while more
    kept coming (faults.silence_after per endpoint, the worst one)."""
    return max(silence_after(receiver, paths, since).values(), default=0.0)
