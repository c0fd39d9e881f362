"""Delivery history (read from the Flink job's tables), manual replay and bulk recovery.

A replay is never a new event: it asks the job (a ReplayRequest on webhooks.replays, key
delivery_id) for one more attempt on the existing delivery, flagged manual. It does not
restart the automatic schedule or its 24 h deadline; the job owns both. Authorization and the
endpoint's state are checked again at replay time, because both may have changed since the
delivery was created.

A replay window (core/replay_policy.py: the catalogued type's, or the tenant's rule by type
pattern) may close replays earlier than the 30-day history: a single replay past it is
FAILED_PRECONDITION naming the rule and when it closed, a bulk recovery skips such deliveries and
counts them by rule, and the request carries the closing time so the job refuses one it reads
too late. The history itself stays visible.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from control_plane import validation
from control_plane.cursor import Cursors, not_valid
from control_plane.domain import (
    HISTORY_WINDOW_MS,
    RECOVERABLE_STATUSES,
    DeliveryDetail,
    DeliveryStatus,
    DeliverySummary,
    Endpoint,
    Page,
    Principal,
    RecoverProgress,
    ReplayAudit,
)
from control_plane.endpoints.service import load_endpoint, page_size, require_write
from control_plane.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from control_plane.publishing.publisher import Publisher, PublishError
from control_plane.store import EndpointStore, HistoryStore
from core import replay_policy
from core.records import EndpointStatus, ReplayRequest
from core.replay_policy import ReplayDecision, ReplayRule

log = logging.getLogger(__name__)

MAX_DELIVERY_PAGE = 200
ARCHIVE_TIER = "archive"
# Rows one ListDeliveries call reads at most; with a rare status filter the page comes back
# short with a cursor rather than scanning 30 days of partitions in one call.
MAX_SCANNED_ROWS = 5_000


# Deliveries a bulk recovery decides on at once: one read of their events' occurrence.
DECISION_CHUNK = 128
_NO_RULE = ReplayDecision(True, None, None)


class Windows(Protocol):
    """One tenant's replay windows (control_plane/history/replay_windows.py)."""

    def rule(self, event_type: str) -> ReplayRule | None: ...
    def occurred_at(self, event_ids: Sequence[str]) -> dict[str, int]: ...


@dataclass(frozen=True)
class Replayed:
    delivery_id: str
    request_id: str


@dataclass(frozen=True)
class DeliveryDeps:
    endpoints: EndpointStore
    history: HistoryStore
    publisher: Publisher
    now_ms: Callable[[], int]
    random_bytes: Callable[[int], bytes]
    cursors: Cursors
    progress_every: int = 25
    # Makes sure the delivery's event (its payload) is in Cassandra before its replay is queued,
    # written back from the archive if it expired from the hot tier: the job reads the payload
    # there. False: neither tier holds it. control_plane/history/tiered.py. None: no archive.
    rehydrate: Callable[[str, int], bool] | None = None
    # A tenant's replay windows; None: every delivery replayable for the whole history.
    replay_windows: Callable[[str], Windows] | None = None


class DeliveryService:
    def __init__(self, deps: DeliveryDeps) -> None:
        self._d = deps

    def list(
        self,
        principal: Principal,
        endpoint_id: str,
        statuses: Sequence[DeliveryStatus],
        start_ms: int | None,
        end_ms: int | None,
        size: int,
        page_cursor: str,
    ) -> Page[DeliverySummary]:
        limit = page_size(size, maximum=MAX_DELIVERY_PAGE)
        self._endpoint(principal, endpoint_id, allow_deleted=True)
        wanted = sorted({s.value for s in statuses})
        # The cursor is bound to the request as sent (an omitted bound stays omitted) and keeps
        # the range resolved on the first page, so "last 30 days" does not shift between pages.
        identity: dict[str, Any] = {"endpoint": endpoint_id, "statuses": wanted, "from": start_ms, "to": end_ms}
        after = None
        if page_cursor:
            fields = self._d.cursors.decode("deliveries", page_cursor, **identity)
            start, end = int(fields["start"]), int(fields["end"])
            if not 0 < end - start <= HISTORY_WINDOW_MS:  # signed, so ours; bounded all the same
                raise not_valid()
            after = (int(fields["at"]), str(fields["id"]))
        else:
            start, end = self._range(start_ms, end_ms)
        rows = self._d.history.iter_endpoint_deliveries(
            principal.tenant_id, endpoint_id, start, end, after
        )
        items: list[DeliverySummary] = []
        last: DeliverySummary | None = None
        for scanned, row in enumerate(rows, start=1):
            last = row
            if not wanted or row.status.value in wanted:
                items.append(row)
            if len(items) == limit or scanned == MAX_SCANNED_ROWS:
                break
        else:
            return Page(tuple(items), "")
        if last is None or _exhausted(rows):
            return Page(tuple(items), "")
        next_cursor = self._d.cursors.encode(
            "deliveries", **identity, start=start, end=end, at=last.created_at_ms, id=last.delivery_id
        )
        return Page(tuple(items), next_cursor)

    def get(self, principal: Principal, delivery_id: str) -> DeliveryDetail:
        validation.identifier("delivery_id", delivery_id)
        detail = self._d.history.get_delivery(delivery_id)
        if detail is None or detail.summary.tenant_id != principal.tenant_id:
            raise NotFound(f"delivery {delivery_id} not found")
        return detail

    def replay(self, principal: Principal, delivery_id: str, request_id: str, reason: str = "") -> Replayed:
        require_write(principal)
        if request_id:
            validation.identifier("request_id", request_id)
        reason = validation.reason(reason)
        detail = self.get(principal, delivery_id)
        decision = self._check_replayable(principal, detail.summary)
        # The payload back in the hot tier if it expired there (the job reads it from Cassandra).
        if not self._rehydrate(delivery_id) and detail.tier == ARCHIVE_TIER:
            raise FailedPrecondition("the delivery's payload is in neither the hot tier nor the archive")
        given = bool(request_id)
        request_id = request_id or "rpl_" + uuid.UUID(bytes=self._d.random_bytes(16)).hex
        # Audited before it is queued: a replay that reaches the endpoint always has its row. A
        # client's retry (same request id) keeps the first row and is queued again -- the job
        # dedupes by request id, and the first publish may be the one that failed.
        first = self._audit(principal, detail.summary, request_id, reason, if_new=given)
        self._publish_replay(principal, detail.summary, request_id, decision)
        log.info("replay %s of delivery %s requested by %s%s", request_id, delivery_id, principal.key_id,
                 "" if first else " (a retry of the same request)")
        return Replayed(delivery_id, request_id)

    def replay_refusal(self, principal: Principal, detail: DeliveryDetail) -> str:
        """Why the delivery's replay window no longer allows a replay ("" if it does): what the
        console shows instead of the replay form, and GetDelivery returns."""
        return self._decisions(principal.tenant_id, [detail.summary])[0].refusal

    def _decisions(self, tenant_id: str, summaries: Sequence[DeliverySummary],
                   windows: Windows | None = None) -> Sequence[ReplayDecision]:
        """The replay decision of each delivery at this moment; the events' occurrence is read
        (in one go) only for deliveries whose type has a window."""
        if windows is None:
            if self._d.replay_windows is None:
                return [_NO_RULE] * len(summaries)
            windows = self._d.replay_windows(tenant_id)
        rules = [windows.rule(s.event_type) for s in summaries]
        occurred = windows.occurred_at([s.event_id for s, r in zip(summaries, rules, strict=True) if r is not None])
        now = self._d.now_ms()
        return [replay_policy.decide(r, replay_policy.window_start_ms(occurred.get(s.event_id), s.created_at_ms), now)
                for s, r in zip(summaries, rules, strict=True)]

    def _audit(self, principal: Principal, summary: DeliverySummary, request_id: str, reason: str,
               if_new: bool) -> bool:
        return self._d.history.record_replay(ReplayAudit(
            delivery_id=summary.delivery_id, request_id=request_id, tenant_id=principal.tenant_id,
            requested_by=principal.key_id, requested_at_ms=self._d.now_ms(), reason=reason), if_new)

    def recover(
        self, principal: Principal, endpoint_id: str, start_ms: int | None, end_ms: int | None,
        reason: str = "",
    ) -> Iterator[RecoverProgress]:
        """Replay the endpoint's failed and expired deliveries created in [start, end).

        Validation happens before the first progress message; then a counting pass gives the
        total, and the replay pass reports progress every ``progress_every`` replays. A publish
        failure ends the stream with Unavailable; the progress so far says what was sent.
        """
        require_write(principal)
        reason = validation.reason(reason)
        if not start_ms or not end_ms:
            raise InvalidArgument("start_time and end_time are required for a bulk recovery")
        endpoint = self._endpoint(principal, endpoint_id, allow_deleted=False)
        if endpoint.status is not EndpointStatus.ACTIVE:
            raise FailedPrecondition("endpoint is disabled; enable it before recovering deliveries")
        start, end = self._range(start_ms, end_ms)
        if start_ms < self._d.now_ms() - HISTORY_WINDOW_MS:
            raise FailedPrecondition("start_time is outside the 30-day replay window")
        return self._recover(principal, endpoint_id, start, end, reason)

    def _recover(
        self, principal: Principal, endpoint_id: str, start: int, end: int, reason: str
    ) -> Iterator[RecoverProgress]:
        # One lookup object for both passes: each type's window and the tenant's rules read once.
        windows = None if self._d.replay_windows is None else self._d.replay_windows(principal.tenant_id)

        def failed() -> Iterator[tuple[DeliverySummary, ReplayDecision]]:
            rows = (d for d in self._d.history.iter_endpoint_deliveries(principal.tenant_id, endpoint_id, start, end,
                                                                        None) if d.status in RECOVERABLE_STATUSES)
            for chunk in _chunks(rows, DECISION_CHUNK):
                yield from zip(chunk, self._decisions(principal.tenant_id, chunk, windows), strict=True)

        # The counting pass: what the policy allows is the total, what it refuses is reported by rule.
        total, refused = 0, Counter[str]()
        for _, decision in failed():
            if decision.allowed:
                total += 1
            else:
                refused[_rule_name(decision)] += 1
        counted_refused = sum(refused.values())
        yield _progress(total, 0, 0, total == 0, "", refused)
        if total == 0:
            if refused:
                log.info("bulk recovery of endpoint %s: nothing replayed, %d past their replay window", endpoint_id,
                         counted_refused)
            return
        batch = "rcv_" + uuid.UUID(bytes=self._d.random_bytes(16)).hex
        replayed, last_id = 0, ""
        refused = Counter()
        for summary, decision in failed():
            if not decision.allowed:  # counted again: a window may have closed since the counting pass
                refused[_rule_name(decision)] += 1
                continue
            request_id = f"{batch}-{summary.delivery_id}"
            self._rehydrate(summary.delivery_id)  # as for one replay: the list is the hot index, never the archive
            self._audit(principal, summary, request_id, reason, if_new=False)  # fresh id: no dedupe read
            self._publish_replay(principal, summary, request_id, decision)
            replayed, last_id = replayed + 1, summary.delivery_id
            total = max(total, replayed)  # new failures since the counting pass
            if replayed % self._d.progress_every == 0:
                yield _progress(total, replayed, 0, False, last_id, refused)
        log.info("bulk recovery %s of endpoint %s: %d replayed, %d past their replay window", batch, endpoint_id,
                 replayed, sum(refused.values()))
        # Counted but no longer failed (e.g. a retry succeeded meanwhile), or whose window closed
        # since: skipped, not replayed; the latter are in the refusals by rule.
        closed_since = max(0, sum(refused.values()) - counted_refused)
        yield _progress(total, replayed, max(0, total - replayed - closed_since), True, last_id, refused)

    # -- helpers ----------------------------------------------------------------------------

    def _rehydrate(self, delivery_id: str) -> bool:
        """The delivery's payload in the hot tier, from the archive if it expired (see replay)."""
        return self._d.rehydrate is not None and self._d.rehydrate(delivery_id, self._d.now_ms())

    def _endpoint(self, principal: Principal, endpoint_id: str, allow_deleted: bool) -> Endpoint:
        return load_endpoint(self._d.endpoints, principal, endpoint_id, allow_deleted)

    def _range(self, start_ms: int | None, end_ms: int | None) -> tuple[int, int]:
        now = self._d.now_ms()
        end = end_ms or now + 1
        start = start_ms or end - HISTORY_WINDOW_MS
        if start >= end:
            raise InvalidArgument("start_time must be before end_time")
        if end - start > HISTORY_WINDOW_MS:
            raise InvalidArgument("the time range may span at most 30 days")
        # Older rows have expired (30-day TTL): do not walk partitions that cannot hold any.
        return max(start, now - HISTORY_WINDOW_MS), end

    def _check_replayable(self, principal: Principal, summary: DeliverySummary) -> ReplayDecision:
        if summary.status is DeliveryStatus.SKIPPED:
            # Sending it now would hand the endpoint a major it said it does not read; a new pin
            # does not make old events its own either.
            raise FailedPrecondition("the delivery was skipped: the event's schema major is not one the endpoint "
                                     "is pinned to, so it was never meant for this endpoint and cannot be replayed")
        if summary.created_at_ms < self._d.now_ms() - HISTORY_WINDOW_MS:
            raise FailedPrecondition("the delivery is older than the 30-day replay window")
        decision = self._decisions(principal.tenant_id, [summary])[0]
        if not decision.allowed:
            raise FailedPrecondition(decision.refusal)
        endpoint = self._d.endpoints.get_endpoint(principal.tenant_id, summary.endpoint_id)
        if endpoint is None or endpoint.status is EndpointStatus.DELETED:
            raise FailedPrecondition("the delivery's endpoint was deleted; it cannot be replayed")
        if endpoint.status is not EndpointStatus.ACTIVE:
            raise FailedPrecondition("the delivery's endpoint is disabled; enable it to replay")
        return decision

    def _publish_replay(self, principal: Principal, summary: DeliverySummary, request_id: str,
                        decision: ReplayDecision) -> None:
        queue_request(self._d.publisher, ReplayRequest(
            delivery_id=summary.delivery_id,
            tenant_id=principal.tenant_id,
            endpoint_id=summary.endpoint_id,
            requested_by=principal.key_id,
            requested_at_ms=self._d.now_ms(),
            request_id=request_id,
            # The job refuses the request if it reads it once the window has closed.
            replay_closes_at_ms=decision.closes_at_ms,
            replay_rule=_rule_name(decision),
        ))


def queue_request(publisher: Publisher, request: ReplayRequest) -> None:
    """A person's request about a delivery (a replay, or an ordering-head skip) to the job, on
    webhooks.replays keyed by delivery_id; Unavailable if Kafka did not take it."""
    try:
        publisher.publish_replay(request)
    except PublishError as exc:
        raise Unavailable(f"could not queue the {request.action} (Kafka unavailable); retry") from exc


def _exhausted(rows: Iterator[DeliverySummary]) -> bool:
    return next(rows, None) is None


def _rule_name(decision: ReplayDecision) -> str:
    return "" if decision.rule is None else decision.rule.name


def _progress(total: int, replayed: int, skipped: int, done: bool, last_id: str,
              refused: Counter[str]) -> RecoverProgress:
    return RecoverProgress(total, replayed, skipped, done=done, last_delivery_id=last_id,
                           not_allowed=sum(refused.values()), not_allowed_by_rule=tuple(sorted(refused.items())))


def _chunks(items: Iterable[DeliverySummary], size: int) -> Iterator[list[DeliverySummary]]:
    chunk: list[DeliverySummary] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
