"""The control plane emits operational events (core.operational_events) and runs auto-disable.

What it observes, and what it emits into the events topic (fan-out then treats them like any event):

* the dispatcher's signals (control_plane.endpoints.signals hands them here): ``failing`` starts the
  endpoint's auto-disable clock and emits ``webhooks.endpoint.failing``; ``recovered`` deletes
  the clock and emits ``.recovered``; ``exhausted`` emits ``webhooks.delivery.exhausted``;
  ``gone`` disables the endpoint and emits ``.disabled`` (reason ``gone``);
* its own changes: a person enables (the clock restarts: the count is reset) or disables an
  endpoint, rotates its secret;
* time: :meth:`OperationalEvents.sweep` (a loop of the server) warns at the tenant's shares of
  the window and disables with reason ``auto_disabled`` at its end (dry-run: a last warning).

Why the clock lives here and not in the job: the control plane owns what it decides on (the
tenant's setting, the endpoint's status, its enable history), the disable is a control-plane
change anyway, and the job already tells it the two facts the clock needs -- the breaker opened
(the first of a failing episode) and a success closed it. Keeping it in the job would ship every
tenant's setting to the dispatcher and add a timer per failing endpoint to its state, for a
decision it could not apply itself. The clock row outlives restarts of either side.

Exactly-once by ids, not by transactions: every event's id is derived from what happened
(core.operational_events.event_id), and each is published *before* the state change that records
it (clock row, disable), so a crash in between publishes the same id again, which fan-out drops.
A publish that fails raises: a signal is then read again, a sweep tried again. Events of a
person's change are published after it is committed, best effort: a failure is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from control_plane.domain import DeliveryStatus, Endpoint, Principal
from control_plane.endpoints.operational_store import OperationalStore, StoredPolicy
from control_plane.endpoints.service import require_write
from control_plane.errors import InvalidArgument, Unavailable
from control_plane.publishing.publisher import Publisher, PublishError
from control_plane.store import EndpointStore, HistoryStore
from core import operational_events as ops
from core import target_proof
from core.records import EndpointSignal, EndpointStatus
from core.timeutil import ms_to_iso

log = logging.getLogger(__name__)

# Before an auto-disable, the history is read for a success since the clock started: deliveries
# created up to a retry deadline before it (a delivery created then may have succeeded after),
# newest first, this many at most.
HISTORY_LOOKBACK_MS = 24 * 3600 * 1000
HISTORY_CHECK_ROWS = 2_000

# Disables an active endpoint (tenant, endpoint, audit text); None when it was not active.
Disable = Callable[[str, str, str], Endpoint | None]
# Disables an endpoint whose receiver answered 410 (EndpointService.disable_gone).
DisableGone = Callable[[EndpointSignal], Endpoint | None]


class OperationalEvents:
    def __init__(self, store: OperationalStore, endpoints: EndpointStore, publisher: Publisher,
                 now_ms: Callable[[], int], proof_key: bytes = b"", history: HistoryStore | None = None) -> None:
        """``proof_key``: core.target_proof's key; the job dead-letters a webhooks.* event
        without its proof (tests of this module alone may leave it empty)."""
        self._store = store
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

    def enabled(self, endpoint: Endpoint, by: str) -> None:
        """Enabling again resets the count: a failing endpoint's clock restarts now."""
        now = self._now_ms()
        try:
            clock = self._store.get_clock(endpoint.tenant_id, endpoint.endpoint_id)
            if clock is not None:
                self._store.put_clock(ops.restarted(clock, now))
        except Unavailable as exc:
            # The enable is committed: the call succeeds. The clock stays as it was (ended, if it
            # was auto-disabled: no new disable before the breaker's next episode).
            log.error("endpoint %s enabled, its failing clock not restarted: %s", endpoint.endpoint_id, exc)
        self._best_effort(ops.ENDPOINT_ENABLED, endpoint, ("enabled", str(endpoint.config_version)), now,
                          {"by": by, "config_version": endpoint.config_version})

    def disabled_by_operator(self, endpoint: Endpoint, by: str) -> None:
        self._stop_clock(endpoint.tenant_id, endpoint.endpoint_id)
        self._best_effort(ops.ENDPOINT_DISABLED, endpoint, ("disabled", str(endpoint.config_version)), self._now_ms(),
                          {"reason": ops.OPERATOR, "detail": f"disabled by {by}",
                           "config_version": endpoint.config_version})

    def secret_rotated(self, endpoint: Endpoint, key_version: int) -> None:
        self._best_effort(ops.SECRET_ROTATED, endpoint, ("secret_rotated", str(endpoint.config_version)),
                          self._now_ms(), {"key_version": key_version, "config_version": endpoint.config_version})

    def _best_effort(self, type_name: str, endpoint: Endpoint, what: tuple[str, str], at_ms: int,
                     data: dict[str, Any]) -> None:
        try:
            self._emit(type_name, endpoint.tenant_id, endpoint.endpoint_id, what, at_ms, data)
        except PublishError as exc:
            log.warning("operational event %s of endpoint %s not published: %s", type_name, endpoint.endpoint_id, exc)

    # -- auto-disable ----------------------------------------------------------------------------

    def sweep(self) -> int:
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
        event = ops.build(type_name, tenant_id, endpoint_id, ops.event_id(endpoint_id, *what), at_ms, data)
        if self._proof_key:
            event = replace(event, target_proof=target_proof.prove(self._proof_key, tenant_id, event.event_id,
                                                                   target_proof.OPERATIONAL))
        self._publisher.publish_event(event)
        self.emitted += 1
        log.info("operational event %s %s for endpoint %s", type_name, event.event_id, endpoint_id)
