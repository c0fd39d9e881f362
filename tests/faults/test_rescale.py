"""Rescale under load, 2 -> 4 -> 1, with a backlog -- retries pending behind back-off timers, one
endpoint's breaker open, healthy endpoints delivering --, then the failing receivers recover and
everything drains. Two ways to rescale, one test each:
- in place (`adaptive`): the adaptive scheduler is given the job's new resource requirements
  (stack/flink_jobs.rescale_in_place, `stack/job.sh rescale N`) and restarts the same job from
  its next checkpoint at the new parallelism;
- `savepoint`: stop with a savepoint, submit again at the new parallelism from it.
WEBHOOKS_RESCALE_PATHS=adaptive,savepoint chooses (unset: the one the cluster's scheduler
offers, in place under `jobmanager.scheduler: adaptive`).

Keyed state (pending deliveries, their next attempt times, breakers) is redistributed by key
group at each restore. What must hold, from Cassandra history and the receivers:
- nothing lost: every (event, endpoint) pair final and reached its receiver (faults.verdict);
- duplicates 0: no delivery is received again after a request the receiver accepted (2xx);
- every retry keeps its schedule: an attempt (history) or request (receiver) after a restore is
  no earlier than the next attempt time its delivery had when the rescale began (the savepoint,
  or the request to rescale in place), and no attempt follows the previous one's end by less than
  the policy's shortest back-off (core.retry.RetrySchedule.min_delay_ms), or the Retry-After its
  receiver stated;
- the open breaker is still open after each restore: its endpoint gets no request before the
  open period recorded when the rescale began ends (endpoint_backlogs.breaker_open_until);
- fair recovery: the healthy tenant's first-attempt p99 over the whole run within
  figures.HEALTHY_P99_BOUND_MS, and its endpoint never without a request for longer than
  figures.RESCALE_PAUSE_BOUND_S (the pause, whichever way the job was rescaled).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from cassandra.cluster import Session

from core.records import delivery_id_for
from core.retry import RetrySchedule
from stack.flink_jobs import extra_taskmanagers, scheduler
from tests.support.chaos_cluster import MATRIX, OwnJob, dispatch_parallelism, max_parallelism, own_job
from tests.support.faults import SteadyTenant, first_request_at, verdict
from tests.support.figures import HEALTHY_P99_BOUND_MS, RESCALE_PAUSE_BOUND_S, longest_silence, p99
from tests.support.helpers import create_endpoints, event, eventually, new_tenant, produce
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.integration, pytest.mark.chaos_cluster]

# Long enough that both restores happen inside one open period of the breaker, and inside the
# Retry-After of the endpoints that state one (a stop plus a PyFlink submit took 16-79 s each on
# a loaded 2-core machine), so "still open" and "not before its time" are tested at both restores.
BREAKER_OPEN_S = 240
RETRY_AFTER_S = 180
OVERRIDES = {
    "WEBHOOKS_FLINK__PARALLELISM": "2",
    # Back-offs of seconds to tens of seconds: retries are pending, timers set, at each savepoint.
    "WEBHOOKS_DISPATCH__RETRY_BASE_S": "10",
    "WEBHOOKS_DISPATCH__RETRY_CAP_S": "40",
    "WEBHOOKS_DISPATCH__MAX_ATTEMPTS": "40",
    # The breaker endpoint's burst opens it at once; the retrying endpoints (2 deliveries each,
    # ~10 attempts in the run) stay below the threshold, so their waits are back-offs, not a breaker.
    "WEBHOOKS_DISPATCH__BREAKER_FAILURE_THRESHOLD": "40",
    "WEBHOOKS_DISPATCH__BREAKER_OPEN_S": str(BREAKER_OPEN_S),
    "WEBHOOKS_DISPATCH__BREAKER_MAX_OPEN_S": "600",
}
# Half the retrying endpoints answer 500 (the exponential back-off decides their next attempt),
# half 503 with Retry-After (the receiver's stated time, honoured: at least RETRY_AFTER_S).
N_RETRYING, RETRYING_EVENTS = 6, 2
STATED = f"retry_after 503 {RETRY_AFTER_S}"
BREAKER_EVENTS = 60
N_HEALTHY, HEALTHY_EVENTS = 3, 20


@dataclass(frozen=True)
class AtSavepoint:
    """What history said when the rescale began (the job stopped with a savepoint, or a rescale in
    place asked for): per retrying delivery (its last attempt with an outcome, next attempt ms),
    and the breaker's state and end of its open period."""
    stopped_at: float
    retries: dict[str, tuple[int, int | None]]
    breaker: str | None
    open_until_ms: int | None


def _at_savepoint(session: Session, ks: str, stopped_at: float, retrying: list[str],
                  breaker_endpoint: str) -> AtSavepoint:
    # One read per delivery: its statics and attempt rows share a partition, written together.
    q = session.prepare(f"SELECT attempt_number, outcome, next_attempt_at, status FROM {ks}.delivery_history"
                        " WHERE delivery_id=?")
    retries = {}
    for d in retrying:
        rows = list(session.execute(q, (d,)))
        assert rows and rows[0].status == "pending", (d, rows)
        done = max(r.attempt_number for r in rows if r.outcome not in (None, "reserved"))
        retries[d] = (done, None if rows[0].next_attempt_at is None else _ms(rows[0].next_attempt_at))
    b = session.execute(f"SELECT breaker, breaker_open_until FROM {ks}.endpoint_backlogs WHERE endpoint_id=%s",
                        (breaker_endpoint,)).one()
    return AtSavepoint(stopped_at, retries, b.breaker if b else None,
                       _ms(b.breaker_open_until) if b and b.breaker_open_until else None)


def _ms(ts: datetime) -> int:
    return int(ts.replace(tzinfo=UTC).timestamp() * 1000)


def _breaker_open(job: OwnJob, endpoint_id: str, after_ms: int = 0) -> int | None:
    """The breaker's open_until once the job reports it open (and later than ``after_ms``)."""
    ks = job.settings.cassandra.keyspace
    b = job.session.execute(f"SELECT breaker, breaker_open_until FROM {ks}.endpoint_backlogs WHERE endpoint_id=%s",
                            (endpoint_id,)).one()
    if b is None or b.breaker != "open" or b.breaker_open_until is None:
        return None
    until = _ms(b.breaker_open_until)
    return until if until > after_ms else None


def _attempts(session: Session, ks: str, delivery_id: str) -> list[tuple[int, int, int]]:
    """(attempt number, started ms, finished ms) of every attempt with an outcome, in order. A row
    still `reserved` is left out: its time is when the intent was reserved (right after the
    previous outcome, long before it was due), and a stop leaves the intent unused -- the restored
    job cannot know that, so it takes the next number (core/reconcile.py: outcome unknown)."""
    rows = session.execute(f"SELECT attempt_number, outcome, started_at, finished_at FROM {ks}.delivery_history"
                           " WHERE delivery_id=%s AND attempt_number > 0", (delivery_id,))
    return sorted((r.attempt_number, _ms(r.started_at), _ms(r.finished_at)) for r in rows if r.outcome != "reserved")


def _attempt_rows(session: Session, ks: str, delivery_id: str) -> list[tuple[Any, ...]]:
    """Every attempt row of a delivery, for a failure's message."""
    rows = session.execute(f"SELECT attempt_number, outcome, error_class, http_status, started_at, finished_at,"
                           f" attempt_id FROM {ks}.delivery_history WHERE delivery_id=%s AND attempt_number > 0",
                           (delivery_id,))
    return [(r.attempt_number, r.outcome, r.error_class, r.http_status, r.started_at and _ms(r.started_at),
             r.finished_at and _ms(r.finished_at), r.attempt_id) for r in rows]


def _p99_ms(receiver: Receiver, produced: dict[str, float], since: float = 0.0) -> float | None:
    window = {d: t for d, t in produced.items() if t >= since}
    first = first_request_at(receiver, set(window))
    return p99((first[d] - t) * 1000 for d, t in window.items() if d in first)


PATHS = ("adaptive", "savepoint")


def _run_or_skip(path: str) -> None:
    """Skip ``path`` unless chosen (WEBHOOKS_RESCALE_PATHS, or the cluster's scheduler); a path
    chosen by name that the cluster cannot take fails, naming the setting."""
    chosen = os.environ.get("WEBHOOKS_RESCALE_PATHS", "")
    kind = scheduler()
    if not chosen:
        if path != ("adaptive" if kind == "adaptive" else "savepoint"):
            pytest.skip(f"the cluster runs the {kind} scheduler: the rescale path is the other one "
                        "(WEBHOOKS_RESCALE_PATHS=adaptive,savepoint runs both)")
        return
    unknown = set(chosen.split(",")) - set(PATHS)
    assert not unknown, f"WEBHOOKS_RESCALE_PATHS: unknown {sorted(unknown)}, choose from {PATHS}"
    if path not in chosen.split(","):
        pytest.skip(f"WEBHOOKS_RESCALE_PATHS={chosen}")
    assert path != "adaptive" or kind == "adaptive", (
        f"a rescale in place needs the adaptive scheduler; the cluster runs the {kind} one "
        "(WEBHOOKS_FLINK_SCHEDULER=adaptive when Flink starts: flink-conf/config.yaml)")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.timeout(1200)  # two rescales, then the breaker's open period and a drain
def test_rescale_2_to_4_to_1_under_a_backlog_keeps_retry_schedules_and_breakers(job_env, receiver, path):
    _run_or_skip(path)
    with extra_taskmanagers(1), own_job(job_env, "rescale", OVERRIDES) as job:
        s, ch, ks = job.settings, job.channel, job.settings.cassandra.keyspace
        assert dispatch_parallelism(job.job_id()) == 2
        since_ms = int(time.time() * 1000) - 1000
        tenant_id, api_key = new_tenant(ch, s)
        base = f"{receiver.base_url}/ep/rescale-{tenant_id}"
        retrying_paths = [f"/ep/rescale-{tenant_id}/retry-{i}" for i in range(N_RETRYING)]
        breaker_path = f"/ep/rescale-{tenant_id}/breaker"
        stated_paths = retrying_paths[N_RETRYING // 2:]
        for failing in [*retrying_paths, breaker_path]:
            receiver.set_behaviour(failing, STATED if failing in stated_paths else "500")
        backoff_eps = create_endpoints(ch, api_key, [receiver.base_url + p for p in retrying_paths[:N_RETRYING // 2]],
                                       ["fail.*"])
        stated_eps = create_endpoints(ch, api_key, [receiver.base_url + p for p in stated_paths], ["later.*"])
        (breaker_ep,) = create_endpoints(ch, api_key, [receiver.base_url + breaker_path], ["brk.*"])
        healthy_eps = create_endpoints(ch, api_key, [f"{base}/ok-{i}" for i in range(N_HEALTHY)], ["order.*"])

        produced: dict[str, float] = {}

        def burst(event_type: str, n: int, eps: list[str]) -> list[str]:
            events = [event(tenant_id, event_type, f'{{"n":{i}}}'.encode()) for i in range(n)]
            at = time.time()
            produce(s, [e.to_json() for e in events], keys=[e.event_id for e in events])
            ids = [delivery_id_for(e.event_id, ep) for e in events for ep in eps]
            produced.update(dict.fromkeys(ids, at))
            return ids

        with SteadyTenant(ch, s, receiver, "rescale", per_s=5) as healthy:
            backoff = burst("fail.x", RETRYING_EVENTS, backoff_eps)
            stated = burst("later.x", RETRYING_EVENTS, stated_eps)
            retrying = backoff + stated
            burst("order.x", HEALTHY_EVENTS, healthy_eps)
            # Every retrying delivery has its timer running: those backing off retried once already.
            def requests_of(d: str) -> int:
                return sum(1 for r in receiver.requests() if r.webhook_id == d)

            eventually(lambda: all(requests_of(d) >= (2 if d in backoff else 1) for d in retrying) or None,
                       timeout=60, what="a first retry of each delivery backing off, a first request of the others")
            burst("brk.x", BREAKER_EVENTS, [breaker_ep])
            eventually(lambda: _breaker_open(job, breaker_ep), timeout=30, what="the breaker open")

            savepoints: list[AtSavepoint] = []
            asked_at: list[float] = []  # when each rescale began
            restored_at: list[float] = []
            # Per rescale, how long the job did not run: from the stop's start to the restored
            # job running (savepoint), or every task of the job not running (in place).
            not_running: list[str] = []
            incarnations: list[tuple[int, str, set[int]]] = []
            for parallelism in (4, 1):
                asked_at.append(time.time())
                if path == "savepoint":
                    job.stop_with_savepoint()
                    time.sleep(2)  # the stopped job's last history writes land
                    savepoints.append(_at_savepoint(job.session, ks, time.time(), retrying, breaker_ep))
                    burst("order.x", HEALTHY_EVENTS, healthy_eps)  # produced while no job runs
                    job_id = job.resume(parallelism)
                    restored_at.append(time.time())
                    not_running.append(f"{restored_at[-1] - asked_at[-1]:.1f} s")
                else:
                    # The job runs on until its next checkpoint: what history says now is at most
                    # as late as what that checkpoint restores.
                    savepoints.append(_at_savepoint(job.session, ks, time.time(), retrying, breaker_ep))
                    burst("order.x", HEALTHY_EVENTS, healthy_eps)  # produced as the rescale is asked for
                    rescaled = job.rescale_in_place(parallelism)
                    job_id = job.job_id()
                    restored_at.append(rescaled.running_at)
                    not_running.append(rescaled.not_running_text())
                incarnations.append((parallelism, job_id, max_parallelism(job_id)))
                sp = savepoints[-1]
                print(f"\nrestored at parallelism {parallelism} ({job_id}, {path}), "
                      f"{restored_at[-1] - asked_at[-1]:.1f} s after the rescale began; max parallelism "
                      f"{incarnations[-1][2]}; breaker then {sp.breaker}, open for "
                      f"{((sp.open_until_ms or 0) / 1000 - time.time()):.0f} s more")
                burst("order.x", HEALTHY_EVENTS, healthy_eps)
                time.sleep(10)  # retries and healthy deliveries at the new parallelism
            restored_last = time.time()

            # The pause of each rescale as the healthy tenant saw it: the longest its endpoint
            # went without a request from the rescale's start until the next one began.
            steady = [r.received_at for r in receiver.requests(healthy.path)]
            silences = []
            for since, until in zip(asked_at, [*asked_at[1:], restored_last], strict=True):
                silence = longest_silence([t for t in steady if t < until], since)
                silences.append(until - since if silence is None else silence)  # none at all: all of it
            for failing in [*retrying_paths, breaker_path]:
                receiver.set_behaviour(failing, "ok")
            how = ("in place (adaptive scheduler, from the next checkpoint)" if path == "adaptive"
                   else "stop-with-savepoint and a new submission")
            result = verdict(f"rescale-2-4-1-{path}", ch, s, receiver, job.session, [tenant_id], since_ms,
                             produced, bound=0, healthy=healthy, timeout=BREAKER_OPEN_S + 120, matrix=MATRIX,
                             pause_s=max(silences), pause_bound_s=RESCALE_PAUSE_BOUND_S,
                             healthy_p99_bound_ms=HEALTHY_P99_BOUND_MS,
                             note=f"parallelism 2 -> 4 -> 1 {how}: the healthy endpoint without a request for "
                                  f"{' and '.join(f'{p:.1f}' for p in silences)} s, the job not running for "
                                  f"{' and '.join(not_running)}; {len(retrying)} "
                                  f"deliveries retrying, {BREAKER_EVENTS} behind an open breaker, max parallelism "
                                  f"{sorted({m for _, _, ms in incarnations for m in ms})}")
        after = _p99_ms(receiver, healthy.produced, since=restored_last)
        print(f"healthy first-attempt p99: whole run {result.healthy_p99_ms:.0f} ms, after the last restore "
              f"{after if after is None else round(after)} ms")

        # Nothing lost, no delivery received again after an accepted request; the healthy
        # tenant's p99 and the pause within their bounds (the line names any over).
        assert result.passed, result.line()
        assert result.duplicates == 0, result.line()

        # Every retry keeps its schedule: in history, no attempt starts sooner after the previous
        # one ended than the shortest back-off; after each savepoint, no attempt (history) and no
        # request (receiver) before the next attempt time the delivery had then.
        min_gap = RetrySchedule.from_settings(s.dispatch).min_delay_ms
        early: list[str] = []
        for d in retrying:
            attempts = _attempts(job.session, ks, d)
            gap = RETRY_AFTER_S * 1000 if d in stated else min_gap
            early += [f"{d} #{n2}: {start2 - end1} ms after #{n1} ended" for (n1, _, end1), (n2, start2, _)
                      in zip(attempts, attempts[1:], strict=False) if start2 - end1 < gap]
            received = [r.received_at * 1000 for r in receiver.requests() if r.webhook_id == d]
            for sp in savepoints:
                last, next_ms = sp.retries[d]
                assert next_ms is not None, f"{d}: no next attempt time at the savepoint"
                early += [f"{d} #{n}: started {next_ms - start} ms before its time at the savepoint"
                          for n, start, _ in attempts if n > last and start < next_ms]
                early += [f"{d}: a request {next_ms - t:.0f} ms before its time at the savepoint"
                          for t in received if sp.stopped_at * 1000 <= t < next_ms]
        # The checks had something to check: at each restore some timer was still running.
        for sp, running in zip(savepoints, restored_at, strict=True):
            outliving = [d for d, (_, next_ms) in sp.retries.items() if next_ms and next_ms > running * 1000]
            assert outliving, "no retry was due after the restore: nothing tested; raise RETRY_AFTER_S"
        offenders = sorted({e.split(" ", 1)[0].rstrip(":") for e in early})[:3]
        assert not early, (f"attempts earlier than their back-off: {early[:5]}; savepoints "
                           f"{[(sp.stopped_at, {d: sp.retries[d] for d in offenders}) for sp in savepoints]}; "
                           f"their attempt rows {[(d, _attempt_rows(job.session, ks, d)) for d in offenders]}")

        # The breaker was open at each savepoint and sent nothing after the restore until its
        # recorded open period ended.
        breaker_requests = [r.received_at * 1000 for r in receiver.requests(breaker_path)]
        for sp, running in zip(savepoints, restored_at, strict=True):
            assert sp.breaker == "open" and sp.open_until_ms is not None, sp
            assert running * 1000 < sp.open_until_ms, (
                f"the restore ran {running - sp.open_until_ms / 1000:.0f} s after the breaker's open period "
                "ended: nothing tested; raise BREAKER_OPEN_S")
            too_soon = [t for t in breaker_requests if sp.stopped_at * 1000 <= t < sp.open_until_ms]
            assert not too_soon, (f"the breaker endpoint got {len(too_soon)} requests after the restore, "
                                  f"{(sp.open_until_ms - min(too_soon)) / 1000:.1f} s before its open period ended")
