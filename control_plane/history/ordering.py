"""Ordering keys on the control plane: list an endpoint's blocked keys, skip a
key's head.

The job decides (core.ordering) and writes ``blocked_ordering_keys`` with the head's attempt
record; this module only reads that table and, for a skip, asks the job the way a replay does:
a ReplayRequest with action ``skip`` on webhooks.replays, key delivery_id, audited first in
replay_requests. The request names one delivery -- the head read here, checked against the one
the caller saw if it says -- never "whatever is head when the job reads it"; a head that is final
by the time the job reads the request is left alone.

A row can outlive its head: the job deletes it when the head is final, and a crash can lose the
delete (the row then goes by TTL). So every row is checked against its head's delivery status
and one whose head is final is not shown, and cannot be skipped.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from control_plane import validation
from control_plane.cursor import Cursors, not_valid
from control_plane.domain import FINAL_STATUSES, BlockedKey, Endpoint, KeyPosition, Page, Principal, ReplayAudit
from control_plane.endpoints.service import load_endpoint, page_size, require_write
from control_plane.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from control_plane.history.deliveries import Replayed, queue_request
from control_plane.publishing.publisher import Publisher
from control_plane.store import EndpointStore, HistoryStore, OrderingStore
from core.history_buckets import HISTORY_BUCKETS
from core.records import SKIP, ReplayRequest

log = logging.getLogger(__name__)

DEFAULT_KEY_PAGE = 100
MAX_KEY_PAGE = 1_000
# Rows one ListBlockedKeys call reads at most: after a crash storm of lost deletes the page
# comes back short with a token rather than reading every stale row in one call.
MAX_SCANNED_KEYS = 5_000
_TOKEN_NAMES = ("page_token", "next_page_token")  # this listing's names for its cursor


@dataclass(frozen=True)
class OrderingDeps:
    endpoints: EndpointStore
    history: HistoryStore
    keys: OrderingStore
    publisher: Publisher
    now_ms: Callable[[], int]
    random_bytes: Callable[[int], bytes]
    cursors: Cursors


class OrderingService:
    def __init__(self, deps: OrderingDeps) -> None:
        self._d = deps

    def blocked_keys(self, principal: Principal, endpoint_id: str, size: int, page_token: str) -> Page[BlockedKey]:
        """The endpoint's keys whose head failed and will retry, in storage order. An endpoint
        whose ordering was turned off still answers: keys blocked before may still be held."""
        limit = page_size(size, default=DEFAULT_KEY_PAGE, maximum=MAX_KEY_PAGE)
        self._endpoint(principal, endpoint_id)
        after = self._position(endpoint_id, page_token) if page_token else None
        rows = self._d.keys.iter_blocked_keys(principal.tenant_id, endpoint_id, after)
        items: list[BlockedKey] = []
        scanned, last = 0, None
        while len(items) < limit and scanned < MAX_SCANNED_KEYS:
            # As many rows as the page still needs, so a page without stale rows reads no more.
            chunk = list(itertools.islice(rows, min(limit - len(items), MAX_SCANNED_KEYS - scanned)))
            if not chunk:
                return Page(tuple(items), "")
            scanned, last = scanned + len(chunk), chunk[-1]
            items += self._still_blocked(chunk)
        if last is None or next(rows, None) is None:
            return Page(tuple(items), "")
        return Page(tuple(items), self._d.cursors.encode(
            "blocked_keys", endpoint=endpoint_id, bucket=last.bucket, key=last.ordering_key))

    def skip_head(self, principal: Principal, endpoint_id: str, ordering_key: str, delivery_id: str,
                  reason: str, request_id: str) -> Replayed:
        """Ask the job to end a blocked key's head as failed, so the key's next delivery goes."""
        require_write(principal)
        key = validation.key_value(ordering_key)
        for name, value in (("delivery_id", delivery_id), ("request_id", request_id)):
            if value:
                validation.identifier(name, value)
        reason = validation.reason(reason)
        if not reason:
            raise InvalidArgument("reason is required for a skip: the receiver never gets the skipped webhook")
        if not self._endpoint(principal, endpoint_id).spec.ordering_key:
            # Turning ordering off released every held delivery: the job would ignore the skip.
            raise FailedPrecondition(f"endpoint {endpoint_id} is not ordered: nothing is held, so there is no "
                                     "head to skip (its failing deliveries retry on their own)")
        row = self._d.keys.get_blocked_key(principal.tenant_id, endpoint_id, key)
        head = row.head_delivery_id if row is not None and self._still_blocked([row]) else None
        given = bool(request_id)
        if given and (seen := delivery_id or head):
            action = self._earlier_request(principal, endpoint_id, seen, request_id)
            if action == SKIP:
                # A client's retry, maybe after the skip took effect and the key moved on: the
                # same answer, queued again -- the first publish may be the one that failed, and
                # the job ignores a skip of a delivery that is final.
                self._queue(principal, endpoint_id, seen, request_id)
                return Replayed(seen, request_id)
            if action is not None:  # the job dedupes requests by id: this skip would be dropped
                raise AlreadyExists(f"request_id {request_id!r} was used for a {action} of delivery {seen}; "
                                    "use a new request_id")
        if head is None:
            raise NotFound(f"ordering key {_shown(key)} of endpoint {endpoint_id} is not blocked")
        if delivery_id and delivery_id != head:
            raise FailedPrecondition(
                f"the head of ordering key {_shown(key)} is now delivery {head}, not {delivery_id}; "
                "nothing was skipped (skip the current head by its id if that is still wanted)")
        request_id = request_id or "skp_" + uuid.UUID(bytes=self._d.random_bytes(16)).hex
        # Audited before it is queued, as a replay is: a skip the job applies always has its row.
        self._d.history.record_replay(ReplayAudit(
            delivery_id=head, request_id=request_id, tenant_id=principal.tenant_id, requested_by=principal.key_id,
            requested_at_ms=self._d.now_ms(), reason=reason, action=SKIP), if_new=given)
        self._queue(principal, endpoint_id, head, request_id)
        log.info("skip %s of ordering head %s (endpoint %s) requested by %s", request_id, head, endpoint_id,
                 principal.key_id)
        return Replayed(head, request_id)

    # -- helpers ----------------------------------------------------------------------------

    def _endpoint(self, principal: Principal, endpoint_id: str) -> Endpoint:
        return load_endpoint(self._d.endpoints, principal, endpoint_id)

    def _position(self, endpoint_id: str, page_token: str) -> KeyPosition:
        fields = self._d.cursors.decode("blocked_keys", page_token, _TOKEN_NAMES, endpoint=endpoint_id)
        bucket, key = fields.get("bucket"), fields.get("key")
        if not isinstance(bucket, int) or not 0 <= bucket < HISTORY_BUCKETS or not isinstance(key, str):
            raise not_valid(*_TOKEN_NAMES)
        return bucket, key

    def _still_blocked(self, rows: list[BlockedKey]) -> list[BlockedKey]:
        """The rows whose head is not final (a head whose delivery row is not found is shown:
        nothing says it is final)."""
        statuses = self._d.keys.delivery_statuses([r.head_delivery_id for r in rows])
        return [r for r in rows if statuses.get(r.head_delivery_id) not in FINAL_STATUSES]

    def _earlier_request(self, principal: Principal, endpoint_id: str, delivery_id: str,
                         request_id: str) -> str | None:
        """The action of the audited request ``request_id`` on this delivery of the caller's, if any."""
        detail = self._d.history.get_delivery(delivery_id)
        if detail is None or (detail.summary.tenant_id, detail.summary.endpoint_id) != (principal.tenant_id,
                                                                                        endpoint_id):
            return None
        return next((r.action for r in detail.replays if r.request_id == request_id), None)

    def _queue(self, principal: Principal, endpoint_id: str, delivery_id: str, request_id: str) -> None:
        queue_request(self._d.publisher, ReplayRequest(
            delivery_id=delivery_id, tenant_id=principal.tenant_id, endpoint_id=endpoint_id,
            requested_by=principal.key_id, requested_at_ms=self._d.now_ms(), request_id=request_id, action=SKIP))


def _shown(key: str) -> str:
    """A key in a message: any text, possibly long."""
    return repr(key if len(key) <= 80 else key[:80] + "...")
