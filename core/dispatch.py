"""Per-endpoint dispatch: what to do next with one endpoint's pending deliveries.

The Flink dispatcher keeps, per endpoint, a map of :class:`Pending` deliveries plus a breaker and
a token bucket in keyed state; this module decides, with no I/O, which deliveries to persist,
send, record or expire, and when to look again. Each pending delivery moves through stages::

    PERSIST --rows durable--> READY --slot granted--> SENDING --HTTP result--> RECORDING
                                ^                                                  |
                                +------------- retry scheduled (timer) <-----------+
                                                               final -> removed from state

A stage that does I/O (PERSIST, SENDING, RECORDING) carries the ``owner`` incarnation that started
it. In-flight requests are not checkpointed, so after a restore a delivery found SENDING under an
older incarnation is sent again (at-least-once: this is the explained duplicate), and PERSIST or
RECORDING work is redone (both are idempotent upserts).
"""

from __future__ import annotations

import enum
import heapq
import random
from dataclasses import dataclass, field, replace
from typing import Literal

from core import breaker as brk
from core import ratelimit
from core.fanout import NewDelivery
from core.outcomes import (
    DisableEndpoint,
    ErrorClass,
    GaveUp,
    HttpResult,
    Retry,
    Succeeded,
    is_endpoint_failure,
    is_fast_failure,
)
from core.retry import RetrySchedule, decide


class Stage(enum.StrEnum):
    PERSIST = "persist"
    READY = "ready"
    SENDING = "sending"
    RECORDING = "recording"


@dataclass(frozen=True)
class AttemptRecord:
    """One finished try (or a final status without a try, e.g. expiry while the breaker was
    open), waiting to be written to history before the delivery moves on."""

    attempt_number: int  # 0 = no HTTP try (status change only)
    started_at_ms: int
    finished_at_ms: int
    http_status: int | None
    outcome: str  # succeeded | retry | failed | expired
    error_class: str | None
    detail: str
    manual: bool
    delivery_status: str  # pending | succeeded | failed | expired
    next_attempt_at_ms: int | None
    auto_retry_active: bool
    url: str = ""
    endpoint_config_version: int = 0
    latency_ms: int = 0
    response_sha256: str = ""
    response_prefix: str = ""
    signing_key_versions: tuple[int, ...] = ()
    disable_endpoint: bool = False


@dataclass(frozen=True)
class Pending:
    delivery: NewDelivery
    stage: Stage = Stage.PERSIST
    owner: str = ""
    attempt_count: int = 0
    next_attempt_at_ms: int = 0
    auto_retry_active: bool = True
    manual_requests: int = 0  # queued manual re-sends (replays)
    sending_manual: bool = False
    record: AttemptRecord | None = None
    # When the history write of ``record`` failed, when to try it again.
    write_retry_at_ms: int = 0
    write_failures: int = 0


@dataclass(frozen=True)
class Limits:
    max_in_flight: int
    # A manual replay is a person's explicit request: it bypasses an open breaker but not the cap.
    manual_bypasses_breaker: bool = True


@dataclass
class Plan:
    persist: list[str] = field(default_factory=list)
    send: list[str] = field(default_factory=list)
    record: list[str] = field(default_factory=list)
    wake_at_ms: int | None = None
    wanting_slots: int = 0  # ready and due, but held back by the slot grant

    def wake(self, at_ms: int) -> None:
        if self.wake_at_ms is None or at_ms < self.wake_at_ms:
            self.wake_at_ms = at_ms


def adopt_orphans(p: Pending, incarnation: str, now_ms: int) -> Pending:
    """Work an older incarnation started and a restore interrupted is redone by this one."""
    if p.owner == incarnation or p.stage is Stage.READY:
        return p
    if p.stage is Stage.SENDING:
        # The request may or may not have reached the endpoint: send again (at-least-once). A
        # manual send is owed again as a manual request; it must not move the automatic schedule.
        return replace(p, stage=Stage.READY, owner="",
                       next_attempt_at_ms=p.next_attempt_at_ms if p.sending_manual else now_ms,
                       manual_requests=p.manual_requests + (1 if p.sending_manual else 0),
                       sending_manual=False)
    return replace(p, owner="")  # PERSIST / RECORDING: redo the idempotent write


def is_due(p: Pending, now_ms: int) -> bool:
    if p.stage is not Stage.READY:
        return False
    if p.manual_requests > 0:
        return True
    return p.auto_retry_active and p.next_attempt_at_ms <= now_ms


def plan(
    pendings: list[Pending],
    in_flight: int,
    limits: Limits,
    breaker: brk.BreakerState,
    bucket: ratelimit.TokenBucket | None,
    now_ms: int,
    granted_slots: int,
) -> tuple[Plan, brk.BreakerState, ratelimit.TokenBucket | None]:
    """Choose this endpoint's next actions. ``granted_slots`` is what the fair scheduler gave this
    endpoint from the operator's shared pool; the plan never sends more than that, than the
    endpoint's free in-flight capacity, than its token bucket, or than the breaker allows."""
    out = Plan()
    free = max(0, min(limits.max_in_flight - in_flight, granted_slots))
    due: list[Pending] = []
    for p in pendings:
        if p.stage in (Stage.PERSIST, Stage.RECORDING) and not p.owner:
            if p.write_retry_at_ms > now_ms:
                out.wake(p.write_retry_at_ms)
            elif p.stage is Stage.PERSIST:
                out.persist.append(p.delivery.delivery_id)
            else:
                out.record.append(p.delivery.delivery_id)
        elif is_due(p, now_ms):
            due.append(p)
        elif p.stage is Stage.READY and p.auto_retry_active:
            out.wake(p.next_attempt_at_ms)
    # Manual requests first (a person is waiting), then the longest-waiting first.
    due.sort(key=lambda p: (p.manual_requests == 0, p.next_attempt_at_ms))
    for p in due:
        if len(out.send) >= free:
            out.wanting_slots += 1
            continue
        manual = p.manual_requests > 0
        # Commit the breaker's new state only if the request really goes: a half-open probe slot
        # spent on a request the token bucket then holds back would wait a whole period for nothing.
        after_allow = breaker
        if not (manual and limits.manual_bypasses_breaker):
            allowed, after_allow = brk.allow(breaker, now_ms)
            if not allowed:
                probe_at = brk.next_probe_at_ms(breaker)
                out.wake(probe_at if probe_at is not None else now_ms + 1000)
                continue
        if bucket is not None:
            ok, bucket, wait_ms = ratelimit.try_take(bucket, now_ms)
            if not ok:
                out.wake(now_ms + max(1, wait_ms))
                break
        breaker = after_allow
        out.send.append(p.delivery.delivery_id)
    return out, breaker, bucket


def start_sending(p: Pending, incarnation: str) -> Pending:
    manual = p.manual_requests > 0
    return replace(
        p,
        stage=Stage.SENDING,
        owner=incarnation,
        sending_manual=manual,
        manual_requests=p.manual_requests - 1 if manual else p.manual_requests,
    )


@dataclass(frozen=True)
class SendReport:
    """What the HTTP sender observed, plus the facts of the request it made."""

    result: HttpResult
    started_at_ms: int
    finished_at_ms: int
    url: str
    endpoint_config_version: int
    latency_ms: int = 0
    response_sha256: str = ""
    response_prefix: str = ""
    signing_key_versions: tuple[int, ...] = ()


def apply_result(
    p: Pending,
    report: SendReport,
    breaker: brk.BreakerState,
    breaker_cfg: brk.BreakerConfig,
    schedule: RetrySchedule,
    rng: random.Random,
) -> tuple[Pending, brk.BreakerState]:
    """Turn one finished try into the attempt record to write and the breaker's next state."""
    number = p.attempt_count + 1
    now_ms = report.finished_at_ms
    manual = p.sending_manual
    outcome = decide(report.result, number, p.delivery.created_at_ms, now_ms, schedule, rng)
    if isinstance(outcome, Succeeded):
        breaker = brk.on_success(breaker)
    elif not is_endpoint_failure(report.result):
        # Our own refusal (SSRF policy, internal error) or a permanent answer (3xx, 4xx, 410) says
        # nothing about the endpoint's health: do not let it open the breaker.
        breaker = brk.on_inconclusive(breaker)
    else:
        breaker = brk.on_failure(breaker, now_ms, is_fast_failure(report.result), breaker_cfg)

    auto_active = p.auto_retry_active
    next_at: int | None = None
    disable = False
    if isinstance(outcome, Succeeded):
        status, result_word, auto_active = "succeeded", "succeeded", False
    elif manual and isinstance(outcome, Retry | GaveUp):
        # A manual replay is a contract of its own: its failure never restarts, moves or ends the
        # automatic schedule (nor brings back its 24 h deadline, so it is never "expired").
        result_word = "failed"
        if p.auto_retry_active:
            status, next_at = "pending", p.next_attempt_at_ms  # automatic schedule carries on
        else:
            status = "failed"
    elif isinstance(outcome, Retry):
        status, result_word, next_at = "pending", "retry", outcome.at_ms
    elif isinstance(outcome, GaveUp):
        status, result_word, auto_active = outcome.final_status, outcome.final_status, False
    else:
        assert isinstance(outcome, DisableEndpoint)
        status, result_word, auto_active, disable = "failed", "failed", False, True

    record = AttemptRecord(
        attempt_number=number,
        started_at_ms=report.started_at_ms,
        finished_at_ms=report.finished_at_ms,
        http_status=report.result.status,
        outcome=result_word,
        error_class=None if report.result.error is None and isinstance(outcome, Succeeded)
        else (report.result.error.value if report.result.error else _error_value(outcome)),
        detail=report.result.detail,
        manual=manual,
        delivery_status=status,
        next_attempt_at_ms=next_at,
        auto_retry_active=auto_active,
        url=report.url,
        endpoint_config_version=report.endpoint_config_version,
        latency_ms=report.latency_ms,
        response_sha256=report.response_sha256,
        response_prefix=report.response_prefix,
        signing_key_versions=report.signing_key_versions,
        disable_endpoint=disable,
    )
    return (
        replace(
            p,
            stage=Stage.RECORDING,
            owner="",
            attempt_count=number,
            next_attempt_at_ms=next_at if next_at is not None else p.next_attempt_at_ms,
            auto_retry_active=auto_active,
            sending_manual=False,
            record=record,
            write_failures=0,
            write_retry_at_ms=0,
        ),
        breaker,
    )


def _error_value(outcome: object) -> str | None:
    ec = getattr(outcome, "error_class", None)
    return ec.value if isinstance(ec, ErrorClass) else None


def expire_if_past_deadline(p: Pending, now_ms: int) -> Pending:
    """A delivery whose automatic tries are still active but whose deadline passed while it was
    waiting (breaker open, endpoint disabled) ends visibly as expired, with no further try."""
    if p.stage is not Stage.READY or not p.auto_retry_active or p.manual_requests > 0:
        return p
    if now_ms < p.delivery.expires_at_ms:
        return p
    record = AttemptRecord(
        attempt_number=0, started_at_ms=now_ms, finished_at_ms=now_ms, http_status=None,
        outcome="expired", error_class=None, detail="retry deadline passed while waiting",
        manual=False, delivery_status="expired", next_attempt_at_ms=None, auto_retry_active=False,
    )
    return replace(p, stage=Stage.RECORDING, owner="", auto_retry_active=False, record=record)


def after_record_written(p: Pending) -> Pending | None:
    """The history write is durable: the delivery is finished (None) or waits for its next try."""
    assert p.record is not None
    if p.record.delivery_status != "pending" and p.manual_requests == 0:
        return None
    return replace(p, stage=Stage.READY, owner="", record=None)


def after_write_failed(p: Pending, now_ms: int) -> Pending:
    """Cassandra refused or timed out a PERSIST or RECORDING write: keep the stage and try again
    later, backing off. Nothing is sent before it is durable, and a delivery is never reported
    finished until its record is written."""
    delay = min(60_000, 500 * (2 ** min(p.write_failures, 7)))
    return replace(p, owner="", write_failures=p.write_failures + 1, write_retry_at_ms=now_ms + delay)


class EndpointQueue:
    """In-memory index of one endpoint's pending deliveries.

    Keyed state stays the source of truth (it is what checkpoints hold); this index lets a timer
    or a new delivery find what needs action in O(log n) instead of unpickling every pending
    delivery of the endpoint on every call, which made the dispatcher quadratic in its backlog.
    It is rebuilt from keyed state once per endpoint after a restore.
    """

    def __init__(self) -> None:
        self.items: dict[str, Pending] = {}
        # READY deliveries by next attempt time; entries that no longer match items[] are stale
        # and skipped when popped (cheaper than deleting from the middle of a heap).
        self._heap: list[tuple[int, int, str]] = []
        self._seq = 0
        self._writes: set[str] = set()  # PERSIST / RECORDING work with no owner
        self._manual: set[str] = set()  # READY with a manual replay waiting

    def __len__(self) -> int:
        return len(self.items)

    def put(self, p: Pending) -> None:
        did = p.delivery.delivery_id
        self.items[did] = p
        self._writes.discard(did)
        self._manual.discard(did)
        if p.stage in (Stage.PERSIST, Stage.RECORDING) and not p.owner:
            self._writes.add(did)
        elif p.stage is Stage.READY:
            if p.manual_requests > 0:
                self._manual.add(did)
            elif p.auto_retry_active:
                self._seq += 1
                heapq.heappush(self._heap, (p.next_attempt_at_ms, self._seq, did))

    def remove(self, did: str) -> None:
        self.items.pop(did, None)
        self._writes.discard(did)
        self._manual.discard(did)

    def _valid(self, entry: tuple[int, int, str]) -> Pending | None:
        at, _, did = entry
        p = self.items.get(did)
        if (p is None or p.stage is not Stage.READY or p.manual_requests > 0 or not p.auto_retry_active
                or p.next_attempt_at_ms != at):
            return None
        return p

    def _top(self) -> Pending | None:
        """The earliest READY delivery, dropping stale heap entries on the way."""
        while self._heap:
            p = self._valid(self._heap[0])
            if p is not None:
                return p
            heapq.heappop(self._heap)
        return None

    def has_due(self, now_ms: int) -> bool:
        top = self._top()
        return bool(self._manual) or (top is not None and top.next_attempt_at_ms <= now_ms)

    def oldest_due(self, now_ms: int) -> int:
        top = self._top()
        return top.next_attempt_at_ms if top is not None and top.next_attempt_at_ms <= now_ms else now_ms

    def due_kind(self, now_ms: int) -> Literal["new", "retry"]:
        """First attempts are "new" work for the fair scheduler; everything else is a retry."""
        top = self._top()
        return "new" if self._manual or (top is not None and top.attempt_count == 0) else "retry"

    def candidates(self, now_ms: int, limit: int) -> tuple[list[Pending], int | None]:
        """What may need action now -- unowned writes, manual replays, and up to ``limit`` due
        READY deliveries, oldest first -- plus the next time a READY delivery becomes due.
        Due deliveries returned here are taken off the heap: put() them back if not sent."""
        out = [self.items[d] for d in self._writes] + [self.items[d] for d in self._manual]
        taken: set[str] = set()
        while len(taken) < limit:
            p = self._top()
            if p is None or p.next_attempt_at_ms > now_ms:
                break
            heapq.heappop(self._heap)
            if p.delivery.delivery_id in taken:
                continue  # a duplicate heap entry of one already taken
            taken.add(p.delivery.delivery_id)
            out.append(p)
        top = self._top()
        return out, (top.next_attempt_at_ms if top is not None else None)
