"""The per-endpoint state machine of core/dispatch.py, with a fixed clock and a stub rng.

PERSIST --> READY --> SENDING --> RECORDING --> READY (retry) | removed (final)
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from core import breaker as brk
from core import ratelimit
from core.dispatch import (
    EndpointQueue,
    Limits,
    Pending,
    SendReport,
    Stage,
    adopt_orphans,
    after_record_written,
    after_write_failed,
    apply_result,
    expire_if_past_deadline,
    is_due,
    plan,
    start_sending,
)
from core.fanout import NewDelivery
from core.outcomes import ErrorClass, HttpResult
from core.records import EventRecord
from core.retry import RetrySchedule

E = ErrorClass
NOW = 1_700_000_000_000
DAY_MS = 24 * 3600 * 1000
ME = "inc-2"  # this incarnation
OLD = "inc-1"  # the one a restore replaced

SCHEDULE = RetrySchedule(base_s=5.0, cap_s=3600.0, max_attempts=5, deadline_s=24 * 3600.0, max_retry_after_s=3600.0)
BREAKER_CFG = brk.BreakerConfig(failure_threshold=5, fast_failure_threshold=2, open_s=30.0, max_open_s=600.0)
LIMITS = Limits(max_in_flight=8)


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


HALF = FixedRandom(0.5)  # backoff after try n = 0.5 * 5 s * 2**(n-1): 2500, 5000, 10000 ms ...

EVENT = EventRecord(
    event_id="evt_1", tenant_id="t_1", event_type="invoice.paid", schema_version="2026-01-01",
    object_id="", object_version=0, occurred_at_ms=NOW, payload=b"{}",
)


def delivery(did: str = "dlv_1", created_at_ms: int = NOW) -> NewDelivery:
    return NewDelivery(
        delivery_id=did, event=EVENT, endpoint_id="ep_1", tenant_id="t_1", endpoint_config_version=1,
        created_at_ms=created_at_ms, expires_at_ms=created_at_ms + DAY_MS,
    )


def pending(did: str = "dlv_1", created_at_ms: int = NOW, **changes: Any) -> Pending:
    """A READY delivery, due now unless told otherwise."""
    base = Pending(delivery=delivery(did, created_at_ms), stage=Stage.READY, next_attempt_at_ms=NOW)
    return replace(base, **changes)


def open_breaker(at_ms: int = NOW) -> brk.BreakerState:
    """Opened by two TLS failures at ``at_ms``; lets a probe through 30 s later."""
    state = brk.CLOSED
    for _ in range(2):
        state = brk.on_failure(state, at_ms, True, BREAKER_CFG)
    assert state.state is brk.CircuitState.OPEN and state.open_until_ms == at_ms + 30_000
    return state


# -- adopting work after a restore ---------------------------------------------------------------

ADOPT_TABLE = [
    # before                                                         -> after
    (pending(stage=Stage.SENDING, owner=OLD, next_attempt_at_ms=NOW - 9000),
     pending(stage=Stage.READY, owner="", next_attempt_at_ms=NOW)),
    # a manual send that was in flight is owed again, as a manual request
    (pending(stage=Stage.SENDING, owner=OLD, sending_manual=True, auto_retry_active=False),
     pending(stage=Stage.READY, owner="", manual_requests=1, sending_manual=False, auto_retry_active=False)),
    (pending(stage=Stage.SENDING, owner=OLD, sending_manual=True, manual_requests=2, auto_retry_active=False),
     pending(stage=Stage.READY, owner="", manual_requests=3, sending_manual=False, auto_retry_active=False)),
    # idempotent writes are simply redone
    (pending(stage=Stage.PERSIST, owner=OLD), pending(stage=Stage.PERSIST, owner="")),
    (pending(stage=Stage.RECORDING, owner=OLD, attempt_count=2),
     pending(stage=Stage.RECORDING, owner="", attempt_count=2)),
    # this incarnation's own work, and work not started, are left alone
    (pending(stage=Stage.SENDING, owner=ME, next_attempt_at_ms=NOW - 9000),
     pending(stage=Stage.SENDING, owner=ME, next_attempt_at_ms=NOW - 9000)),
    (pending(stage=Stage.PERSIST, owner=ME), pending(stage=Stage.PERSIST, owner=ME)),
    (pending(stage=Stage.RECORDING, owner=ME), pending(stage=Stage.RECORDING, owner=ME)),
    (pending(next_attempt_at_ms=NOW + 5000), pending(next_attempt_at_ms=NOW + 5000)),
]


@pytest.mark.parametrize(("before", "after"), ADOPT_TABLE)
def test_adopt_orphans(before: Pending, after: Pending) -> None:
    assert adopt_orphans(before, ME, NOW) == after


def test_an_adopted_send_is_due_now() -> None:
    adopted = adopt_orphans(pending(stage=Stage.SENDING, owner=OLD, next_attempt_at_ms=NOW + 60_000), ME, NOW)
    assert is_due(adopted, NOW)


def test_adopting_a_manual_send_keeps_the_automatic_schedule() -> None:
    # The manual send is owed again, but the automatic try stays where it was.
    before = pending(stage=Stage.SENDING, owner=OLD, sending_manual=True, next_attempt_at_ms=NOW + 600_000)
    adopted = adopt_orphans(before, ME, NOW)
    assert (adopted.manual_requests, adopted.next_attempt_at_ms) == (1, NOW + 600_000)
    assert is_due(adopted, NOW)


# -- due -----------------------------------------------------------------------------------------

DUE_TABLE = [
    (pending(), True),
    (pending(next_attempt_at_ms=NOW - 1), True),
    (pending(next_attempt_at_ms=NOW + 1), False),
    (pending(next_attempt_at_ms=NOW + 1, manual_requests=1), True),  # a person is waiting
    (pending(auto_retry_active=False), False),  # finished; only a replay sends it again
    (pending(auto_retry_active=False, manual_requests=1), True),
    (pending(stage=Stage.PERSIST), False),
    (pending(stage=Stage.SENDING, manual_requests=1), False),
    (pending(stage=Stage.RECORDING), False),
]


@pytest.mark.parametrize(("p", "due"), DUE_TABLE)
def test_is_due(p: Pending, due: bool) -> None:
    assert is_due(p, NOW) is due


# -- plan: capacity ------------------------------------------------------------------------------

def ready(n: int, **changes: Any) -> list[Pending]:
    return [pending(f"dlv_{i}", next_attempt_at_ms=NOW - 1000 + i, **changes) for i in range(n)]


CAPACITY_TABLE = [
    # due  max_in_flight  in_flight  granted  -> sent  wanting
    (5, 8, 0, 8, 5, 0),
    (5, 3, 0, 8, 3, 2),  # the endpoint's cap
    (5, 3, 1, 8, 2, 3),  # ...minus what is already in flight
    (5, 3, 3, 8, 0, 5),
    (5, 3, 7, 8, 0, 5),  # over the cap (config lowered): nothing, never negative
    (5, 8, 0, 2, 2, 3),  # the fair scheduler's grant
    (5, 8, 0, 0, 0, 5),
    (0, 8, 0, 8, 0, 0),
]


@pytest.mark.parametrize(("n", "max_in_flight", "in_flight", "granted", "sent", "wanting"), CAPACITY_TABLE)
def test_plan_honours_the_cap_and_the_grant(
    n: int, max_in_flight: int, in_flight: int, granted: int, sent: int, wanting: int
) -> None:
    out, _, _ = plan(ready(n), in_flight, Limits(max_in_flight), brk.CLOSED, None, NOW, granted)
    assert out.send == [f"dlv_{i}" for i in range(sent)]  # oldest first
    assert out.wanting_slots == wanting


def test_plan_orders_manual_first_then_oldest() -> None:
    pendings = [
        pending("new", next_attempt_at_ms=NOW),
        pending("old", next_attempt_at_ms=NOW - 50_000),
        pending("manual", next_attempt_at_ms=NOW + 90_000, manual_requests=1),
        pending("older", next_attempt_at_ms=NOW - 90_000),
        pending("later", next_attempt_at_ms=NOW + 1),
    ]
    out, _, _ = plan(pendings, 0, LIMITS, brk.CLOSED, None, NOW, 8)
    assert out.send == ["manual", "older", "old", "new"]
    assert out.wake_at_ms == NOW + 1  # the one not yet due


def test_plan_wakes_at_the_earliest_future_try() -> None:
    pendings = [pending("a", next_attempt_at_ms=NOW + 7000), pending("b", next_attempt_at_ms=NOW + 3000),
                pending("done", next_attempt_at_ms=NOW + 1, auto_retry_active=False)]
    out, _, _ = plan(pendings, 0, LIMITS, brk.CLOSED, None, NOW, 8)
    assert (out.send, out.wake_at_ms) == ([], NOW + 3000)


# -- plan: the breaker ---------------------------------------------------------------------------


def test_an_open_breaker_holds_automatic_sends_until_the_probe() -> None:
    breaker = open_breaker(NOW - 10_000)
    out, after, _ = plan(ready(3), 0, LIMITS, breaker, None, NOW, 8)
    assert out.send == []
    assert out.wake_at_ms == NOW + 20_000  # open_until
    assert after == breaker


def test_once_open_time_passed_exactly_one_probe_goes() -> None:
    breaker = open_breaker(NOW - 30_000)
    out, after, _ = plan(ready(3), 0, LIMITS, breaker, None, NOW, 8)
    assert out.send == ["dlv_0"]
    assert after.state is brk.CircuitState.HALF_OPEN and after.probe_started_ms == NOW


def test_manual_bypasses_an_open_breaker_but_not_the_cap() -> None:
    pendings = ready(2) + [pending(f"m{i}", manual_requests=1) for i in (1, 2, 3)]
    out, after, _ = plan(pendings, 0, Limits(max_in_flight=2), open_breaker(), None, NOW, 8)
    assert out.send == ["m1", "m2"]
    assert out.wanting_slots == 3
    assert after == open_breaker()  # a manual send is no probe


def test_manual_can_be_made_to_respect_the_breaker() -> None:
    limits = Limits(max_in_flight=8, manual_bypasses_breaker=False)
    out, _, _ = plan([pending("m", manual_requests=1)], 0, limits, open_breaker(), None, NOW, 8)
    assert out.send == []
    assert out.wake_at_ms == NOW + 30_000


# -- plan: the token bucket ----------------------------------------------------------------------


def test_the_token_bucket_limits_sends() -> None:
    bucket = ratelimit.new_bucket(2.0, NOW)  # burst 2, then one every 500 ms
    out, _, after = plan(ready(5), 0, LIMITS, brk.CLOSED, bucket, NOW, 8)
    assert out.send == ["dlv_0", "dlv_1"]
    assert out.wake_at_ms == NOW + 500
    assert after is not None and after.tokens == 0
    out, _, after = plan(ready(5)[2:], 0, LIMITS, brk.CLOSED, after, NOW + 500, 8)
    assert out.send == ["dlv_2"]


def test_an_unlimited_bucket_never_holds_back() -> None:
    bucket = ratelimit.new_bucket(None, NOW)
    out, _, _ = plan(ready(5), 0, LIMITS, brk.CLOSED, bucket, NOW, 8)
    assert len(out.send) == 5


def test_an_empty_bucket_does_not_spend_the_breaker_probe() -> None:
    # The probe slot is taken only by a request that really goes: otherwise the breaker would
    # wait for a probe that was never sent, a whole open period longer.
    breaker = open_breaker(NOW - 30_000)
    empty = ratelimit.TokenBucket(rate_per_s=1.0, burst=1.0, tokens=0.0, updated_ms=NOW)
    out, after, _ = plan(ready(1), 0, LIMITS, breaker, empty, NOW, 8)
    assert out.send == []
    assert out.wake_at_ms == NOW + 1000
    assert after == breaker
    out, after, _ = plan(ready(1), 0, LIMITS, after, replace(empty, tokens=1.0), NOW + 1000, 8)
    assert out.send == ["dlv_0"] and after.state is brk.CircuitState.HALF_OPEN


# -- plan: history writes ------------------------------------------------------------------------

WRITES_TABLE = [
    # pending                                                              -> persist  record  wake
    (pending(stage=Stage.PERSIST), ["dlv_1"], [], None),
    (pending(stage=Stage.RECORDING), [], ["dlv_1"], None),
    (pending(stage=Stage.PERSIST, owner=ME), [], [], None),  # already being written
    (pending(stage=Stage.RECORDING, owner=ME), [], [], None),
    (pending(stage=Stage.PERSIST, write_retry_at_ms=NOW + 2000), [], [], NOW + 2000),  # backing off
    (pending(stage=Stage.RECORDING, write_retry_at_ms=NOW + 2000), [], [], NOW + 2000),
    (pending(stage=Stage.RECORDING, write_retry_at_ms=NOW), [], ["dlv_1"], None),  # back-off over
    (pending(stage=Stage.SENDING, owner=ME), [], [], None),
]


@pytest.mark.parametrize(("p", "persist", "record", "wake"), WRITES_TABLE)
def test_plan_history_writes(p: Pending, persist: list[str], record: list[str], wake: int | None) -> None:
    out, _, _ = plan([p], 0, LIMITS, brk.CLOSED, None, NOW, 8)
    assert (out.persist, out.record, out.send, out.wake_at_ms) == (persist, record, [], wake)


def test_writes_are_not_limited_by_send_capacity() -> None:
    pendings = [pending(f"p{i}", stage=Stage.PERSIST) for i in range(3)] + ready(3)
    out, _, _ = plan(pendings, 8, LIMITS, open_breaker(), None, NOW, 0)
    assert out.persist == ["p0", "p1", "p2"] and out.send == []


# -- start_sending -------------------------------------------------------------------------------


def test_start_sending_marks_owner_and_consumes_one_manual_request() -> None:
    p = start_sending(pending(manual_requests=2), ME)
    assert (p.stage, p.owner, p.sending_manual, p.manual_requests) == (Stage.SENDING, ME, True, 1)
    p = start_sending(pending(), ME)
    assert (p.stage, p.owner, p.sending_manual, p.manual_requests) == (Stage.SENDING, ME, False, 0)


# -- apply_result --------------------------------------------------------------------------------


def sending(attempt_count: int = 0, created_at_ms: int = NOW, **changes: Any) -> Pending:
    return replace(pending(created_at_ms=created_at_ms, attempt_count=attempt_count, **changes),
                   stage=Stage.SENDING, owner=ME)


def report(result: HttpResult, at_ms: int = NOW) -> SendReport:
    return SendReport(result=result, started_at_ms=at_ms - 40, finished_at_ms=at_ms,
                      url="https://example.com/ep_1", endpoint_config_version=1, latency_ms=40)


# (name, pending, result, finished at) -> (outcome, delivery status, next attempt, auto active,
#                                         error class, disable endpoint, stays in state after record)
RESULT_TABLE: list[tuple[str, Pending, HttpResult, int, tuple[Any, ...]]] = [
    ("200", sending(), HttpResult(200), NOW,
     ("succeeded", "succeeded", None, False, None, False, False)),
    ("204 after retries", sending(3), HttpResult(204), NOW,
     ("succeeded", "succeeded", None, False, None, False, False)),
    ("500 first try", sending(), HttpResult(500), NOW,
     ("retry", "pending", NOW + 2500, True, "http_5xx", False, True)),
    ("500 third try", sending(2), HttpResult(500), NOW,
     ("retry", "pending", NOW + 10_000, True, "http_5xx", False, True)),
    ("timeout", sending(), HttpResult(None, E.TIMEOUT), NOW,
     ("retry", "pending", NOW + 2500, True, "timeout", False, True)),
    ("429 Retry-After", sending(), HttpResult(429, retry_after="60"), NOW,
     ("retry", "pending", NOW + 60_000, True, "http_429", False, True)),
    ("404", sending(), HttpResult(404), NOW,
     ("failed", "failed", None, False, "http_4xx", False, False)),
    ("301", sending(), HttpResult(301), NOW,
     ("failed", "failed", None, False, "redirect", False, False)),
    ("egress refused", sending(), HttpResult(None, E.EGRESS_REFUSED), NOW,
     ("failed", "failed", None, False, "egress_refused", False, False)),
    ("410", sending(), HttpResult(410), NOW,
     ("failed", "failed", None, False, "gone", True, False)),
    ("500 on the last allowed try", sending(SCHEDULE.max_attempts - 1), HttpResult(500), NOW,
     ("failed", "failed", None, False, "http_5xx", False, False)),
    ("500 with the next try past the deadline", sending(created_at_ms=NOW - DAY_MS + 1000), HttpResult(500), NOW,
     ("expired", "expired", None, False, "http_5xx", False, False)),
    # A manual replay of a finished delivery is one more try, nothing else: whatever its answer,
    # automatic retries stay off and the 24 h deadline does not come back.
    ("manual on finished: 500", sending(4, auto_retry_active=False, sending_manual=True), HttpResult(500), NOW,
     ("failed", "failed", None, False, "http_5xx", False, False)),
    ("manual on finished: 500 days later",
     sending(1, created_at_ms=NOW - 3 * DAY_MS, auto_retry_active=False, sending_manual=True), HttpResult(500), NOW,
     ("failed", "failed", None, False, "http_5xx", False, False)),
    ("manual on finished: 200", sending(4, auto_retry_active=False, sending_manual=True), HttpResult(200), NOW,
     ("succeeded", "succeeded", None, False, None, False, False)),
    ("manual on finished: 404", sending(4, auto_retry_active=False, sending_manual=True), HttpResult(404), NOW,
     ("failed", "failed", None, False, "http_4xx", False, False)),
    # A manual replay while automatic retries run: the automatic schedule carries on untouched.
    ("manual while auto: 500", sending(2, next_attempt_at_ms=NOW + 600_000, sending_manual=True), HttpResult(500), NOW,
     ("failed", "pending", NOW + 600_000, True, "http_5xx", False, True)),
    ("manual while auto: 404", sending(2, next_attempt_at_ms=NOW + 600_000, sending_manual=True), HttpResult(404), NOW,
     ("failed", "pending", NOW + 600_000, True, "http_4xx", False, True)),
    ("manual while auto: 200", sending(2, next_attempt_at_ms=NOW + 600_000, sending_manual=True), HttpResult(200), NOW,
     ("succeeded", "succeeded", None, False, None, False, False)),
    ("manual while auto: 410", sending(2, next_attempt_at_ms=NOW + 600_000, sending_manual=True), HttpResult(410), NOW,
     ("failed", "failed", None, False, "gone", True, False)),
]


@pytest.mark.parametrize(("p", "result", "at_ms", "expected"), [r[1:] for r in RESULT_TABLE],
                         ids=[r[0] for r in RESULT_TABLE])
def test_apply_result(p: Pending, result: HttpResult, at_ms: int, expected: tuple[Any, ...]) -> None:
    outcome, status, next_at, auto, error_class, disable, stays = expected
    after, _ = apply_result(p, report(result, at_ms), brk.CLOSED, BREAKER_CFG, SCHEDULE, HALF)
    r = after.record
    assert r is not None
    assert (r.outcome, r.delivery_status, r.next_attempt_at_ms, r.auto_retry_active, r.error_class,
            r.disable_endpoint) == (outcome, status, next_at, auto, error_class, disable)
    assert (r.attempt_number, r.manual, r.http_status) == (p.attempt_count + 1, p.sending_manual, result.status)
    assert (r.started_at_ms, r.finished_at_ms, r.latency_ms) == (at_ms - 40, at_ms, 40)
    assert (after.stage, after.owner, after.attempt_count, after.sending_manual) == (
        Stage.RECORDING, "", p.attempt_count + 1, False)
    assert after.auto_retry_active is auto
    if next_at is not None:
        assert after.next_attempt_at_ms == next_at

    written = after_record_written(after)
    if stays:
        assert written is not None
        assert (written.stage, written.record) == (Stage.READY, None)
        assert is_due(written, next_at - 1) is False and is_due(written, next_at) is True
    else:
        assert written is None


def test_a_queued_replay_keeps_a_finished_delivery_in_state() -> None:
    after, _ = apply_result(sending(manual_requests=1), report(HttpResult(404)), brk.CLOSED, BREAKER_CFG,
                            SCHEDULE, HALF)
    written = after_record_written(after)
    assert written is not None and written.stage is Stage.READY and is_due(written, NOW)


def test_a_finished_manual_replay_does_not_restart_automatic_sends() -> None:
    after, _ = apply_result(sending(4, auto_retry_active=False, sending_manual=True), report(HttpResult(503)),
                            brk.CLOSED, BREAKER_CFG, SCHEDULE, HALF)
    assert after_record_written(after) is None
    assert not is_due(replace(after, stage=Stage.READY), NOW + DAY_MS)


# -- apply_result: the breaker -------------------------------------------------------------------


def run_results(results: list[HttpResult], breaker: brk.BreakerState = brk.CLOSED) -> brk.BreakerState:
    for i, result in enumerate(results):
        _, breaker = apply_result(sending(i), report(result, NOW + i), breaker, BREAKER_CFG, SCHEDULE, HALF)
    return breaker


BREAKER_TABLE = [
    # results, each on a fresh try                          -> breaker state
    ([HttpResult(500)] * 4, brk.CircuitState.CLOSED),
    ([HttpResult(500)] * 5, brk.CircuitState.OPEN),
    ([HttpResult(None, E.TIMEOUT)] * 5, brk.CircuitState.OPEN),
    ([HttpResult(None, E.TLS)] * 2, brk.CircuitState.OPEN),  # fast
    ([HttpResult(None, E.DNS)] * 2, brk.CircuitState.OPEN),
    ([HttpResult(None, E.TLS)], brk.CircuitState.CLOSED),
    ([HttpResult(404)] * 20, brk.CircuitState.CLOSED),  # it answered: it is up
    ([HttpResult(410)] * 20, brk.CircuitState.CLOSED),
    ([HttpResult(301)] * 20, brk.CircuitState.CLOSED),
    ([HttpResult(None, E.EGRESS_REFUSED)] * 20, brk.CircuitState.CLOSED),  # never sent
    ([HttpResult(None, E.INTERNAL)] * 20, brk.CircuitState.CLOSED),  # our bug
    ([HttpResult(500)] * 4 + [HttpResult(200)] + [HttpResult(500)] * 4, brk.CircuitState.CLOSED),
    ([HttpResult(500)] * 4 + [HttpResult(404)] + [HttpResult(500)], brk.CircuitState.OPEN),  # no reset
]


@pytest.mark.parametrize(("results", "state"), BREAKER_TABLE)
def test_apply_result_drives_the_breaker(results: list[HttpResult], state: brk.CircuitState) -> None:
    assert run_results(results).state is state


def test_a_successful_probe_closes_the_breaker() -> None:
    _, half_open = brk.allow(open_breaker(NOW - 30_000), NOW)
    assert run_results([HttpResult(200)], half_open) == brk.CLOSED


def test_a_manual_success_while_open_closes_the_breaker() -> None:
    _, breaker = apply_result(sending(sending_manual=True), report(HttpResult(200)), open_breaker(),
                              BREAKER_CFG, SCHEDULE, HALF)
    assert breaker == brk.CLOSED


# -- expiry while waiting ------------------------------------------------------------------------

EXPIRE_TABLE = [
    # pending                                                             now                 -> expired
    (pending(), NOW + DAY_MS - 1, False),
    (pending(), NOW + DAY_MS, True),
    (pending(), NOW + 2 * DAY_MS, True),
    (pending(manual_requests=1), NOW + 2 * DAY_MS, False),  # a person asked: send it
    (pending(auto_retry_active=False), NOW + 2 * DAY_MS, False),  # already finished
    (pending(stage=Stage.SENDING, owner=ME), NOW + 2 * DAY_MS, False),  # its result decides
    (pending(stage=Stage.PERSIST), NOW + 2 * DAY_MS, False),
    (pending(stage=Stage.RECORDING), NOW + 2 * DAY_MS, False),
]


@pytest.mark.parametrize(("p", "now_ms", "expired"), EXPIRE_TABLE)
def test_expire_if_past_deadline(p: Pending, now_ms: int, expired: bool) -> None:
    after = expire_if_past_deadline(p, now_ms)
    if not expired:
        assert after is p
        return
    r = after.record
    assert r is not None
    assert (after.stage, after.owner, after.auto_retry_active) == (Stage.RECORDING, "", False)
    assert (r.attempt_number, r.http_status, r.outcome, r.delivery_status, r.next_attempt_at_ms) == (
        0, None, "expired", "expired", None)
    assert (r.started_at_ms, r.finished_at_ms, r.manual) == (now_ms, now_ms, False)
    assert after_record_written(after) is None


# -- history write failures ----------------------------------------------------------------------

BACKOFF_TABLE = [
    # failures so far  -> retry after ms
    (0, 500),
    (1, 1000),
    (2, 2000),
    (5, 16_000),
    (6, 32_000),
    (7, 60_000),  # capped
    (8, 60_000),
    (1000, 60_000),
]


@pytest.mark.parametrize("stage", [Stage.RECORDING, Stage.PERSIST])
@pytest.mark.parametrize(("failures", "delay_ms"), BACKOFF_TABLE)
def test_write_failures_back_off_and_are_capped(stage: Stage, failures: int, delay_ms: int) -> None:
    p = pending(stage=stage, owner=ME, write_failures=failures)
    after = after_write_failed(p, NOW)
    assert (after.stage, after.owner, after.write_failures, after.write_retry_at_ms) == (
        stage, "", failures + 1, NOW + delay_ms)


def test_a_failed_record_write_is_retried_with_its_record() -> None:
    after, _ = apply_result(sending(), report(HttpResult(200)), brk.CLOSED, BREAKER_CFG, SCHEDULE, HALF)
    failed = after_write_failed(replace(after, owner=ME), NOW)
    assert failed.record == after.record
    out, _, _ = plan([failed], 0, LIMITS, brk.CLOSED, None, NOW + 499, 8)
    assert (out.record, out.wake_at_ms) == ([], NOW + 500)
    out, _, _ = plan([failed], 0, LIMITS, brk.CLOSED, None, NOW + 500, 8)
    assert out.record == ["dlv_1"]


def test_a_new_result_resets_the_write_backoff() -> None:
    p = replace(sending(), write_failures=6, write_retry_at_ms=NOW + 30_000)
    after, _ = apply_result(p, report(HttpResult(500)), brk.CLOSED, BREAKER_CFG, SCHEDULE, HALF)
    assert (after.write_failures, after.write_retry_at_ms) == (0, 0)


# -- EndpointQueue: the in-memory index over one endpoint's pending deliveries -----------------


def _ids(ps: list[Pending]) -> list[str]:
    return [p.delivery.delivery_id for p in ps]


def test_queue_hands_out_due_deliveries_oldest_first_up_to_the_limit():
    q = EndpointQueue()
    for i, at in enumerate([NOW + 50, NOW - 10, NOW - 30, NOW]):
        q.put(pending(f"d{i}", stage=Stage.READY, next_attempt_at_ms=at))
    got, next_at = q.candidates(NOW, limit=2)
    assert _ids(got) == ["d2", "d1"]
    assert next_at == NOW  # d3 is due now and was left for the next call
    got, next_at = q.candidates(NOW, limit=5)
    assert _ids(got) == ["d3"] and next_at == NOW + 50


def test_queue_skips_stale_entries_and_never_returns_a_delivery_twice():
    q = EndpointQueue()
    q.put(pending("a", stage=Stage.READY, next_attempt_at_ms=NOW - 5))
    q.put(pending("a", stage=Stage.READY, next_attempt_at_ms=NOW - 5))  # same entry twice
    q.put(pending("b", stage=Stage.READY, next_attempt_at_ms=NOW - 9))
    q.put(pending("b", stage=Stage.SENDING, owner="me"))  # b moved on: its heap entry is stale
    got, _ = q.candidates(NOW, limit=10)
    assert _ids(got) == ["a"]


def test_queue_lists_unowned_writes_and_manual_replays_regardless_of_time():
    q = EndpointQueue()
    q.put(pending("w", stage=Stage.PERSIST))
    q.put(pending("owned", stage=Stage.PERSIST, owner="me"))
    q.put(pending("m", stage=Stage.READY, next_attempt_at_ms=NOW + 10_000, manual_requests=1,
                  auto_retry_active=False))
    q.put(pending("later", stage=Stage.READY, next_attempt_at_ms=NOW + 10_000))
    got, next_at = q.candidates(NOW, limit=0)
    assert sorted(_ids(got)) == ["m", "w"]
    assert next_at == NOW + 10_000
    assert q.has_due(NOW) and q.due_kind(NOW) == "new"


def test_queue_put_back_makes_an_unsent_delivery_due_again():
    q = EndpointQueue()
    q.put(pending("a", stage=Stage.READY, next_attempt_at_ms=NOW, attempt_count=2))
    (p,), _ = q.candidates(NOW, limit=1)
    assert not q.has_due(NOW)
    q.put(p)
    assert q.has_due(NOW) and q.due_kind(NOW) == "retry" and q.oldest_due(NOW) == NOW


def test_queue_remove_forgets_the_delivery():
    q = EndpointQueue()
    q.put(pending("a", stage=Stage.READY, next_attempt_at_ms=NOW))
    q.remove("a")
    assert len(q) == 0 and q.candidates(NOW, 5) == ([], None)
