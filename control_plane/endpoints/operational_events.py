"""The control plane emits operational events (core.operational_events) and runs auto-disable.

What it observes, and what it emits into the events topic (fan-out then treats them like any event):

* the dispatcher's signals (control_plane.endpoints.signals hands them here): ``failing`` starts the
  endpoint's auto-disable clock and emits ``webhooks.endpoint.failing``; ``recovered`` deletes
  the clock and emits ``.recovered``; ``exhausted`` emits ``webhooks.delivery.exhausted``;
  ``gone`` disables the endpoint and emits ``.disabled`` (reason ``gone``);
* its own changes: a person enables (the clock restarts: the count is reset) or disables an
  endpoint, rotates its secret;
* time: :meth:`OperationalEvents.sweep` (a loop of the server) warns at the tenant's shares of
  the window and disables with reason ``auto_disabled`` at its end (dry-run: a last warning), and
  publishes the events of people's changes that Kafka did not confirm (below).

Why the clock lives here and not in the job: the control plane owns what it decides on (the
tenant's setting, the endpoint's status, its enable history), the disable is a control-plane
change anyway, and the job already tells it the two facts the clock needs -- the breaker opened
(the first of a failing episode) and a success closed it. Keeping it in the job would ship every
tenant's setting to the dispatcher and add a timer per failing endpoint to its state, for a
decision it could not apply itself. The clock row outlives restarts of either side.

Exactly-once by ids, not by transactions: every event's id is derived from what happened
(core.operational_events.event_id), and each is published *before* the state change that records
it (clock row, disable), so a crash in between publishes the same id again, which fan-out drops.
A publish that fails raises: a signal is then read again, a sweep tried again.

The events of a person's change (an enable, a disable by an operator, a secret rotation) cannot go
first -- the change may still be refused or lose a race, and no event may announce a change that
did not happen -- and must not be lost either. So they are *pending*
(cassandra/schema/023_pending_operational_events.cql):

* before the change's conditional write, its event is recorded (:meth:`OperationalEvents.enabling`
  and the others, called by the endpoint service), naming the write it announces
  (core.operational_events.ChangeMark); the change is refused if that record fails;
* after the write, the event is published and its row deleted once Kafka confirmed it; a write
  that did not apply (a lost race) deletes the row; a publish that fails leaves it, and the change
  still succeeds;
* :meth:`OperationalEvents.sweep` publishes every row older than ``grace_ms`` (longer than a request
  takes from its row to its publish) whose write the endpoint's audit trail shows, and deletes
  rows whose write never happened (core.operational_events.pending_verdict). So a Kafka outage, or a
  control plane dying between the write and the publish, only delays the event: by the grace period
  and a sweep interval after Kafka is back.

Several control-plane replicas sweep at once, and a sweep may publish a row its request is still
publishing: both publish the same record under the same deterministic id, which fan-out's dedupe
drops (rows expire after 3 days, well inside its 7-day window), so this is harmless.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from control_plane.domain import DeliveryStatus, Endpoint, EndpointVersion, Principal
from control_plane.endpoints.operational_store import OperationalStore, PendingEvent, StoredPolicy
from control_plane.endpoints.service import require_write
from control_plane.errors import InvalidArgument, Unavailable
from control_plane.publishing.publisher import Publisher, PublishError
from control_plane.store import EndpointStore, HistoryStore
from core import operational_events as ops
from core import target_proof
from core.records import EndpointSignal, EndpointStatus, EventRecord
from core.timeutil import ms_to_iso

log = logging.getLogger(__name__)

# Before an auto-disable, the history is read for a success since the clock started: deliveries
# created up to a retry deadline before it (a delivery created then may have succeeded after),
# newest first, this many at most.
HISTORY_LOOKBACK_MS = 24 * 3600 * 1000
HISTORY_CHECK_ROWS = 2_000
# A pending event younger than this belongs to a request that may still be between its row and its
# publish: the endpoint's write, its config's publish (Kafka's delivery timeout, 10 s) and the
# lease, then the event's own publish (10 s again). A sweep leaves it to the request.
PENDING_GRACE_MS = 30_000

# Disables an active endpoint (tenant, endpoint, audit text); None when it was not active.
Disable = Callable[[str, str, str], Endpoint | None]
# Disables an endpoint whose receiver answered 410 (EndpointService.disable_gone).
DisableGone = Callable[[EndpointSignal], Endpoint | None]


class OperationalEvents:
    def __init__(self, store: OperationalStore, endpoints: EndpointStore, publisher: Publisher,
                 now_ms: Callable[[], int], proof_key: bytes = b"", history: HistoryStore | None = None,
                 *, grace_ms: int = PENDING_GRACE_MS, new_attempt: Callable[[], str] = lambda: uuid.uuid4().hex,
                 ) -> None:
        """``proof_key``: core.target_proof's key; the job dead-letters a webhooks.* event
        without its proof (tests of this module alone may leave it empty)."""
        self._store = store
        self._grace_ms = grace_ms
        self._new_attempt = new_attempt
        self._proof_key = proof_key
        self._history = history
        self._endpoints = endpoints
        self._publisher = publisher
        self._now_ms = now_ms
        self._disable: Disable | None = None
        self._disable_gone: DisableGone | None = None
        self.emitted = 0  # events published (a re-published id counts again)

    def bind(self, disable: Disable, disable_gone: DisableGone) -> None:
        """The endpoint service's disables (it holds this object too: bound after both exist)."""
        self._disable, self._disable_gone = disable, disable_gone

    # -- the dispatcher's signals --------------------------------------------------------------

    def on_signal(self, s: EndpointSignal) -> None:
        loud = ops.emits_event(s.event_type)  # the no-loop rule
        if s.signal == ops.SIGNAL_GONE:
            self._gone(s, loud)
        elif s.signal == ops.SIGNAL_FAILING:
            clock = self._store.get_clock(s.tenant_id, s.endpoint_id)
            if clock is not None and clock.episode == s.sequence:
                return  # read again: done before
            if loud:
                self._emit(ops.ENDPOINT_FAILING, s.tenant_id, s.endpoint_id, (ops.SIGNAL_FAILING, str(s.sequence)),
                           s.at_ms, {"reason": ops.BREAKER_OPENED,
                                     "failing_since": ms_to_iso(clock.since_ms if clock else s.at_ms)})
            if clock is None:
                # The clock starts at the opening; without a success since, an older clock (an
                # enable restarted it while the breaker stayed open) keeps counting.
                clock = ops.FailingClock(s.tenant_id, s.endpoint_id, since_ms=s.at_ms, quiet=not loud)
            self._store.put_clock(replace(clock, episode=s.sequence))
        elif s.signal == ops.SIGNAL_RECOVERED:
            # Whatever episode the clock holds (a job started afresh counts episodes from 1
            # again), a success ends it: the signals of one endpoint arrive in order.
            clock = self._store.get_clock(s.tenant_id, s.endpoint_id)
            if (not clock.quiet) if clock is not None else loud:
                data = {"failing_since": ms_to_iso(clock.since_ms)} if clock is not None else {}
                self._emit(ops.ENDPOINT_RECOVERED, s.tenant_id, s.endpoint_id,
                           (ops.SIGNAL_RECOVERED, str(s.sequence)), s.at_ms, data)
            self._store.delete_clock(s.tenant_id, s.endpoint_id)
        elif s.signal == ops.SIGNAL_EXHAUSTED:
            if loud:
                self._emit(ops.DELIVERY_EXHAUSTED, s.tenant_id, s.endpoint_id, (ops.SIGNAL_EXHAUSTED, s.delivery_id),
                           s.at_ms, {"delivery_id": s.delivery_id, "event_id": s.event_id,
                                     "event_type": s.event_type, "outcome": s.detail,
                                     "last_status": s.http_status, "attempts": s.attempts})
        else:
            log.warning("endpoint signal %r of endpoint %s not understood: skipped", s.signal, s.endpoint_id)

    def _gone(self, s: EndpointSignal, loud: bool) -> None:
        assert self._disable_gone is not None, "bind() the endpoint service first"
        current = self._endpoints.get_endpoint(s.tenant_id, s.endpoint_id)
        if current is None or current.status is not EndpointStatus.ACTIVE or current.config_version != s.config_version:
            return  # stale (changed since) or done: a re-read signal finds it disabled
        if loud:
            self._emit(ops.ENDPOINT_DISABLED, s.tenant_id, s.endpoint_id, ("disabled", f"gone:{s.config_version}"),
                       s.at_ms, {"reason": ops.GONE, "detail": s.detail, "config_version": s.config_version})
        changed = self._disable_gone(s)
        if changed is not None:
            log.warning("endpoint %s disabled: %s", s.endpoint_id, s.detail)
        self._stop_clock(s.tenant_id, s.endpoint_id)

    def _stop_clock(self, tenant_id: str, endpoint_id: str) -> None:
        """Disabled otherwise (a person, a 410): no warnings about it until it is enabled again,
        which restarts the clock. Best effort after a person's committed change (its sweep would
        find the endpoint disabled anyway)."""
        try:
            clock = self._store.get_clock(tenant_id, endpoint_id)
            if clock is not None and not clock.ended:
                self._store.put_clock(replace(clock, ended=True))
        except Unavailable as exc:
            log.error("endpoint %s disabled, its failing clock not stopped: %s", endpoint_id, exc)

    # -- a person's changes ---------------------------------------------------------------------

    def enabling(self, endpoint: Endpoint, by: str) -> Announced:
        """``endpoint``: the version about to be written. Enabling again resets the count: once
        written, a failing endpoint's clock restarts."""
        return self._announce(ops.ENDPOINT_ENABLED, endpoint, "enabled",
                              {"by": by, "config_version": endpoint.config_version}, self._restart_clock)

    def disabling_by_operator(self, endpoint: Endpoint, by: str) -> Announced:
        return self._announce(ops.ENDPOINT_DISABLED, endpoint, "disabled",
                              {"reason": ops.OPERATOR, "detail": f"disabled by {by}",
                               "config_version": endpoint.config_version}, self._stop_clock)

    def rotating_secret(self, endpoint: Endpoint) -> Announced:
        # A rotation adds a key numbered past every other: the newest is the one it made.
        key_version = max((k.version for k in endpoint.signing_keys), default=0)
        return self._announce(ops.SECRET_ROTATED, endpoint, "secret_rotated",
                              {"key_version": key_version, "config_version": endpoint.config_version})

    def _announce(self, type_name: str, endpoint: Endpoint, transition: str, data: dict[str, Any],
                  then: Callable[[str, str], None] | None = None) -> Announced:
        """Record the event of the write about to be made as pending; raises Unavailable (the
        change is then refused: nothing was written)."""
        # The change's own time is the event's: the sweep publishes the very record built here.
        event = self._event(type_name, endpoint.tenant_id, endpoint.endpoint_id,
                            (transition, str(endpoint.config_version)), endpoint.updated_at_ms, data)
        mark = ops.ChangeMark(endpoint.config_version, endpoint.changed_by, endpoint.change)
        pending = PendingEvent(endpoint.tenant_id, endpoint.endpoint_id, self._new_attempt(), self._now_ms(), mark,
                               event)
        self._store.put_pending(pending)
        return Announced(self, pending, then)

    def _committed(self, pending: PendingEvent, then: Callable[[str, str], None] | None) -> None:
        if then is not None:
            then(pending.tenant_id, pending.endpoint_id)
        try:
            self._publish(pending.event)
        except PublishError as exc:
            log.warning("operational event %s of endpoint %s not published yet, the sweep publishes it: %s",
                        pending.event.event_type, pending.endpoint_id, exc)
            return
        self._forget(pending)

    def _forget(self, pending: PendingEvent) -> None:
        # Left behind, the row costs a sweep one more publish of an id fan-out drops.
        with contextlib.suppress(Unavailable):
            self._store.delete_pending(pending)

    def _restart_clock(self, tenant_id: str, endpoint_id: str) -> None:
        try:
            clock = self._store.get_clock(tenant_id, endpoint_id)
            if clock is not None:
                self._store.put_clock(ops.restarted(clock, self._now_ms()))
        except Unavailable as exc:
            # The enable is committed: the call succeeds. The clock stays as it was (ended, if it
            # was auto-disabled: no new disable before the breaker's next episode).
            log.error("endpoint %s enabled, its failing clock not restarted: %s", endpoint_id, exc)

    def republish_pending(self) -> int:
        """One pass over the pending events at least ``grace_ms`` old: publish those whose write
        happened, delete those whose write never will; returns how many it published. Raises
        PublishError at the first publish Kafka refuses (the rest wait for the next pass)."""
        left_before = self._now_ms() - self._grace_ms
        published = 0
        for pending in self._store.iter_pending():
            if pending.since_ms > left_before:
                continue
            verdict = self._verdict(pending)
            if verdict is ops.PendingVerdict.WAIT:
                continue
            if verdict is ops.PendingVerdict.PUBLISH:
                self._publish(pending.event)
                published += 1
                log.info("operational event %s of endpoint %s published by the sweep", pending.event.event_id,
                         pending.endpoint_id)
            else:
                log.info("operational event %s of endpoint %s dropped: its change was not written",
                         pending.event.event_id, pending.endpoint_id)
            self._forget(pending)
        return published

    def _verdict(self, pending: PendingEvent) -> ops.PendingVerdict:
        version = pending.mark.config_version
        current = self._endpoints.get_endpoint(pending.tenant_id, pending.endpoint_id)
        if current is None:
            return ops.pending_verdict(pending.mark, None, None)
        written: Endpoint | EndpointVersion | None = current
        if current.config_version > version:
            written = next((v for v in self._endpoints.list_versions(pending.tenant_id, pending.endpoint_id)
                            if v.config_version == version), None)
        return ops.pending_verdict(pending.mark, current.config_version, _mark(written, version))

    # -- the sweep: pending events, auto-disable --------------------------------------------------

    def sweep(self) -> int:
        """One pass of the control plane's loop: the pending events of people's changes
        (:meth:`republish_pending`), then the failing endpoints. Either failing (Kafka, Cassandra)
        does not stop the other; the first failure is raised once both ran, so the loop counts the
        pass as failed and the next one tries again. Returns how many events and actions it took."""
        done = 0
        failure: PublishError | Unavailable | None = None
        for part in (self.republish_pending, self._clocks_pass):
            try:
                done += part()
            except (PublishError, Unavailable) as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return done

    def _clocks_pass(self) -> int:
        """One pass over the failing endpoints: what is due for each (core.operational_events.due)."""
        assert self._disable is not None, "bind() the endpoint service first"
        now = self._now_ms()
        acted = 0
        policies: dict[str, ops.AutoDisablePolicy] = {}
        for clock in self._store.iter_clocks():
            if clock.tenant_id not in policies:
                policies[clock.tenant_id] = self._store.get_policy(clock.tenant_id).policy
            policy = policies[clock.tenant_id]
            action = ops.due(clock, policy, now)
            if action is None:
                continue
            acted += 1
            since = ms_to_iso(clock.since_ms)
            end = ms_to_iso(clock.since_ms + policy.window_s * 1000)
            if isinstance(action, ops.Warn):
                if not clock.quiet:
                    self._emit(ops.ENDPOINT_FAILING, clock.tenant_id, clock.endpoint_id,
                               (ops.SIGNAL_FAILING, f"{clock.since_ms}:{action.share}"), now,
                               {"reason": ops.AUTO_DISABLE_WARNING, "failing_since": since, "share": action.share,
                                "disable_at": end, "dry_run": policy.dry_run})
                self._store.put_clock(replace(clock, warned=action.warned))
            elif action.dry_run:
                if not clock.quiet:
                    self._emit(ops.ENDPOINT_FAILING, clock.tenant_id, clock.endpoint_id,
                               (ops.SIGNAL_FAILING, f"{clock.since_ms}:1.0"), now,
                               {"reason": ops.AUTO_DISABLE_DRY_RUN, "failing_since": since, "share": 1.0,
                                "disable_at": end, "dry_run": True})
                self._store.put_clock(replace(clock, ended=True, warned=len(policy.warn_at)))
            else:
                self._auto_disable(clock, policy, since, now)
        return acted

    def _auto_disable(self, clock: ops.FailingClock, policy: ops.AutoDisablePolicy, since: str, now: int) -> None:
        assert self._disable is not None
        if self._succeeded_since(clock, now):
            # The history disagrees with the clock: a success whose signal never came (a job
            # restored to before an opening it had reported, then working). Not failing.
            log.warning("endpoint %s: a delivery succeeded since %s; its failing clock is dropped", clock.endpoint_id,
                        since)
            self._store.delete_clock(clock.tenant_id, clock.endpoint_id)
            return
        current = self._endpoints.get_endpoint(clock.tenant_id, clock.endpoint_id)
        if current is not None and current.status is EndpointStatus.ACTIVE:
            detail = f"{ops.AUTO_DISABLED}: failing without a success since {since} ({policy.window_s} s window)"
            if not clock.quiet:
                self._emit(ops.ENDPOINT_DISABLED, clock.tenant_id, clock.endpoint_id,
                           ("disabled", f"auto:{clock.since_ms}"), now,
                           {"reason": ops.AUTO_DISABLED, "detail": detail, "config_version": current.config_version})
            if self._disable(clock.tenant_id, clock.endpoint_id, detail) is not None:
                log.warning("endpoint %s of tenant %s auto-disabled", clock.endpoint_id, clock.tenant_id)
        # Disabled now, or already (a person, a 410) or deleted: nothing more until an enable.
        self._store.put_clock(replace(clock, ended=True))

    def _succeeded_since(self, clock: ops.FailingClock, now: int) -> bool:
        """Whether the delivery history shows a success of the endpoint since the clock started
        (the newest deliveries first, at most HISTORY_CHECK_ROWS of them: a recovered endpoint's
        newest deliveries are the ones that succeed)."""
        if self._history is None:
            return False
        rows = self._history.iter_endpoint_deliveries(clock.tenant_id, clock.endpoint_id,
                                                      clock.since_ms - HISTORY_LOOKBACK_MS, now + 1, None)
        for n, d in enumerate(rows):
            if n >= HISTORY_CHECK_ROWS:
                return False
            if d.status is DeliveryStatus.SUCCEEDED and (d.updated_at_ms or d.created_at_ms) >= clock.since_ms:
                return True
        return False

    # -- the tenant's setting -----------------------------------------------------------------------

    def auto_disable_setting(self, principal: Principal) -> StoredPolicy:
        return self._store.get_policy(principal.tenant_id)

    def set_auto_disable(self, principal: Principal, off: bool, window_s: int, warn_at: tuple[float, ...],
                         dry_run: bool) -> StoredPolicy:
        """Replace the tenant's setting (0 / empty: the default); a change applies at the next
        sweep to every failing endpoint of the tenant, its clock kept."""
        require_write(principal)
        try:
            policy = ops.AutoDisablePolicy(window_s=window_s or ops.DEFAULT_WINDOW_S,
                                           warn_at=warn_at or ops.DEFAULT_WARN_AT, dry_run=dry_run, enabled=not off)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc
        self._store.set_policy(principal.tenant_id, policy, principal.key_id, self._now_ms())
        log.info("tenant %s: auto-disable %s by %s", principal.tenant_id, policy, principal.key_id)
        return self._store.get_policy(principal.tenant_id)

    # -- publishing --------------------------------------------------------------------------------

    def _emit(self, type_name: str, tenant_id: str, endpoint_id: str, what: tuple[str, str], at_ms: int,
              data: dict[str, Any]) -> None:
        self._publish(self._event(type_name, tenant_id, endpoint_id, what, at_ms, data))

    def _event(self, type_name: str, tenant_id: str, endpoint_id: str, what: tuple[str, str], at_ms: int,
               data: dict[str, Any]) -> EventRecord:
        event = ops.build(type_name, tenant_id, endpoint_id, ops.event_id(endpoint_id, *what), at_ms, data)
        if self._proof_key:
            event = replace(event, target_proof=target_proof.prove(self._proof_key, tenant_id, event.event_id,
                                                                   target_proof.OPERATIONAL))
        return event

    def _publish(self, event: EventRecord) -> None:
        self._publisher.publish_event(event)
        self.emitted += 1
        log.info("operational event %s %s for endpoint %s", event.event_type, event.event_id, event.object_id)


@dataclass(frozen=True)
class Announced:
    """The pending event of one write (control_plane.endpoints.service.Announcement): the endpoint
    service says whether the write applied."""

    events: OperationalEvents
    pending: PendingEvent
    then: Callable[[str, str], None] | None  # after the write: the failing clock's part of the change

    def committed(self) -> None:
        """The write applied: publish the event (its row goes once Kafka confirmed it)."""
        self.events._committed(self.pending, self.then)

    def not_committed(self) -> None:
        """The write did not apply (a lost race): the event is not owed."""
        self.events._forget(self.pending)


def _mark(written: Endpoint | EndpointVersion | None, version: int) -> ops.ChangeMark | None:
    """What wrote ``version``: the endpoint row at that version, or that version's audit row."""
    if written is None or written.config_version != version:
        return None
    return ops.ChangeMark(written.config_version, written.changed_by, written.change)
