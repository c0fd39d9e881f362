"""One delivery's transitions in core/dispatch.py, with a fixed clock and a stub rng.

CHECK -> PERSIST | RESERVE -> READY -> SENDING -> RECORDING -> READY (retry) | removed (final)
"""

from __future__ import annotations

import random
import uuid
from dataclasses import replace
from typing import Any

import pytest

from core import breaker as brk
from core.dispatch import (
    DurableRecord,
    Intent,
    ManualRequest,
    Pending,
    SendReport,
    Stage,
    adopt,
    after_check,
    after_record_written,
    after_reserved,
    after_write_failed,
    apply_result,
    end_without_sending,
    is_due,
    manual_not_sent,
    new_attempt_id,
    send_not_started,
    start_sending,
    with_next_intent,
)
from core.fanout import NewDelivery
from core.outcomes import ErrorClass, HttpResult
from core.records import EventRecord
from core.retry import RetrySchedule

E = ErrorClass
NOW = 1_700_000_000_000
DAY_MS = 24 * 3600 * 1000

SCHEDULE = RetrySchedule(base_s=5.0, cap_s=3600.0, max_attempts=5, deadline_s=24 * 3600.0, max_retry_after_s=3600.0)
BREAKER_CFG = brk.BreakerConfig(failure_threshold=5, fast_failure_threshold=2, open_s=30.0, max_open_s=600.0)


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


HALF = FixedRandom(0.5)  # backoff after try n = 0.5 * 5 s * 2**(n-1): 2500, 5000, 10000 ms ...

EVENT = EventRecord(
    event_id="evt_1", tenant_id="t_1", event_type="invoice.paid", schema_version="2026-01-01",
    object_id="", object_version=0, occurred_at_ms=NOW, payload=b"",
)
ASKED = ManualRequest("req-1", "alice@t_1", NOW - 1000, "t_1")


def delivery(did: str = "dlv_1", created_at_ms: int = NOW) -> NewDelivery:
    return NewDelivery(
        delivery_id=did, event=EVENT, endpoint_id="ep_1", tenant_id="t_1", endpoint_config_version=1,
        created_at_ms=created_at_ms, expires_at_ms=created_at_ms + DAY_MS,
    )


def pending(did: str = "dlv_1", created_at_ms: int = NOW, **changes: Any) -> Pending:
    """A READY delivery holding reserved attempt row 1, due now unless told otherwise."""
    base = Pending(delivery=delivery(did, created_at_ms), stage=Stage.READY, next_attempt_at_ms=NOW,
                   intent=Intent(1, "a-1"))
    return replace(base, **changes)


def sending(attempt_count: int = 0, created_at_ms: int = NOW, manual: bool = False, **changes: Any) -> Pending:
    p = pending(created_at_ms=created_at_ms, attempt_count=attempt_count, issued=attempt_count,
                intent=Intent(attempt_count + 1, f"a-{attempt_count + 1}"),
                manual=(ASKED,) if manual else (), **changes)
    return start_sending(p)


def report(result: HttpResult, at_ms: int = NOW) -> SendReport:
    return SendReport(result=result, started_at_ms=at_ms - 40, finished_at_ms=at_ms,
                      url="https://example.com/ep_1", endpoint_config_version=1, latency_ms=40)


def open_breaker(at_ms: int = NOW) -> brk.BreakerState:
    """Opened by two TLS failures at ``at_ms``; lets a probe through 30 s later."""
    state = brk.CLOSED
    for _ in range(2):
        state = brk.on_failure(state, at_ms, True, BREAKER_CFG)
    assert state.state is brk.CircuitState.OPEN and state.open_until_ms == at_ms + 30_000
    return state


# -- attempt ids ---------------------------------------------------------------------------------


def test_attempt_ids_are_time_uuids_from_the_injected_clock_and_rng() -> None:
    a = uuid.UUID(new_attempt_id(NOW, random.Random(1)))
    b = uuid.UUID(new_attempt_id(NOW + 1, random.Random(1)))
    assert a.version == 1 and b.version == 1
    assert (a.time - 0x01B21DD213814000) // 10_000 == NOW
    assert b.time > a.time
    assert new_attempt_id(NOW, random.Random(1)) == new_attempt_id(NOW, random.Random(1))
    assert new_attempt_id(NOW, random.Random(1)) != new_attempt_id(NOW, random.Random(2))


# -- restore: what keyed state keeps, and CHECK ----------------------------------------------------


def test_adoption_checks_first_and_owes_an_interrupted_manual_send_again() -> None:
    adopted = adopt(sending(2, manual=True))
    assert (adopted.stage, adopted.busy, adopted.intent, adopted.record, adopted.sending_manual) == (
        Stage.CHECK, False, None, None, None)
    assert adopted.manual == (ASKED,)


CHECK_TABLE = [
    # durable record                                            -> stage, issued, attempt_count, auto
    (DurableRecord(status=None), (Stage.PERSIST, 0, 0, True)),
    (DurableRecord(status=None, max_attempt_number=1), (Stage.PERSIST, 1, 0, True)),
    (DurableRecord("pending", 1, NOW + 5000, True, 2), (Stage.RESERVE, 2, 1, True)),
    (DurableRecord("succeeded", 1, None, False, 1), None),  # already final: never sent again
    (DurableRecord("failed", 3, None, False, 3), None),
    (DurableRecord("expired", 3, None, False, 4), None),
]


@pytest.mark.parametrize(("durable", "expected"), CHECK_TABLE)
def test_after_check(durable: DurableRecord, expected: tuple[Any, ...] | None) -> None:
    p = replace(adopt(pending(intent=None)), next_attempt_at_ms=NOW)
    after = after_check(p, durable, random.Random(0), NOW)
    if expected is None:
        assert after is None
        return
    assert after is not None
    assert (after.stage, after.issued, after.attempt_count, after.auto_retry_active) == expected
    if after.stage is Stage.PERSIST:
        assert after.intent is not None and after.intent.number == durable.max_attempt_number + 1
    else:
        assert after.intent is None and after.next_attempt_at_ms == NOW + 5000


def test_a_final_delivery_with_a_waiting_manual_request_is_kept_for_it() -> None:
    p = replace(adopt(pending(intent=None)), manual=(ASKED,))
    after = after_check(p, DurableRecord("succeeded", 1, None, False, 1), random.Random(0), NOW)
    assert after is not None and (after.stage, after.auto_retry_active, after.issued) == (Stage.RESERVE, False, 1)


def test_numbers_are_never_reused_through_reserve_and_send() -> None:
    p = replace(pending(intent=None, issued=3), stage=Stage.RESERVE)
    assert p.intent is None
    from core.dispatch import reserve

    r = reserve(p, random.Random(0), NOW)
    assert r.intent is not None and r.intent.number == 4
    ready = after_reserved(r)
    assert (ready.stage, ready.issued) == (Stage.READY, 4)
    after, _ = apply_result(start_sending(ready), report(HttpResult(500)), brk.CLOSED, BREAKER_CFG, SCHEDULE, HALF)
    assert after.intent is None and after.issued == 4
    nxt = with_next_intent(after, random.Random(0), NOW)
    assert nxt.intent is not None and nxt.intent.number == 5


# -- apply_result --------------------------------------------------------------------------------

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
     ("retry", "pending", NOW + 63_000, True, "http_429", False, True)),
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
    ("manual on finished: 500", sending(4, auto_retry_active=False, manual=True), HttpResult(500), NOW,
     ("failed", "failed", None, False, "http_5xx", False, False)),
    ("manual on finished: 500 days later",
     sending(1, created_at_ms=NOW - 3 * DAY_MS, auto_retry_active=False, manual=True), HttpResult(500), NOW,
     ("failed", "failed", None, False, "http_5xx", False, False)),
    ("manual on finished: 200", sending(4, auto_retry_active=False, manual=True), HttpResult(200), NOW,
     ("succeeded", "succeeded", None, False, None, False, False)),
    ("manual on finished: 404", sending(4, auto_retry_active=False, manual=True), HttpResult(404), NOW,
     ("failed", "failed", None, False, "http_4xx", False, False)),
    # A manual replay while automatic retries run: the automatic schedule carries on untouched.
    ("manual while auto: 500", sending(2, next_attempt_at_ms=NOW + 600_000, manual=True), HttpResult(500), NOW,
     ("failed", "pending", NOW + 600_000, True, "http_5xx", False, True)),
    ("manual while auto: 404", sending(2, next_attempt_at_ms=NOW + 600_000, manual=True), HttpResult(404), NOW,
     ("failed", "pending", NOW + 600_000, True, "http_4xx", False, True)),
    ("manual while auto: 200", sending(2, next_attempt_at_ms=NOW + 600_000, manual=True), HttpResult(200), NOW,
     ("succeeded", "succeeded", None, False, None, False, False)),
    ("manual while auto: 410", sending(2, next_attempt_at_ms=NOW + 600_000, manual=True), HttpResult(410), NOW,
     ("failed", "failed", None, False, "gone", True, False)),
]




@pytest.mark.parametrize(("p", "result", "at_ms", "expected"), [r[1:] for r in RESULT_TABLE],
                         ids=[r[0] for r in RESULT_TABLE])
def test_apply_result(p: Pending, result: HttpResult, at_ms: int, expected: tuple[Any, ...]) -> None:
    outcome, status, next_at, auto, error_class, disable, stays = expected
    manual = p.sending_manual is not None
    after, _ = apply_result(p, report(result, at_ms), brk.CLOSED, BREAKER_CFG, SCHEDULE, HALF)
    r = after.record
    assert r is not None
    assert (r.outcome, r.delivery_status, r.next_attempt_at_ms, r.auto_retry_active, r.error_class,
            r.disable_endpoint) == (outcome, status, next_at, auto, error_class, disable)
    assert (r.intent, r.sent, r.manual, r.http_status) == (p.intent, True, manual, result.status)
    assert (r.requested_by, r.request_id) == ((ASKED.requested_by, ASKED.request_id) if manual else ("", ""))
    assert (r.started_at_ms, r.finished_at_ms, r.latency_ms) == (at_ms - 40, at_ms, 40)
    # manual tries neither use nor move the automatic budget
    assert (after.stage, after.attempt_count, after.sending_manual, after.intent) == (
        Stage.RECORDING, p.attempt_count + (0 if manual else 1), None, None)
    assert after.auto_retry_active is auto
    if next_at is not None:
        assert after.next_attempt_at_ms == next_at

    written = after_record_written(with_next_intent(after, HALF, at_ms))
    if stays:
        assert written is not None
        assert (written.stage, written.record) == (Stage.READY, None)
        assert written.intent is not None and written.intent.number == p.intent.number + 1  # type: ignore[union-attr]
        assert is_due(written, next_at - 1) is False and is_due(written, next_at) is True
    else:
        assert written is None


def test_a_queued_replay_keeps_a_finished_delivery_in_state() -> None:
    p = replace(sending(), manual=(ASKED,))
    after, _ = apply_result(p, report(HttpResult(404)), brk.CLOSED, BREAKER_CFG, SCHEDULE, HALF)
    written = after_record_written(with_next_intent(after, HALF, NOW))
    assert written is not None and written.stage is Stage.READY and is_due(written, NOW)


def test_a_manual_request_arriving_during_the_final_write_is_still_served() -> None:
    after, _ = apply_result(sending(), report(HttpResult(200)), brk.CLOSED, BREAKER_CFG, SCHEDULE, HALF)
    started = with_next_intent(after, HALF, NOW)
    assert started.intent is None  # nothing owed when the write started
    written = after_record_written(replace(started, manual=(ASKED,)))
    assert written is not None and written.stage is Stage.RESERVE


def test_a_finished_manual_replay_does_not_restart_automatic_sends() -> None:
    after, _ = apply_result(sending(4, auto_retry_active=False, manual=True), report(HttpResult(503)),
                            brk.CLOSED, BREAKER_CFG, SCHEDULE, HALF)
    assert after_record_written(after) is None
    assert not is_due(replace(after, stage=Stage.READY), NOW + DAY_MS)


def test_a_request_that_could_not_be_built_leaves_everything_owed() -> None:
    p = sending(manual=True)
    back = send_not_started(p)
    assert (back.stage, back.manual, back.intent, back.sending_manual) == (Stage.READY, (ASKED,), p.intent, None)


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
    # Closed, its failure history forgotten; the count of failing episodes stays.
    assert run_results([HttpResult(200)], half_open) == brk.BreakerState(episodes=1)


def test_a_manual_success_while_open_closes_the_breaker() -> None:
    _, breaker = apply_result(sending(manual=True), report(HttpResult(200)), open_breaker(),
                              BREAKER_CFG, SCHEDULE, HALF)
    assert breaker == brk.BreakerState(episodes=1)


# -- ending without a request ----------------------------------------------------------------------


def test_expiry_closes_the_reserved_attempt_row_as_not_sent() -> None:
    after = end_without_sending(pending(), NOW, "expired", "expired", "retry deadline passed while waiting")
    r = after.record
    assert r is not None and after.intent is None and not after.auto_retry_active
    assert (r.intent, r.sent, r.outcome, r.delivery_status, r.http_status) == (
        Intent(1, "a-1"), False, "not_sent", "expired", None)
    assert after_record_written(after) is None


def test_a_status_only_end_without_an_intent_says_what_happened() -> None:
    r = end_without_sending(pending(intent=None), NOW, "failed", "failed", "endpoint deleted").record
    assert r is not None and (r.intent, r.outcome, r.delivery_status) == (None, "failed", "failed")


def test_a_manual_request_not_sent_leaves_the_automatic_life_alone() -> None:
    p = pending(manual=(ASKED,), next_attempt_at_ms=NOW + 9000)
    after = manual_not_sent(p, NOW, "manual attempt not sent: disabled")
    r = after.record
    assert r is not None
    assert (r.intent, r.sent, r.outcome, r.manual, r.delivery_status, r.requested_by) == (
        Intent(1, "a-1"), False, "not_sent", True, None, "alice@t_1")
    assert (after.manual, after.auto_retry_active, after.next_attempt_at_ms, after.issued) == ((), True, NOW + 9000, 1)
    written = after_record_written(with_next_intent(after, HALF, NOW))
    assert written is not None and written.intent is not None and written.intent.number == 2


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




@pytest.mark.parametrize("stage", [Stage.RECORDING, Stage.PERSIST, Stage.CHECK, Stage.RESERVE])
@pytest.mark.parametrize(("failures", "delay_ms"), BACKOFF_TABLE)
def test_write_failures_back_off_and_are_capped(stage: Stage, failures: int, delay_ms: int) -> None:
    p = pending(stage=stage, busy=True, write_failures=failures)
    after = after_write_failed(p, NOW)
    assert (after.stage, after.busy, after.write_failures, after.write_retry_at_ms, after.intent) == (
        stage, False, failures + 1, NOW + delay_ms, p.intent)


def test_a_new_result_resets_the_write_backoff() -> None:
    p = replace(sending(), write_failures=6, write_retry_at_ms=NOW + 30_000)
    after, _ = apply_result(p, report(HttpResult(500)), brk.CLOSED, BREAKER_CFG, SCHEDULE, HALF)
    assert (after.write_failures, after.write_retry_at_ms) == (0, 0)
