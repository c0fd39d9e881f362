"""Operational events: what the platform tells a tenant about its own endpoints, as webhooks.

The types are catalogued here, under the reserved prefix ``webhooks.`` (tenants cannot create
types there), each with a JSON Schema and a version. They travel the path of business events:
the part that observes the change (the control plane, from the dispatcher's signals or from its
own changes) publishes an :class:`~core.records.EventRecord` into the events topic, fan-out sends
it to the tenant's endpoints that subscribe to it by name or ``webhooks.*`` (``*`` alone does not
include them: :func:`core.fanout.filter_accepts`), signed, retried, in the history, replayable.

=====================================  ======================================================
type                                    when
=====================================  ======================================================
``webhooks.endpoint.failing``           the breaker opened (closed -> open), or the endpoint
                                        crossed a stated share of its auto-disable window
``webhooks.endpoint.recovered``         a success closed the breaker of a failing endpoint
``webhooks.endpoint.disabled``          by a 410 (``gone``), by ``auto_disabled``, by an
                                        ``operator``
``webhooks.endpoint.enabled``           an operator enabled it again
``webhooks.delivery.exhausted``         a delivery ended without success (failed, expired)
``webhooks.endpoint.secret_rotated``    a new signing key
=====================================  ======================================================

Ids are derived from what happened (:func:`event_id`): the endpoint, the transition, and a
sequence a restart reproduces -- the breaker's episode number (keyed state, rolled back with the
checkpoint, so a re-run opening is the same episode), the delivery id, the config version of a
change, the start of the failing clock and the share crossed. Fan-out's dedupe by event id then
makes a re-emission after a restart a duplicate, not a second event.

The no-loop rule (:func:`emits_event`): nothing that happened to a delivery *of an operational
event* produces an operational event. An operations endpoint that fails opens its breaker,
exhausts deliveries, may be auto-disabled or answer 410 -- and none of it is announced, to
itself or to anyone: one failing endpoint cannot make events that make more events.

Auto-disable (:class:`AutoDisablePolicy`, :func:`due`): an endpoint failing without a single
success since its breaker opened, for the tenant's window, is disabled with reason
``auto_disabled``; warnings go out at the stated shares of the window; dry-run only warns.

The events of a person's change (an enable, a disable, a rotation) are recorded before the change
is written and name the write (:class:`ChangeMark`); :func:`pending_verdict` says whether one left
behind is owed (the write happened), void, or not decided yet.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.breaker import BreakerState, CircuitState
from core.records import EndpointSignal, EventRecord
from core.timeutil import ms_to_iso

PREFIX = "webhooks."
SCHEMA_VERSION = "1.0"

ENDPOINT_FAILING = "webhooks.endpoint.failing"
ENDPOINT_RECOVERED = "webhooks.endpoint.recovered"
ENDPOINT_DISABLED = "webhooks.endpoint.disabled"
ENDPOINT_ENABLED = "webhooks.endpoint.enabled"
DELIVERY_EXHAUSTED = "webhooks.delivery.exhausted"
SECRET_ROTATED = "webhooks.endpoint.secret_rotated"

# Why an endpoint was disabled (the ``reason`` of ``webhooks.endpoint.disabled``).
GONE, AUTO_DISABLED, OPERATOR = "gone", "auto_disabled", "operator"
# Why it is failing (the ``reason`` of ``webhooks.endpoint.failing``).
BREAKER_OPENED = "breaker_opened"
AUTO_DISABLE_WARNING, AUTO_DISABLE_DRY_RUN = "auto_disable_warning", "auto_disable_dry_run"

# The dispatcher's signal names for what it observes (core.records.EndpointSignal.signal).
SIGNAL_GONE, SIGNAL_FAILING, SIGNAL_RECOVERED, SIGNAL_EXHAUSTED = "gone", "failing", "recovered", "exhausted"


def is_operational(event_type: str) -> bool:
    return event_type.startswith(PREFIX)


def emits_event(cause_event_type: str) -> bool:
    """The no-loop rule: an observation caused by a delivery of an operational event (its type
    starts with ``webhooks.``) produces no operational event. ``cause_event_type`` is the type
    of the delivery that caused it; "" when no delivery did (a person's change)."""
    return not is_operational(cause_event_type)


def event_id(endpoint_id: str, transition: str, sequence: str) -> str:
    """The event id of one operational event: the same (endpoint, transition, sequence) is the
    same event, however often it is observed. Length prefixes keep the parts apart."""
    parts = (endpoint_id, transition, sequence)
    digest = hashlib.sha256(":".join(f"{len(p)}:{p}" for p in parts).encode()).hexdigest()
    return "evt_ops_" + digest[:32]


def breaker_transition(before: BreakerState, after: BreakerState) -> str | None:
    """``failing`` when the breaker opened from closed (a new episode), ``recovered`` when a
    success closed it from open or half open, else None (a re-opening after a failed probe is
    the same episode)."""
    if before.state is CircuitState.CLOSED and after.state is CircuitState.OPEN:
        return SIGNAL_FAILING
    if before.state is not CircuitState.CLOSED and after.state is CircuitState.CLOSED:
        return SIGNAL_RECOVERED
    return None


# -- the catalog -----------------------------------------------------------------------------------

_COMMON: dict[str, Any] = {
    "type": {"type": "string"},
    "event_id": {"type": "string"},
    "tenant_id": {"type": "string"},
    "endpoint_id": {"type": "string"},
    "occurred_at": {"type": "string"},
}


def _schema(data: Mapping[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["type", "event_id", "tenant_id", "endpoint_id", "occurred_at", "data"],
        "properties": {**_COMMON, "data": {"type": "object", "required": list(required),
                                           "properties": dict(data)}},
    }


_TIME = {"type": "string"}
_INT_OR_NULL = {"type": ["integer", "null"]}


@dataclass(frozen=True)
class OperationalType:
    name: str
    description: str
    schema: dict[str, Any]
    example_data: dict[str, Any] = field(default_factory=dict)
    version: str = SCHEMA_VERSION


CATALOG: dict[str, OperationalType] = {t.name: t for t in (
    OperationalType(
        ENDPOINT_FAILING,
        "The endpoint is failing: its breaker opened, or it crossed a share of its auto-disable window.",
        _schema({"reason": {"enum": [BREAKER_OPENED, AUTO_DISABLE_WARNING, AUTO_DISABLE_DRY_RUN]},
                 "failing_since": _TIME, "share": {"type": "number"}, "disable_at": _TIME,
                 "dry_run": {"type": "boolean"}}, ("reason", "failing_since")),
        {"reason": AUTO_DISABLE_WARNING, "failing_since": "2026-12-01T10:00:00.000Z", "share": 0.5,
         "disable_at": "2026-12-06T10:00:00.000Z", "dry_run": False}),
    OperationalType(
        ENDPOINT_RECOVERED, "A success closed the breaker of a failing endpoint.",
        _schema({"failing_since": _TIME}, ()), {"failing_since": "2026-12-01T10:00:00.000Z"}),
    OperationalType(
        ENDPOINT_DISABLED, "The endpoint was disabled: by a 410 Gone, by auto-disable or by an operator.",
        _schema({"reason": {"enum": [GONE, AUTO_DISABLED, OPERATOR]}, "detail": {"type": "string"},
                 "config_version": {"type": "integer"}}, ("reason", "detail")),
        {"reason": AUTO_DISABLED, "detail": "failing without a success for 5 days", "config_version": 7}),
    OperationalType(
        ENDPOINT_ENABLED, "An operator enabled the endpoint again (its auto-disable clock restarts).",
        _schema({"by": {"type": "string"}, "config_version": {"type": "integer"}}, ("by",)),
        {"by": "key_ops", "config_version": 8}),
    OperationalType(
        DELIVERY_EXHAUSTED, "A delivery ended without success: its retries ran out or its deadline passed.",
        _schema({"delivery_id": {"type": "string"}, "event_id": {"type": "string"},
                 "event_type": {"type": "string"}, "outcome": {"enum": ["failed", "expired"]},
                 "last_status": _INT_OR_NULL, "attempts": {"type": "integer"}},
                ("delivery_id", "outcome", "last_status", "attempts")),
        {"delivery_id": "dlv_0123", "event_id": "evt_1", "event_type": "invoice.paid", "outcome": "expired",
         "last_status": 503, "attempts": 12}),
    OperationalType(
        SECRET_ROTATED, "A new signing key: receivers should fetch or store it before the overlap ends.",
        _schema({"key_version": {"type": "integer"}, "config_version": {"type": "integer"}}, ("key_version",)),
        {"key_version": 3, "config_version": 9}),
)}


def example(type_name: str) -> dict[str, Any]:
    """A complete example body of one type (what the catalog shows)."""
    t = CATALOG[type_name]
    return {"type": t.name, "event_id": event_id("ep_1", t.name, "1"), "tenant_id": "t_1", "endpoint_id": "ep_1",
            "occurred_at": "2026-12-06T10:00:00.000Z", "data": dict(t.example_data)}


def build(type_name: str, tenant_id: str, endpoint_id: str, id_: str, occurred_at_ms: int,
          data: Mapping[str, Any]) -> EventRecord:
    """The event record of one operational event (its body is what receivers get)."""
    if type_name not in CATALOG:
        raise ValueError(f"unknown operational event type {type_name!r}")
    body = {"type": type_name, "event_id": id_, "tenant_id": tenant_id, "endpoint_id": endpoint_id,
            "occurred_at": ms_to_iso(occurred_at_ms), "data": dict(data)}
    # The endpoint is the object, its events ordered by time: an operations endpoint ordered by
    # object_id gets each endpoint's events in the order they happened.
    return EventRecord(event_id=id_, tenant_id=tenant_id, event_type=type_name, schema_version=SCHEMA_VERSION,
                       object_id=endpoint_id, object_version=occurred_at_ms, occurred_at_ms=occurred_at_ms,
                       payload=json.dumps(body, separators=(",", ":"), sort_keys=True).encode())


# -- the events of a person's change ------------------------------------------------------------------

@dataclass(frozen=True)
class ChangeMark:
    """One write of an endpoint row as its audit trail shows it: the config version it made, by
    whom, what. The event of a person's change names the write it announces, so a sweep can tell
    whether that write happened. (Another request of the same person making the same change at
    that version announces the same event id: it did happen.)"""

    config_version: int
    changed_by: str
    change: str


class PendingVerdict(enum.Enum):
    PUBLISH = "publish"  # the announced write happened: the event is owed
    DROP = "drop"  # it never will (another write took its version, or there is no endpoint)
    WAIT = "wait"  # not known yet: its version is not written, or not readable


def pending_verdict(announced: ChangeMark, latest_version: int | None, written: ChangeMark | None) -> PendingVerdict:
    """What a sweep does with the pending event of a person's change that its request left behind.

    The event is recorded before the change's conditional write, so the write may have applied (a
    crash or a failed publish after it), not applied (refused, a lost race, a crash before it), or be
    undecided (a lightweight transaction whose outcome Cassandra could not learn, finished by the
    partition's next one). ``latest_version``: the endpoint row's config version now (None: no
    row); ``written``: what wrote ``announced.config_version`` (the row's mark, or that version's
    audit row), None if not readable. Versions only grow and each is written once, so a version
    below the announced one may still become it (wait; the row's TTL ends an undecided wait), and a
    version written by anything else means the announced write never happened."""
    if latest_version is None:
        return PendingVerdict.DROP
    if latest_version < announced.config_version or written is None:
        return PendingVerdict.WAIT
    return PendingVerdict.PUBLISH if written == announced else PendingVerdict.DROP


# -- auto-disable -----------------------------------------------------------------------------------

DEFAULT_WINDOW_S = 5 * 24 * 3600
DEFAULT_WARN_AT = (0.5, 0.7, 0.9)
MIN_WINDOW_S = 1  # short windows are for tests; the API takes what the tenant asks for
MAX_WINDOW_S = 90 * 24 * 3600


@dataclass(frozen=True)
class AutoDisablePolicy:
    """A tenant's auto-disable setting: the window, the shares of it that warn, dry-run."""

    window_s: int = DEFAULT_WINDOW_S
    warn_at: tuple[float, ...] = DEFAULT_WARN_AT
    dry_run: bool = False
    enabled: bool = True

    def __post_init__(self) -> None:
        if not MIN_WINDOW_S <= self.window_s <= MAX_WINDOW_S:
            raise ValueError(f"the auto-disable window must be between {MIN_WINDOW_S} s and {MAX_WINDOW_S} s")
        if any(not 0 < w < 1 for w in self.warn_at):
            raise ValueError("warning shares must be between 0 and 1 (exclusive), e.g. 0.5,0.7,0.9")
        if list(self.warn_at) != sorted(set(self.warn_at)):
            raise ValueError("warning shares must be increasing and distinct")
        if len(self.warn_at) > 10:
            raise ValueError("at most 10 warning shares")


@dataclass(frozen=True)
class FailingClock:
    """An endpoint failing without a success since ``since_ms``: the breaker's episode that
    started it, how many warnings of the policy were sent, whether the window's end was acted
    on, and ``quiet`` (the episode was caused by a delivery of an operational event: its
    warnings and disable produce no event, by the no-loop rule)."""

    tenant_id: str
    endpoint_id: str
    since_ms: int
    episode: int = 0
    warned: int = 0
    ended: bool = False
    quiet: bool = False


@dataclass(frozen=True)
class Warn:
    share: float
    warned: int  # the clock's ``warned`` after this warning (lower shares passed are skipped)
    disable_at_ms: int


@dataclass(frozen=True)
class Disable:
    dry_run: bool


def due(clock: FailingClock, policy: AutoDisablePolicy, now_ms: int) -> Warn | Disable | None:
    """What is due for a failing endpoint at ``now_ms``: the window's end (disable, or the
    dry-run's last warning), else the highest share crossed and not yet warned about (a control
    plane that was down sends one warning, not a burst), else nothing."""
    if not policy.enabled or clock.ended:
        return None
    window_ms = policy.window_s * 1000
    end_ms = clock.since_ms + window_ms
    if now_ms >= end_ms:
        return Disable(policy.dry_run)
    crossed = [i for i, share in enumerate(policy.warn_at) if now_ms >= clock.since_ms + int(share * window_ms)]
    if crossed and crossed[-1] + 1 > clock.warned:
        return Warn(policy.warn_at[crossed[-1]], crossed[-1] + 1, end_ms)
    return None


def next_due_ms(clock: FailingClock, policy: AutoDisablePolicy) -> int | None:
    """When :func:`due` next has something to say (None: never, until the clock changes)."""
    if not policy.enabled or clock.ended:
        return None
    window_ms = policy.window_s * 1000
    later = [clock.since_ms + int(s * window_ms) for s in policy.warn_at[clock.warned:]]
    return min([*later, clock.since_ms + window_ms])


def restarted(clock: FailingClock, now_ms: int) -> FailingClock:
    """Enabling the endpoint again resets the count: the clock restarts at ``now_ms``, no warning
    sent. Still failing after a whole window, it is disabled again."""
    return FailingClock(clock.tenant_id, clock.endpoint_id, since_ms=now_ms, episode=clock.episode,
                        quiet=clock.quiet)


# -- the dispatcher's signals ------------------------------------------------------------------------

def breaker_signal(endpoint_id: str, tenant_id: str, config_version: int, before: BreakerState,
                   after: BreakerState, cause_event_type: str, now_ms: int) -> EndpointSignal | None:
    """The signal of a breaker transition (:func:`breaker_transition`), or None."""
    kind = breaker_transition(before, after)
    if kind is None:
        return None
    return EndpointSignal(endpoint_id=endpoint_id, tenant_id=tenant_id, config_version=config_version,
                          signal=kind, detail=f"circuit breaker {before.state.value} -> {after.state.value}",
                          at_ms=now_ms, event_type=cause_event_type, sequence=after.episodes)


def exhausted_signal(endpoint_id: str, tenant_id: str, config_version: int, delivery_id: str, event_id: str,
                     cause_event_type: str, outcome: str, http_status: int | None, attempts: int,
                     now_ms: int) -> EndpointSignal:
    """The signal of a delivery that ended without success (``outcome``: failed | expired)."""
    return EndpointSignal(endpoint_id=endpoint_id, tenant_id=tenant_id, config_version=config_version,
                          signal=SIGNAL_EXHAUSTED, detail=outcome, at_ms=now_ms, event_type=cause_event_type,
                          delivery_id=delivery_id, event_id=event_id, http_status=http_status, attempts=attempts)
