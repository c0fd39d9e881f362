"""Crash safety on the real stack: a savepoint upgrade (the TaskManager killed mid fan-out is fault 2
of the fault matrix, tests/faults/test_chaos.py).

It ends with durable counts and real bounds:
- nothing lost: every (event, matching endpoint) pair has exactly one delivery row, reached the
  receiver, and its row ends `succeeded`;
- duplicates (receiver requests beyond one per delivery) are bounded by what the job can have had
  in flight, plus two history batches recorded but not yet acknowledged (faults.duplicate_bound);
- history explains every duplicate: each delivery has at least as many `attempts` rows as the
  receiver saw requests carrying its webhook-id.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args

from core.records import EventRecord, delivery_id_for
from stack.flink_jobs import rest, wait_all_running
from tests.support.faults import (
    duplicate_bound,
    endpoints,
    history_shortfall,
    requests_by_delivery,
    shortfall_message,
    wait_all_reached,
)
from tests.support.helpers import assert_reconciled, event, eventually, eventually_tolerant, produce
from tests.support.receiver import Receiver
from tests.support.stack_fixtures import job_script

pytestmark = pytest.mark.integration


def _assert_all_delivered(cassandra_session: Session, receiver: Receiver, events: list[EventRecord],
                          endpoint_ids: list[str], timeout: float) -> Counter[str]:
    """Lost = 0, from the receiver and Cassandra; returns the receiver's requests per delivery_id."""
    expected = {delivery_id_for(e.event_id, ep) for e in events for ep in endpoint_ids}
    wait_all_reached(receiver, expected, timeout)
    # Every expected delivery has its row (checked below) under the id derived from (event, endpoint).
    status = cassandra_session.prepare("SELECT status FROM delivery_history WHERE delivery_id=? LIMIT 1")
    not_succeeded: list[tuple[str, str | None]] = []

    def all_succeeded() -> bool | None:
        ids = sorted(expected)
        results = execute_concurrent_with_args(cassandra_session, status, [(d,) for d in ids],
                                               concurrency=64, raise_on_first_error=True)
        rows = {d: res.result_or_exc.one() for d, res in zip(ids, results, strict=True)}
        not_succeeded[:] = [(d, r.status if r else None) for d, r in rows.items()
                            if r is None or r.status != "succeeded"]
        return not not_succeeded or None

    try:
        eventually_tolerant(all_succeeded, timeout=60, interval=1, what="every delivery row succeeded")
    except AssertionError:
        raise AssertionError(f"lost: {len(not_succeeded)} delivery rows not 'succeeded' "
                             f"(e.g. {not_succeeded[:3]})") from None
    return requests_by_delivery(receiver, expected)


def test_savepoint_stop_and_upgrade_loses_nothing(settings, job_env, grpc_channel, receiver, delivery_job,
                                                  cassandra_session):
    n_endpoints = 5
    # Each answer takes 1 s (inside the job's total timeout), so requests are in flight at the stop.
    tenant_id, endpoint_ids = endpoints(grpc_channel, settings, receiver, n_endpoints, "sp", "slow 1")
    started = time.monotonic()
    window_start_ms = int(time.time() * 1000) - 1000
    before = [event(tenant_id, "order.created", f'{{"n":{i}}}'.encode()) for i in range(40)]
    produce(settings, [e.to_json() for e in before], keys=[e.event_id for e in before])
    eventually(lambda: len({r.webhook_id for r in receiver.requests()
                            if r.path.startswith(f"/ep/sp-{tenant_id}")}) >= 10 or None,
               timeout=60, what="some deliveries before the savepoint")

    job_script(job_env, "stop")  # stop with a savepoint, like `make down`
    # Produced while the job is down: must be picked up from the savepoint's offsets.
    during = [event(tenant_id, "order.updated", f'{{"m":{i}}}'.encode()) for i in range(20)]
    produce(settings, [e.to_json() for e in during], keys=[e.event_id for e in during])

    # A compatible new version: different dispatch tuning, same uids and state.
    upgraded = {**job_env, "WEBHOOKS_DISPATCH__DEFAULT_MAX_IN_FLIGHT": "6"}
    out = job_script(upgraded, "submit")
    assert "resuming" in out and "savepoint-" in out, out
    job_id = job_script(job_env, "id").strip()
    wait_all_running(job_id)
    restored = rest(f"/jobs/{job_id}/checkpoints")["latest"]["restored"]
    assert restored is not None and restored["is_savepoint"] is True

    requests = _assert_all_delivered(cassandra_session, receiver, before + during, endpoint_ids, timeout=120)
    elapsed = time.monotonic() - started
    dups = sum(requests.values()) - len(requests)
    # A stop-with-savepoint re-sends only what was in flight at the savepoint or finished after it
    # without a durable record (PyFlink's thread mode never calls the function's close(), so the
    # dispatcher cannot drain on a stop):
    #   bound = min(tenant_max_in_flight, n_endpoints * default_max_in_flight)   (x parallelism)
    #           + 2 x history_batch_max_statements // 4   (two history batches not yet durable)
    # = min(64, 5 * 8) + 100 = 140 (the upgrade lowers default_max_in_flight to 6; the old, larger
    # cap is what was in flight).
    bound = duplicate_bound(settings, n_endpoints, max(settings.dispatch.default_max_in_flight, 6))
    shortfall = history_shortfall(cassandra_session, requests)
    print(f"\nsavepoint upgrade: {len(requests)} deliveries, {sum(requests.values())} requests, "
          f"duplicates {dups} (bound {bound}), deliveries with fewer attempt rows than requests "
          f"{len(shortfall)}, elapsed {elapsed:.1f} s")
    assert dups <= bound, f"{dups} duplicates after a stop-with-savepoint; at most {bound} can have been in flight"
    assert not shortfall, shortfall_message(shortfall, requests)
    # Durable counts agree: every event fanned out, every expected delivery succeeded, no gap.
    r = assert_reconciled(grpc_channel, settings, tenant_id, window_start_ms, len(before + during) * n_endpoints)
    print(f"reconciled: {dict(r.counts)}")
