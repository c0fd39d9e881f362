"""One delivery's life in the dispatcher: its stages, and the pure transitions between them.

:mod:`core.endpoint_driver` decides *when* each transition happens for one endpoint; this module
says *what* each one does to a single :class:`Pending` delivery. No I/O, no clock, no Flink::

    CHECK --durable record read--> PERSIST | RESERVE | (already final: dropped)
    PERSIST --creation rows + attempt row N reserved--> READY
    RESERVE --attempt row N reserved-----------------> READY
    READY --slot, breaker, bucket--> SENDING --HTTP result--> RECORDING
    RECORDING --outcome + next attempt row reserved--> READY (retry / more manual sends)
                                                   \\-> removed (final)

**Attempt rows before requests.** Every HTTP request the platform makes has an attempt row that
was durable in Cassandra *before* the request left (an :class:`Intent`: a unique attempt id and
an attempt number never used before for that delivery). The first one travels in the same batch
as the delivery's creation rows, each later one in the batch that records the previous outcome,
so the hot path pays no extra round trip. A crash can therefore leave a reserved row without a
request, never a request without a row: ``attempt rows >= requests a receiver saw`` always holds,
and history explains every duplicate.

**CHECK.** A delivery this incarnation did not see through from the start (adopted from a
restore, or re-created from a re-read topic) first reads its durable record: already final means
it is not sent again; otherwise numbering continues after the highest attempt number stored.
"""

from __future__ import annotations

import enum
import random
import uuid
from dataclasses import dataclass
from typing import Any, TypeVar

from core import breaker as brk
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
from core.retry import RetrySchedule, backoff_delay_ms, decide

T = TypeVar("T")


def replace(obj: T, **changes: Any) -> T:
    """``dataclasses.replace`` for the frozen records on the dispatcher's hot path (no
    ``__post_init__``, no defaults to compute): a copy of the instance dict. ``dataclasses.replace``
    was the largest single cost of the endpoint driver in a profile
    (docs/performance.md#the-taskmanagers-interpreter)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


FINAL_STATUSES = frozenset({"succeeded", "failed", "expired"})

# The error class of a delivery ended because its history write was refused for its own values,
# and the detail of a record written without those values (end_rejected).
WRITE_REJECTED = "history_write_rejected"
WITHOUT_VALUES = "its history write was refused for its values: written without them"


# What a delivery's storage I/O counts are reset to once one of its writes succeeded (or a
# restore adopts it): the back-off, the failure clock and the rejections all start again.
STORAGE_OK: dict[str, int] = {"write_failures": 0, "write_retry_at_ms": 0, "failing_since_ms": 0, "rejections": 0}


# The error class of an attempt that failed before its request left the process.
INTERNAL_BEFORE_SEND = "internal_before_send"


class NotSent(Exception):
    """Raised by the sending side for an error before any byte of the request left the process:
    building the payload the endpoint may see, signing, the headers, the egress check failing
    unexpectedly, a closed HTTP session. Any other error of a send may have come after bytes
    left, so it is recorded as a sent attempt (``internal``), as a request the receiver may
    have seen. The message names the step and the error's type, never a value."""


class WriteRejected(Exception):
    """The store refused one delivery's write or read for what it carries, not for its own state:
    a value the driver cannot encode (a lone surrogate in a text column), a statement Cassandra
    calls invalid. Sent again as it is, it fails again. The adapter says which errors these are
    (operators/history_errors.py); a timeout or an unavailable Cassandra is never one."""


class Stage(enum.StrEnum):
    ADOPTED = "adopted"  # restored from a checkpoint: CHECK it once it is due (or a person asks)
    CHECK = "check"  # read the durable record before anything else
    PERSIST = "persist"  # write creation rows (+ the first reserved attempt row)
    RESERVE = "reserve"  # write a reserved attempt row for the next request
    READY = "ready"  # durable, holds an intent; waits for its time and a slot
    SENDING = "sending"  # an HTTP request is in flight
    RECORDING = "recording"  # the outcome is being made durable


# Stages whose next step is a write or read to Cassandra rather than a request.
STORAGE_STAGES = frozenset({Stage.CHECK, Stage.PERSIST, Stage.RESERVE, Stage.RECORDING})
# Stages that wait for their time in the driver's heaps.
WAITING_STAGES = frozenset({Stage.READY, Stage.ADOPTED})


@dataclass(frozen=True)
class Intent:
    """An attempt row made durable before the request it stands for."""

    number: int
    attempt_id: str


def new_attempt_id(now_ms: int, rng: random.Random) -> str:
    """A version-1 (time-based) UUID from the injected clock and random source, so attempt ids
    sort by time in Cassandra and tests stay deterministic."""
    ticks = now_ms * 10_000 + 0x01B21DD213814000  # 100 ns intervals since 1582-10-15
    fields = (ticks & 0xFFFFFFFF, (ticks >> 32) & 0xFFFF, ((ticks >> 48) & 0x0FFF) | 0x1000,
              0x80 | rng.getrandbits(6), rng.getrandbits(8), rng.getrandbits(48))
    return str(uuid.UUID(fields=fields))


@dataclass(frozen=True)
class ManualRequest:
    """A person's replay request, served as one manual attempt."""

    request_id: str
    requested_by: str
    requested_at_ms: int  # when the dispatcher received it: its wait counts from here
    tenant_id: str = ""  # the tenant that asked; checked against the delivery's


@dataclass(frozen=True)
class AttemptRecord:
    """What to write after a try, or after deciding that no try will happen."""

    intent: Intent | None  # the attempt row this record completes (None: status change only)
    sent: bool  # whether an HTTP request was made (False: expired / failed / not sent)
    started_at_ms: int
    finished_at_ms: int
    http_status: int | None
    outcome: str  # succeeded | retry | failed | expired | not_sent
    error_class: str | None
    detail: str
    manual: bool
    # The delivery's status after this record; None leaves it unchanged (a manual request that
    # could not be sent says nothing about the delivery's automatic life).
    delivery_status: str | None
    next_attempt_at_ms: int | None
    auto_retry_active: bool
    url: str = ""
    endpoint_config_version: int = 0
    latency_ms: int = 0
    response_sha256: str = ""
    response_prefix: str = ""
    signing_key_versions: tuple[int, ...] = ()
    disable_endpoint: bool = False
    requested_by: str = ""  # manual attempts: who asked
    request_id: str = ""


@dataclass(frozen=True)
class DurableRecord:
    """A delivery as Cassandra has it. ``status`` None: no delivery row exists."""

    status: str | None
    attempt_count: int = 0
    next_attempt_at_ms: int | None = None
    auto_retry_active: bool = True
    max_attempt_number: int = 0  # highest attempt row stored, reserved ones included

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES


@dataclass(frozen=True)
class Pending:
    delivery: NewDelivery  # without payload bytes: those live once in their own state entry
    stage: Stage = Stage.PERSIST
    busy: bool = False  # the stage's I/O is in progress
    attempt_count: int = 0  # automatic attempts made (the retry budget counts these)
    issued: int = 0  # highest attempt number reserved so far; the next is issued + 1
    intent: Intent | None = None  # reserved and not yet used by a request
    next_attempt_at_ms: int = 0
    auto_retry_active: bool = True
    manual: tuple[ManualRequest, ...] = ()  # manual requests waiting, oldest first
    sending_manual: ManualRequest | None = None
    # An operator asked to skip this ordering key's head (core.ordering): it ends failed, without
    # another request, as soon as it is idle (after the request in flight, if any, is recorded).
    skip: ManualRequest | None = None
    record: AttemptRecord | None = None
    write_retry_at_ms: int = 0
    write_failures: int = 0
    failing_since_ms: int = 0  # when its storage I/O began failing without a success since
    failed_at_ms: int = 0  # the latest of those failures
    rejections: int = 0  # WriteRejected failures, each after another write succeeded (after_write_failed)
    unsent_tries: int = 0  # automatic tries that failed before their request left (NotSent)

    @property
    def delivery_id(self) -> str:
        return self.delivery.delivery_id

    @property
    def owes_send(self) -> bool:
        """More requests are owed: the automatic schedule is live or a person asked."""
        return self.auto_retry_active or bool(self.manual)


def adopt(p: Pending) -> Pending:
    """An entry restored from a checkpoint (keyed state keeps no stage, intent or record, see
    core.endpoint_store): its durable record is read before it is sent -- at once when a person
    is waiting for a manual request, else lazily, once it is due and could be sent. A backlog of a
    million deliveries behind an open breaker is then not a million reads on every restore, which
    kept healthy endpoints waiting while a restored job re-read its backlog
    (docs/performance.md#restores-and-leaked-resources)."""
    manual = ((p.sending_manual,) if p.sending_manual else ()) + p.manual
    return replace(p, stage=Stage.CHECK if manual else Stage.ADOPTED, busy=False, intent=None, record=None,
                   sending_manual=None, manual=manual, **STORAGE_OK)


def after_check(p: Pending, durable: DurableRecord, rng: random.Random, now_ms: int) -> Pending | None:
    """Continue from what Cassandra knows; None when the delivery is already final there and no
    manual request is waiting."""
    issued = max(p.issued, durable.max_attempt_number)
    if durable.status is None:
        # Never persisted (or only partly: an unlogged batch is not atomic). Numbering still
        # continues after any attempt row that did make it.
        return replace(p, stage=Stage.PERSIST, busy=False, issued=issued,
                       intent=Intent(issued + 1, new_attempt_id(now_ms, rng)))
    auto = p.auto_retry_active and durable.auto_retry_active and not durable.final
    if not auto and not p.manual:
        return None
    next_at = max(p.next_attempt_at_ms, durable.next_attempt_at_ms or 0)
    return replace(p, stage=Stage.RESERVE, busy=False, issued=issued, intent=None,
                   attempt_count=max(p.attempt_count, durable.attempt_count),
                   auto_retry_active=auto, next_attempt_at_ms=next_at)


def reserve(p: Pending, rng: random.Random, now_ms: int) -> Pending:
    """Give the delivery the next attempt number (kept through write retries)."""
    if p.intent is not None:
        return p
    return replace(p, intent=Intent(p.issued + 1, new_attempt_id(now_ms, rng)))


def after_reserved(p: Pending) -> Pending:
    """The intent's row is durable (after PERSIST or RESERVE): the delivery may be sent."""
    assert p.intent is not None
    return replace(p, stage=Stage.READY, busy=False, issued=max(p.issued, p.intent.number),
                   **STORAGE_OK)


def start_sending(p: Pending) -> Pending:
    """Use the reserved intent for a request: manual requests first (a person is waiting)."""
    assert p.stage is Stage.READY and p.intent is not None
    if p.manual:
        return replace(p, stage=Stage.SENDING, busy=True, sending_manual=p.manual[0], manual=p.manual[1:])
    return replace(p, stage=Stage.SENDING, busy=True, sending_manual=None)


def send_not_started(p: Pending) -> Pending:
    """The request could not be built (no usable signing key): nothing left the process, so the
    intent is still unused and the manual request still owed."""
    manual = ((p.sending_manual,) if p.sending_manual else ()) + p.manual
    return replace(p, stage=Stage.READY, busy=False, sending_manual=None, manual=manual)


def failed_before_leaving(p: Pending, now_ms: int, detail: str, schedule: RetrySchedule,
                          rng: random.Random) -> Pending:
    """The request failed before it left (NotSent): its attempt row is closed as not sent, with
    error class internal_before_send. It was no request, so it neither counts against the retry
    budget (max attempts) nor tells the breaker anything -- a bug of ours must not use up a
    delivery's attempts nor open its endpoint's breaker -- but it is tried again with the retry
    back-off of its own count, within the delivery's deadline: an error that stays ends the
    delivery expired, never a tight loop. The endpoint is not held: the error may well be this
    delivery's own (a header value it carries), and its other deliveries must keep going. A
    manual request ends not sent: a person's request is one try, and the row says why."""
    assert p.intent is not None
    manual = p.sending_manual
    status: str | None
    auto, next_at, tries = p.auto_retry_active, p.next_attempt_at_ms, p.unsent_tries
    if manual is not None:
        status = None  # says nothing of the automatic schedule
    else:
        tries += 1
        next_at = now_ms + backoff_delay_ms(tries, schedule, rng)
        if next_at > p.delivery.expires_at_ms:
            status, auto = "expired", False
            detail = f"{detail}; the next try would start after the deadline"
        else:
            status = "pending"
    record = AttemptRecord(
        intent=p.intent, sent=False, started_at_ms=now_ms, finished_at_ms=now_ms, http_status=None,
        outcome="not_sent", error_class=INTERNAL_BEFORE_SEND, detail=detail, manual=manual is not None,
        delivery_status=status, next_attempt_at_ms=next_at if status == "pending" else None,
        auto_retry_active=auto, requested_by=manual.requested_by if manual else "",
        request_id=manual.request_id if manual else "")
    return replace(p, stage=Stage.RECORDING, busy=False, intent=None, issued=max(p.issued, p.intent.number),
                   next_attempt_at_ms=next_at, auto_retry_active=auto, sending_manual=None, record=record,
                   unsent_tries=tries)


def is_due(p: Pending, now_ms: int) -> bool:
    if p.stage is not Stage.READY:
        return False
    return bool(p.manual) or (p.auto_retry_active and p.next_attempt_at_ms <= now_ms)


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
    assert p.intent is not None
    manual = p.sending_manual
    # Manual tries have their own contract: they neither use nor move the automatic budget.
    auto_number = p.attempt_count if manual else p.attempt_count + 1
    now_ms = report.finished_at_ms
    outcome = decide(report.result, max(1, auto_number), p.delivery.created_at_ms, now_ms, schedule, rng)
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
    status: str | None
    if isinstance(outcome, Succeeded):
        status, word, auto_active = "succeeded", "succeeded", False
    elif manual is not None and isinstance(outcome, Retry | GaveUp):
        # A failed manual replay never restarts, moves or ends the automatic schedule (nor
        # brings back its 24 h deadline, so it is never "expired").
        word = "failed"
        status, next_at = ("pending", p.next_attempt_at_ms) if p.auto_retry_active else ("failed", None)
    elif isinstance(outcome, Retry):
        status, word, next_at = "pending", "retry", outcome.at_ms
    elif isinstance(outcome, GaveUp):
        status, word, auto_active = outcome.final_status, outcome.final_status, False
    else:
        assert isinstance(outcome, DisableEndpoint)
        status, word, auto_active, disable = "failed", "failed", False, True

    record = AttemptRecord(
        intent=p.intent, sent=True,
        started_at_ms=report.started_at_ms, finished_at_ms=report.finished_at_ms,
        http_status=report.result.status, outcome=word,
        error_class=None if report.result.error is None and isinstance(outcome, Succeeded)
        else (report.result.error.value if report.result.error else _error_value(outcome)),
        detail=report.result.detail, manual=manual is not None, delivery_status=status,
        next_attempt_at_ms=next_at, auto_retry_active=auto_active, url=report.url,
        endpoint_config_version=report.endpoint_config_version, latency_ms=report.latency_ms,
        response_sha256=report.response_sha256, response_prefix=report.response_prefix,
        signing_key_versions=report.signing_key_versions, disable_endpoint=disable,
        requested_by=manual.requested_by if manual else "", request_id=manual.request_id if manual else "",
    )
    return (
        replace(p, stage=Stage.RECORDING, busy=False, attempt_count=auto_number, intent=None,
                issued=max(p.issued, p.intent.number),
                next_attempt_at_ms=next_at if next_at is not None else p.next_attempt_at_ms,
                auto_retry_active=auto_active, sending_manual=None, record=record,
                **STORAGE_OK),
        breaker,
    )


def _error_value(outcome: object) -> str | None:
    ec = getattr(outcome, "error_class", None)
    return ec.value if isinstance(ec, ErrorClass) else None


def end_without_sending(p: Pending, now_ms: int, status: str, outcome: str, detail: str) -> Pending:
    """The delivery ends (expired at its deadline, failed because its endpoint was deleted)
    without another request. Its reserved attempt row, if any, is closed as not sent."""
    record = AttemptRecord(
        intent=p.intent, sent=False, started_at_ms=now_ms, finished_at_ms=now_ms, http_status=None,
        outcome=outcome if p.intent is None else "not_sent", error_class=None, detail=detail,
        manual=False, delivery_status=status, next_attempt_at_ms=None, auto_retry_active=False)
    return replace(p, stage=Stage.RECORDING, busy=False, auto_retry_active=False, manual=(),
                   intent=None, record=record)


def skip_head(p: Pending, now_ms: int) -> Pending:
    """An operator skipped this ordering key's head: it ends ``failed`` without another request;
    its reserved attempt row, if any, is closed as not sent and names who skipped it. Manual
    requests still owed stay owed (a person asked for them)."""
    req = p.skip
    assert req is not None
    record = AttemptRecord(
        intent=p.intent, sent=False, started_at_ms=now_ms, finished_at_ms=now_ms, http_status=None,
        outcome="skipped" if p.intent is None else "not_sent", error_class=None,
        detail=f"ordering head skipped by {req.requested_by}", manual=False, delivery_status="failed",
        next_attempt_at_ms=None, auto_retry_active=False, requested_by=req.requested_by, request_id=req.request_id)
    issued = p.issued if p.intent is None else max(p.issued, p.intent.number)
    return replace(p, stage=Stage.RECORDING, busy=False, auto_retry_active=False, intent=None, issued=issued,
                   skip=None, record=record)


def manual_not_sent(p: Pending, now_ms: int, detail: str) -> Pending:
    """The oldest manual request could not be sent within its wait: close it visibly with an
    attempt row that says why (no request was made). The automatic schedule is untouched."""
    assert p.manual and p.intent is not None
    req = p.manual[0]
    record = AttemptRecord(
        intent=p.intent, sent=False, started_at_ms=now_ms, finished_at_ms=now_ms, http_status=None,
        outcome="not_sent", error_class=None, detail=detail, manual=True, delivery_status=None,
        next_attempt_at_ms=None, auto_retry_active=p.auto_retry_active,
        requested_by=req.requested_by, request_id=req.request_id)
    return replace(p, stage=Stage.RECORDING, busy=False, manual=p.manual[1:], intent=None,
                   issued=max(p.issued, p.intent.number), record=record)


def with_next_intent(p: Pending, rng: random.Random, now_ms: int) -> Pending:
    """Before a RECORDING write: when another request is owed, reserve its attempt row in the
    same write. The intent is kept on the delivery, so a retried write reserves the same row."""
    if p.intent is not None or not p.owes_send:
        return p
    return replace(p, intent=Intent(p.issued + 1, new_attempt_id(now_ms, rng)))


def after_record_written(p: Pending) -> Pending | None:
    """The record is durable: the delivery is finished (None), or waits for its next request
    with the attempt row the same write reserved."""
    assert p.record is not None
    if not p.owes_send:
        return None
    if p.intent is None:  # a manual request arrived after the write was started
        return replace(p, stage=Stage.RESERVE, busy=False, record=None, **STORAGE_OK)
    return replace(p, stage=Stage.READY, busy=False, record=None, issued=max(p.issued, p.intent.number),
                   **STORAGE_OK)


def after_write_failed(p: Pending, now_ms: int, rejected: bool = False, others_ok_ms: int | None = None) -> Pending:
    """Cassandra refused or timed out a write or read: keep the stage (and any intent, so a
    retried reservation reuses its number) and try again later, backing off. Nothing is sent
    before its attempt row is durable; nothing is reported finished before its record is.

    ``rejected``: refused for its own values (WriteRejected). It counts towards ending the
    delivery (end_rejected) only when another write succeeded (at ``others_ok_ms``) since this
    one last failed: the error's type alone would also match a fault of every write (a column
    missing after a bad migration), and once that is fixed the first success must not end the
    deliveries that were only waiting for it. Any other failure starts the count again."""
    delay = min(60_000, 500 * (2 ** min(p.write_failures, 7)))
    confirmed = rejected and p.write_failures > 0 and others_ok_ms is not None and others_ok_ms > p.failed_at_ms
    return replace(p, busy=False, write_failures=p.write_failures + 1, write_retry_at_ms=now_ms + delay,
                   failing_since_ms=p.failing_since_ms if p.write_failures else now_ms, failed_at_ms=now_ms,
                   rejections=p.rejections + confirmed if rejected else 0)


def end_rejected(p: Pending, now_ms: int) -> Pending:
    """The delivery's own write keeps being refused for what it carries: write instead a record
    that carries none of it -- ids, numbers, times and classes, the values this platform makes
    itself -- so that write can succeed where the refused one cannot.

    Before any request (its creation or reservation was refused) the delivery ends ``failed``
    with error class history_write_rejected; its unused reserved attempt row, if any, is closed
    as not sent, and manual requests owed end with it (the caller counts them). The record of a
    finished request keeps its outcome -- a success stays one -- without its URL, response
    prefix and requester (the attempt row's text), and the delivery goes on as that outcome says."""
    if p.record is not None:
        record = replace(p.record, url="", response_prefix="", requested_by="", request_id="", detail=WITHOUT_VALUES)
        return replace(p, busy=False, record=record, **STORAGE_OK)
    record = AttemptRecord(
        intent=p.intent, sent=False, started_at_ms=now_ms, finished_at_ms=now_ms, http_status=None,
        outcome="failed" if p.intent is None else "not_sent", error_class=WRITE_REJECTED,
        detail=WITHOUT_VALUES, manual=False, delivery_status="failed", next_attempt_at_ms=None,
        auto_retry_active=False)
    issued = p.issued if p.intent is None else max(p.issued, p.intent.number)
    return replace(p, stage=Stage.RECORDING, busy=False, auto_retry_active=False, manual=(), sending_manual=None,
                   skip=None, intent=None, issued=issued, record=record, **STORAGE_OK)
