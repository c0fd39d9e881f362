"""`make chaos-cluster`: faults of a deployment with more than one of each node, each with a verdict
of durable counts (tests/support/faults.py) and the pause it caused; the rescale under load is
tests/faults/test_rescale.py. These run on the stack that is up (WEBHOOKS_CHAOS_STACK names
it); the faults that need the cluster topology (a Kafka broker, a Cassandra node, a control-plane
replica) are added here as more tests marked ``chaos_cluster``.
"""

from __future__ import annotations

import statistics
import time

import pytest

from stack.flink_jobs import extra_taskmanagers, rest, wait_all_running
from tests.support.chaos_cluster import (
    DISPATCH,
    MATRIX,
    own_job,
    placement,
    resource_id,
    restarted_vertices,
    sigkill_taskmanager,
    silence_after,
)
from tests.support.faults import (
    SteadyTenant,
    duplicate_bound,
    endpoints,
    produce_events,
    requests_by_delivery,
    verdict,
)
from tests.support.figures import HEALTHY_P99_BOUND_MS
from tests.support.helpers import eventually, eventually_tolerant

pytestmark = [pytest.mark.integration, pytest.mark.chaos_cluster]


def test_a_taskmanager_of_two_killed_mid_burst(job_env, receiver):
    """A job at parallelism 2 whose two dispatch subtasks run on two TaskManagers; one of them is
    SIGKILLed while a 3,000-delivery burst is a quarter sent. The pause is the time from the kill
    until every endpoint with work left got a request again (the key groups of both TaskManagers);
    duplicates are bounded by what was in flight or not yet durable (faults.duplicate_bound).

    Two TaskManagers: the stack's and one this test starts (the victim). The survivor has free
    slots and has run the job, so the job comes back there; an idle TaskManager that never ran it
    would first start its embedded Python and import the job (docs/operating.md, "Recovery
    timelines")."""
    n_endpoints = 20
    with extra_taskmanagers(1) as parts, own_job(job_env, "tmkill", {"WEBHOOKS_FLINK__PARALLELISM": "2"}) as job:
        s = job.settings
        job_id = job.job_id()
        where = placement(job_id, DISPATCH)
        ours = {resource_id(p): p for p in parts}
        assert len(set(where.values())) == 2, f"both dispatch subtasks on one TaskManager: {where}"
        victim = next((ours[tm] for tm in where.values() if tm in ours), None)
        assert victim is not None, f"no dispatch subtask on a TaskManager this test started: {where} vs {ours}"

        with SteadyTenant(job.channel, s, receiver, "tmkill") as healthy:
            since_ms = int(time.time() * 1000) - 1000
            # Each answer takes 300 ms, so at the kill both subtasks have requests in flight and
            # a backlog of their endpoints' deliveries.
            tenant_id, ids = endpoints(job.channel, s, receiver, n_endpoints, "tmkill", "slow 0.3")
            paths = [f"/ep/tmkill-{tenant_id}-{i}" for i in range(n_endpoints)]
            _, produced = produce_events(s, tenant_id, ids, 150)
            eventually(lambda: len(requests_by_delivery(receiver, set(produced))) >= len(produced) // 4 or None,
                       timeout=120, interval=0.05, what="a quarter of the burst at the receiver")
            at_kill = len(requests_by_delivery(receiver, set(produced)))
            killed_ms = sigkill_taskmanager(victim)
            eventually_tolerant(lambda: restarted_vertices(job_id, killed_ms)[0] > 0 or None, timeout=180,
                                interval=1, what="tasks redeployed after the kill")
            wait_all_running(job_id, timeout=180)
            restarted, vertices = restarted_vertices(job_id, killed_ms)
            after = placement(job_id, DISPATCH)
            redeployed = max(v["start-time"] for v in rest(f"/jobs/{job_id}")["vertices"]) / 1000
            # The pause of every endpoint that still had deliveries to send when the job came back.
            unfinished = [p for p in paths if len({r.webhook_id for r in receiver.requests(p)
                                                    if r.received_at < redeployed}) < 150]

            def all_resumed() -> dict[str, float] | None:
                if any(not any(r.received_at > redeployed for r in receiver.requests(p)) for p in unfinished):
                    return None
                return silence_after(receiver, unfinished, killed_ms / 1000)

            resumed = eventually(all_resumed, timeout=180, interval=0.5, what="every unfinished endpoint sent to again")
            pause_s = max(resumed.values())
            note = (f"{victim} of 2 TaskManagers SIGKILLed with {at_kill} of {len(produced)} deliveries at the "
                    f"receiver; {restarted} of {vertices} vertices redeployed (failover: "
                    f"{'full restart' if restarted == vertices else 'partial'}); dispatch subtasks {where} -> "
                    f"{after}; per-endpoint pause min {min(resumed.values()):.1f} s, median "
                    f"{statistics.median(resumed.values()):.1f} s, max {pause_s:.1f} s over {len(resumed)} endpoints")
            result = verdict("taskmanager-of-two-sigkill", job.channel, s, receiver, job.session, [tenant_id],
                             since_ms, produced, bound=duplicate_bound(s, n_endpoints), healthy=healthy,
                             pause_s=pause_s, matrix=MATRIX, note=note, healthy_p99_bound_ms=HEALTHY_P99_BOUND_MS)
            print(f"taskmanager-of-two-sigkill: the healthy tenant's slowest first attempts: "
                  f"{healthy.slowest(killed_ms / 1000)}", flush=True)
    assert result.passed, result.line()  # the healthy tenant's p99 within the brief's 10 s included
    assert result.lost == 0 and result.unexplained_duplicates == 0, result.line()
    assert result.caused <= result.duplicate_bound, result.line()
