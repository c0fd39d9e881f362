"""Model-based test of the pure endpoint driver: a hypothesis state
machine drives three :class:`EndpointDriver` instances (two tenants, one shared
:class:`FairScheduler`) the way :mod:`operators.dispatcher` does, against a simulated world:

* a fake Cassandra with the history store's write-timestamp rules (a final status is never
  replaced by ``pending``, ``succeeded`` beats ``failed``/``expired``; a completed attempt row
  beats a late reservation of the same number); a write lands only when its I/O succeeds, and a
  failed or crash-interrupted write may have landed statement by statement (unlogged batches);
* a fake receiver that counts every request when it leaves (with the attempt number it used);
* Flink: processing-time timers (checkpointed with keyed state), the adapter's one-timer memory,
  checkpoints, and crash + restore that re-feeds the inputs read after the last checkpoint, with
  ``check_created_before_ms`` set like the adapter sets it;
* I/O in flight that completes when a rule says so (any answer, or a storage failure), or while
  time passes: a request times out, Cassandra answers.

Invariants (checked after every rule, and in every pass):

1. slots conserved: the drivers' ``in_flight`` plus untaken grants equals the scheduler's count,
   per tenant and in total; ``in_flight`` equals the driver's requests in flight; an endpoint that
   cannot send holds no ticket and no grant;
2. no final status regresses in Cassandra, ``succeeded`` is never replaced;
3. every accepted delivery is final in Cassandra or held (driver or keyed state) with a timer or
   I/O in flight; a busy delivery has its I/O in flight; keyed state holds every delivery the
   driver holds (a crash cannot lose it);
4. every request has an attempt row that was durable *before* it left, with a number never used
   by an earlier request of that delivery (so rows >= requests);
5. wakes are reasons, not polls: never at or before ``now`` (except "more past their deadline"),
   and over a stretch of time an endpoint without I/O in flight is woken at most a few times per
   second; nor later than needed: an endpoint that may send has a timer by its next retry (or
   within a slot back-off when work is due now);
6. no automatic request for a delivery whose final outcome is durable (in particular none after a
   restore for what was final before the crash), nor before its durable next attempt time, nor
   through an open breaker, nor beyond the in-flight cap; a request never uses a config older than
   the delivery's, of another tenant, or of a disabled endpoint; a manual request only for the
   tenant and endpoint that own the delivery, and never again once its outcome was durable at the
   last checkpoint (unless Kafka delivered the request again after a restore);
7. memory holds the work due soonest: a fresh delivery waiting in the overflow queue with room in
   the fresh window, or a queued retry that is due, is never kept out of a full memory by a retry
   due later that could go to the retry queue; the retry queue's index matches its entries, each in
   its due-time bucket, and an endpoint with queued retries has a timer by the first bucket's start.

At the end (teardown) the world drains: I/O succeeds, time passes; every delivery must end final
in Cassandra, every valid manual request must have its own attempt row (sent or not_sent), and
the scheduler must be empty.

The deterministic tests below the machine are the issue's defects as seeds, then the defects
this machine found (each a regression test now).
Explore harder locally with e.g. ``max_examples=1000, stateful_step_count=100`` (about a minute).
"""

from __future__ import annotations

import copy
import os
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from core import breaker as brk
from core import ordering
from core.dispatch import FINAL_STATUSES, WAITING_STAGES, AttemptRecord, DurableRecord, Intent, SendReport, Stage
from core.endpoint_driver import (
    Check,
    Decision,
    DriverPolicy,
    EndpointDriver,
    IoKind,
    Load,
    Persist,
    Record,
    Reserve,
    Send,
)
from core.endpoint_store import InMemoryEndpointStore, decode_spilled
from core.fairness import FairScheduler
from core.fanout import NewDelivery
from core.outcomes import ErrorClass, HttpResult
from core.records import EndpointConfig, EndpointStatus, EventRecord, ReplayRequest, SigningKey
from core.retry import RetrySchedule

T0 = 1_700_000_000_000
ENDPOINTS = {"ep_a1": "ta", "ep_a2": "ta", "ep_b1": "tb"}
EPS = sorted(ENDPOINTS)
SCHEDULE = RetrySchedule(base_s=1.0, cap_s=8.0, max_attempts=4, deadline_s=60.0, max_retry_after_s=10.0,
                         min_delay_ms=500)
BREAKER = brk.BreakerConfig(failure_threshold=2, fast_failure_threshold=1, open_s=2.0, max_open_s=16.0)
SEND_TIMEOUT_MS = 10_000  # the HTTP client's total timeout: a request never hangs longer
STORAGE_LATENCY_MS = 3_000  # Cassandra answers by then unless a rule made it fail sooner
HARVEST_MS = 10  # the adapter's I/O poll (only used for the timers a checkpoint holds)
RESTORE_SKEW_MS = 1_000  # DispatchSettings.restore_check_skew_ms (default)
BAD_KEY = "does-not-decrypt"
# Wakes the driver may ask for at (or before) now; the adapter makes them now + 1: one more pass
# to start the work this one queued (expiries beyond one step's cap, CHECKs of restored
# deliveries that came due), never a loop (the rate bound below would catch one).
AT_ONCE = frozenset({"more deliveries past their deadline", "deadline", "restored deliveries due: read their records",
                     "more queued retries due"})
MAX_WAKES_PER_S = 5
NEXT_IN_LINE = "next in line for a tenant or pool slot"
WAKE_SLACK = 20  # back-off ramps (slot wait 10 ms -> 1 s), a few expiry passes




def make_policy(**changes: object) -> DriverPolicy:
    base = DriverPolicy(schedule=SCHEDULE, breaker=BREAKER, default_max_in_flight=2,
                        fresh_window_ms=30_000, manual_wait_ms=20_000, max_expiries_per_step=5,
                        hold_base_ms=1_000, hold_max_ms=8_000)
    return replace(base, **changes)  # type: ignore[arg-type]


# -- the fake Cassandra ------------------------------------------------------------------------------

BAND_US = 365 * 24 * 3600 * 1_000_000
_STATUS_BAND = {"pending": 0, "failed": 1, "expired": 1, "succeeded": 2}


@dataclass(frozen=True)
class StatusCell:
    ts: int
    status: str
    attempt_count: int
    next_attempt_at_ms: int | None
    auto_retry_active: bool


@dataclass(frozen=True)
class AttemptRow:
    ts: int
    attempt_id: str
    outcome: str  # reserved | succeeded | retry | failed | expired | not_sent
    sent: bool = False
    manual: bool = False
    request_id: str = ""


Statement = Callable[[], None]


class FakeCassandra:
    """The history store's tables as far as the dispatcher reads them, with last-write-wins by
    write timestamp exactly as operators.history_store chooses them."""

    def __init__(self) -> None:
        self.deliveries: dict[str, NewDelivery] = {}  # the creation row (INSERT)
        self.status: dict[str, StatusCell] = {}
        self.attempts: dict[str, dict[int, AttemptRow]] = {}
        self.violations: list[str] = []  # history rewritten by a write that should not have been made
        self.final_at: dict[str, int] = {}  # when each delivery's status first became final (ms)
        self.clock: Callable[[], int] = lambda: 0

    def _put_status(self, did: str, cell: StatusCell) -> None:
        cur = self.status.get(did)
        if cur is None or cell.ts > cur.ts:
            self.status[did] = cell
            if cell.status in FINAL_STATUSES:
                self.final_at.setdefault(did, self.clock())

    def _put_attempt(self, did: str, number: int, row: AttemptRow) -> None:
        rows = self.attempts.setdefault(did, {})
        cur = rows.get(number)
        if cur is None or row.ts > cur.ts:
            rows[number] = row

    def _insert(self, d: NewDelivery) -> None:
        self.deliveries[d.delivery_id] = d
        self._put_status(d.delivery_id, StatusCell(d.created_at_ms * 1000, "pending", 0, d.created_at_ms, True))

    def _reserve(self, did: str, intent: Intent, at_ms: int) -> None:
        self._put_attempt(did, intent.number, AttemptRow(at_ms * 1000, intent.attempt_id, "reserved"))

    # statements of each write (a batch is not atomic: each may land on its own)
    def persist(self, d: NewDelivery, intent: Intent) -> list[Statement]:
        return [lambda: self._insert(d), lambda: self._reserve(d.delivery_id, intent, d.created_at_ms)]

    def reserve(self, d: NewDelivery, intent: Intent, at_ms: int) -> list[Statement]:
        return [lambda: self._reserve(d.delivery_id, intent, at_ms)]

    def record(self, d: NewDelivery, r: AttemptRecord, attempt_count: int,
               next_intent: Intent | None) -> list[Statement]:
        did = d.delivery_id
        out: list[Statement] = []
        if r.intent is not None:
            row = AttemptRow(r.finished_at_ms * 1000 + BAND_US, r.intent.attempt_id, r.outcome, r.sent, r.manual,
                             r.request_id)
            number = r.intent.number
            out.append(lambda: self._put_attempt(did, number, row))
        if r.delivery_status is not None:
            cell = StatusCell(r.finished_at_ms * 1000 + _STATUS_BAND[r.delivery_status] * BAND_US,
                              r.delivery_status, attempt_count, r.next_attempt_at_ms, r.auto_retry_active)

            def status() -> None:
                cur = self.status.get(did)
                if cur is not None and cur.status in FINAL_STATUSES and not r.manual and cur != cell:  # (a retry: same)
                    self.violations.append(f"automatic {r.outcome} record for {did}, already {cur.status}"
                                           f" with {cur.attempt_count} attempts, written as {cell.status}"
                                           f" with {cell.attempt_count}")
                self._put_status(did, cell)
            out.append(status)
        if next_intent is not None:
            nxt, at = next_intent, r.finished_at_ms
            out.append(lambda: self._reserve(did, nxt, at))
        return out

    # reads
    def check(self, did: str) -> DurableRecord:
        rows = self.attempts.get(did, {})
        top = max(rows, default=0)
        cell = self.status.get(did)
        if cell is None:
            return DurableRecord(status=None, max_attempt_number=top)
        return DurableRecord(status=cell.status, attempt_count=cell.attempt_count,
                             next_attempt_at_ms=cell.next_attempt_at_ms,
                             auto_retry_active=cell.auto_retry_active and cell.status not in FINAL_STATUSES,
                             max_attempt_number=top)

    def load(self, did: str) -> tuple[NewDelivery, DurableRecord] | None:
        d = self.deliveries.get(did)
        if d is None:
            return None
        return d, self.check(did)

    def final(self, did: str) -> bool:
        cell = self.status.get(did)
        return cell is not None and cell.status in FINAL_STATUSES


# -- the simulated world and adapter --------------------------------------------------------------


@dataclass
class Io:
    seq: int
    ep: str
    kind: IoKind
    did: str
    started_ms: int
    writes: list[Statement] = field(default_factory=list)
    send: Send | None = None
    request_id: str = ""  # the manual request this send or record serves
    ordered_key: str = ""  # an automatic send's ordering key, when its endpoint was ordered

    @property
    def timeout_at(self) -> int:
        return self.started_ms + (SEND_TIMEOUT_MS if self.kind == "send" else STORAGE_LATENCY_MS)


@dataclass
class ReplayInfo:
    request: ReplayRequest
    valid: bool  # the delivery exists, and the request names its tenant and endpoint
    outcome: str = ""  # what the driver said the first time (queued/loading/refused/duplicate)

    @property
    def delivery_id(self) -> str:
        return self.request.delivery_id


class Sim:
    """The Flink adapter (operators.dispatcher) and everything around it, in memory."""

    def __init__(self, seed: int = 0, pool: int = 4, quota: int = 2, write_budget: int = 6,
                 policy: DriverPolicy | None = None, rate_bound: bool = True) -> None:
        self.now = T0
        self.seed = seed
        self.rng = random.Random(seed)  # the adapter's one random source, shared by its drivers
        self.pool, self.quota, self.write_budget = pool, quota, write_budget
        self.base_policy = policy or make_policy()
        self.policy = self.base_policy
        self.rate_bound = rate_bound
        self.db = FakeCassandra()
        self.db.clock = lambda: self.now
        self.raise_after: int | None = None  # the next pass's start raises after this many actions
        self.drain_started: int | None = None
        # the receiver: attempt numbers of the requests it saw, per delivery, and whether manual
        self.requests: dict[str, list[int]] = {}
        self.manual_requests: Counter[str] = Counter()
        self.auto_after_restore: Counter[str] = Counter()
        # Flink: keyed state, timers, the adapter's memory
        self.stores: dict[str, InMemoryEndpointStore] = {ep: InMemoryEndpointStore() for ep in EPS}
        self.timers: dict[str, dict[int, str]] = {ep: {} for ep in EPS}
        self.wakes: dict[str, int] = {}
        self.drivers: dict[str, EndpointDriver] = {}
        self.scheduler = FairScheduler(pool_size=pool, tenant_quota=quota)
        self.counts: Counter[str] = Counter()
        self.io: list[Io] = []
        self._io_seq = 0
        # checkpoints: keyed state + timers; inputs read since (Kafka offsets are in it too)
        self.ckpt: tuple[dict[str, InMemoryEndpointStore], dict[str, dict[int, str]]] = (
            copy.deepcopy(self.stores), copy.deepcopy(self.timers))
        self.inputs_since_ckpt: list[tuple[str, str, object]] = []
        self.crashes = 0
        # the control plane and fan-out
        self.published: dict[str, EndpointConfig] = {}
        self.lagging: dict[str, list[EndpointConfig]] = {ep: [] for ep in EPS}
        self.accepted: dict[str, NewDelivery] = {}
        self.replays: dict[str, ReplayInfo] = {}
        self.final_before_crash: set[str] = set()
        self.manual_acked: set[str] = set()  # manual requests whose record the driver saw durable
        self.manual_done_at_ckpt: set[str] = set()  # ... by the last checkpoint
        self.may_resend: set[str] = set()  # manual requests Kafka delivered again after a restore
        self.ever_final: set[str] = set()
        self.max_count: dict[str, int] = {}
        self.ever_succeeded: set[str] = set()
        self.signals: list[str] = []
        self._n = 0

    # -- world inputs ------------------------------------------------------------------------------
    def publish(self, ep: str, deliver: bool = True, **changes: object) -> EndpointConfig:
        cur = self.published.get(ep)
        if cur is None:
            cfg = EndpointConfig(endpoint_id=ep, tenant_id=ENDPOINTS[ep], config_version=1, url=f"https://{ep}/v1",
                                 status=EndpointStatus.ACTIVE, event_types=("*",),
                                 signing_keys=(SigningKey(1, "ok"),), published_at_ms=self.now)
            cfg = replace(cfg, **changes)  # type: ignore[arg-type]
        else:
            cfg = replace(cur, config_version=cur.config_version + 1, published_at_ms=self.now,
                          **changes)  # type: ignore[arg-type]
        self.published[ep] = cfg
        self.lagging[ep].append(cfg)
        if deliver:
            self.deliver_configs(ep)
        return cfg

    def deliver_configs(self, ep: str, n: int | None = None) -> None:
        queue = self.lagging[ep]
        take, self.lagging[ep] = (queue, []) if n is None else (queue[:n], queue[n:])
        for cfg in take:
            self.input(ep, "config", cfg)

    def new_delivery(self, ep: str, age_ms: int = 0) -> NewDelivery | None:
        """Fan-out: only to an endpoint whose published config is active."""
        cfg = self.published.get(ep)
        if cfg is None or cfg.status is not EndpointStatus.ACTIVE:
            return None
        self._n += 1
        created = self.now - age_ms
        # Three objects, each version newer than the last (ordering keys).
        ev = EventRecord(event_id=f"evt_{self._n}", tenant_id=cfg.tenant_id, event_type="invoice.paid",
                         schema_version="2026-01-01", object_id=f"obj_{self._n % 3}", object_version=self._n,
                         occurred_at_ms=created, payload=b"{}")
        d = NewDelivery(delivery_id=f"dlv_{self._n}_{ep}", event=ev, endpoint_id=ep, tenant_id=cfg.tenant_id,
                        endpoint_config_version=cfg.config_version, created_at_ms=created,
                        expires_at_ms=created + int(SCHEDULE.deadline_s * 1000),
                        ordering_key=ordering.key_for(cfg.ordering_key, ev.object_id, ev.payload))
        self.accepted[d.delivery_id] = d
        self.input(ep, "delivery", d)
        return d

    def recreate(self, d: NewDelivery) -> None:
        """The same delivery again, from a topic re-read after fan-out's dedupe TTL."""
        self.input(d.endpoint_id, "delivery", d)

    def replay(self, did: str, *, tenant: str | None = None, endpoint: str | None = None) -> str:
        d = self.accepted.get(did)
        owner_ep = d.endpoint_id if d else EPS[0]
        owner_tenant = d.tenant_id if d else ENDPOINTS[owner_ep]
        ep = endpoint or owner_ep
        tenant = tenant or owner_tenant
        self._n += 1
        rid = f"req_{self._n}"
        r = ReplayRequest(delivery_id=did, tenant_id=tenant, endpoint_id=ep, requested_by="alice",
                          requested_at_ms=self.now, request_id=rid)
        self.replays[rid] = ReplayInfo(r, d is not None and ep == owner_ep and tenant == owner_tenant)
        self.input(ep, "replay", r)
        return rid

    def repeat_replay(self, rid: str) -> None:
        """The same request again (a retried API call, a re-published record)."""
        r = self.replays[rid].request
        self.input(r.endpoint_id, "replay", r)

    # -- the adapter -------------------------------------------------------------------------------
    def input(self, ep: str, kind: str, item: object, refeed: bool = False) -> None:
        if not refeed:
            self.inputs_since_ckpt.append((ep, kind, item))
        drv = self.driver(ep)
        if kind == "delivery":
            assert isinstance(item, NewDelivery)
            if item.delivery_id not in drv.items:
                drv.add_new(item, self.now)
        elif kind == "replay":
            assert isinstance(item, ReplayRequest)
            outcome = drv.add_replay(item, self.now)
            info = self.replays.get(item.request_id)
            if info is not None and not info.outcome:
                info.outcome = outcome
        else:
            assert isinstance(item, EndpointConfig)
            drv.set_config(item)
        self.pass_(ep)

    def driver(self, ep: str) -> EndpointDriver:
        drv = self.drivers.get(ep)
        if drv is None:
            drv = EndpointDriver(ep, self.policy, self.rng, self.stores[ep], self.scheduler, self.counts)
            self.drivers[ep] = drv
        return drv

    def storage_in_flight(self) -> int:
        return sum(1 for io in self.io if io.kind != "send")

    def io_busy(self, ep: str) -> bool:
        return any(io.ep == ep for io in self.io)

    def pass_(self, ep: str) -> Decision:
        drv = self.driver(ep)
        dec = drv.step(self.now, self.write_budget - self.storage_in_flight())
        self.signals += [s.signal for s in dec.signals]
        self.start(ep, drv, dec)
        if dec.wake is not None:
            # "no wake earlier than needed": a wake is a reason in the future, never a poll of now
            # (with more past their deadline than one step expires, the wake names the earliest
            # deadline, which is in the past: the adapter makes it now + 1, as meant)
            assert dec.wake.at_ms > self.now or dec.wake.reason in AT_ONCE, (
                f"{ep} asked to be woken at {dec.wake.at_ms - self.now} ms from now: {dec.wake.reason}")
            wake, reason = dec.wake.at_ms, dec.wake.reason
            self.schedule(ep, wake, reason)
        if drv.held_until_ms > self.now:  # held by send_not_started, after the step chose its wake
            self.schedule(ep, drv.held_until_ms, "hold after internal error ends")
        if drv.idle and not self.io_busy(ep):
            del self.drivers[ep]
        return dec

    def schedule(self, ep: str, wake: int, reason: str) -> None:
        wake = max(wake, self.now + 1)
        current = self.wakes.get(ep)
        if current is not None and self.now < current <= wake:
            return
        self.timers[ep].setdefault(wake, reason)
        self.wakes[ep] = wake

    def start(self, ep: str, drv: EndpointDriver, dec: Decision) -> None:
        k = self.raise_after
        if k is None or k >= len(dec.actions):
            self._start_actions(ep, drv, dec.actions)
            return
        # The adapter's _start raises at action k (operators.dispatcher._not_started, _contain):
        # storage I/O started before it stays in flight; requests were only collected, to be
        # submitted together, so every request of the pass is handed back unsent, and what
        # follows k fails like a write; then the endpoint is held once.
        self.raise_after = None
        self.counts["model_start_raised"] += 1
        self._start_actions(ep, drv, [a for a in dec.actions[:k] if not isinstance(a, Send)])
        exc = RuntimeError("adapter bug")
        kinds: dict[type, IoKind] = {Check: "check", Persist: "persist", Reserve: "reserve", Record: "record"}
        for a in [a for a in dec.actions[:k] if isinstance(a, Send)] + list(dec.actions[k:]):
            if isinstance(a, Send):
                drv.send_not_started(a.p.delivery_id, "not started: RuntimeError", self.now, hold=False)
            elif isinstance(a, Load):
                drv.io_done("load", a.delivery_id, None, exc, self.now)
            else:
                drv.io_done(kinds[type(a)], a.p.delivery_id, None, exc, self.now)
        drv.hold(self.now, "internal error: RuntimeError")

    def _start_actions(self, ep: str, drv: EndpointDriver, actions: list[object]) -> None:
        for a in actions:
            self._io_seq += 1
            if isinstance(a, Send):
                if any(k.ciphertext_b64 == BAD_KEY for k in a.config.signing_keys):
                    drv.send_not_started(a.p.delivery_id, "no signing key decrypts", self.now)
                    continue
                self.request_leaves(ep, drv, a)
                rid = a.p.sending_manual.request_id if a.p.sending_manual else ""
                key = a.p.delivery.ordering_key if a.config.ordering_key and not a.p.sending_manual else ""
                self.add_io(Io(self._io_seq, ep, "send", a.p.delivery_id, self.now, send=a, request_id=rid,
                               ordered_key=key))
            elif isinstance(a, Persist):
                assert a.p.intent is not None
                self.add_io(Io(self._io_seq, ep, "persist", a.p.delivery_id, self.now,
                               self.db.persist(a.p.delivery, a.p.intent)))
            elif isinstance(a, Reserve):
                assert a.p.intent is not None
                self.add_io(Io(self._io_seq, ep, "reserve", a.p.delivery_id, self.now,
                               self.db.reserve(a.p.delivery, a.p.intent, self.now)))
            elif isinstance(a, Record):
                assert a.p.record is not None
                self.add_io(Io(self._io_seq, ep, "record", a.p.delivery_id, self.now,
                               self.db.record(a.p.delivery, a.p.record, a.p.attempt_count, a.p.intent),
                               request_id=a.p.record.request_id))
            elif isinstance(a, Check):
                self.add_io(Io(self._io_seq, ep, "check", a.p.delivery_id, self.now))
            else:
                assert isinstance(a, Load)
                self.add_io(Io(self._io_seq, ep, "load", a.delivery_id, self.now))

    def add_io(self, io: Io) -> None:
        # The adapter's IoTracker keys I/O by (endpoint, kind, delivery): a second one would
        # replace the first and its completion would never reach the driver.
        assert not any((o.ep, o.kind, o.did) == (io.ep, io.kind, io.did) for o in self.io), (
            f"two {io.kind} of {io.did} in flight")
        self.io.append(io)

    def request_leaves(self, ep: str, drv: EndpointDriver, a: Send) -> None:
        """The receiver sees the request now. Everything that must be true before it left."""
        p, cfg, did = a.p, a.config, a.p.delivery_id
        assert p.intent is not None, f"request for {did} without an intent"
        row = self.db.attempts.get(did, {}).get(p.intent.number)
        assert row is not None, f"request {did}#{p.intent.number} left before its attempt row was durable"
        assert row.attempt_id == p.intent.attempt_id and row.outcome == "reserved", (
            f"request {did}#{p.intent.number} reuses an attempt row already used: {row}")
        seen = self.requests.setdefault(did, [])
        assert p.intent.number not in seen, f"attempt number {p.intent.number} of {did} used twice"
        seen.append(p.intent.number)
        # what it was sent with
        assert p.delivery.endpoint_id == ep and cfg.endpoint_id == ep
        assert cfg.tenant_id == p.delivery.tenant_id, f"{did} of {p.delivery.tenant_id} sent to {cfg.tenant_id}"
        assert cfg.status is EndpointStatus.ACTIVE, f"{did} sent to a {cfg.status} endpoint"
        assert cfg.config_version >= p.delivery.endpoint_config_version, (
            f"{did} (fanned out with config v{p.delivery.endpoint_config_version}) sent with v{cfg.config_version}")
        if p.sending_manual is not None:
            self.manual_requests[did] += 1
            info = self.replays.get(p.sending_manual.request_id)
            assert info is not None and info.valid and info.delivery_id == did, (
                f"manual request {p.sending_manual} sent {did}, which it may not")
            # Not sent again once the driver saw its record durable before the checkpoint, unless
            # Kafka delivered the request again after a restore (keyed state dedupes request ids,
            # Cassandra does not).
            rid = p.sending_manual.request_id
            assert rid not in self.manual_done_at_ckpt or rid in self.may_resend, (
                f"manual request {rid} sent again, its record durable (and seen) before the checkpoint")
        else:
            assert not self.db.final(did), (
                f"automatic request for {did}, final in Cassandra as {self.db.status[did].status}"
                + (" before the crash" if did in self.final_before_crash else ""))
            cell = self.db.status[did]
            assert cell.next_attempt_at_ms is None or cell.next_attempt_at_ms <= self.now, (
                f"automatic request for {did} {cell.next_attempt_at_ms - self.now} ms before its durable next attempt")
            b = drv.breaker
            assert b.state is not brk.CircuitState.OPEN, f"automatic request for {did} through an open breaker"
            if self.crashes:
                self.auto_after_restore[did] += 1
            key = p.delivery.ordering_key
            if cfg.ordering_key and key:
                # One active delivery per ordering key.
                others = [io.did for io in self.io if io.ep == ep and io.kind == "send" and io.ordered_key == key]
                assert not others, f"automatic request for {did} while {others} of key {key} is in flight"
        cap = cfg.max_in_flight or self.policy.default_max_in_flight
        assert drv.in_flight <= cap, f"{ep}: {drv.in_flight} requests in flight, cap {cap}"

    def finish(self, io: Io, *, ok: bool = True, report: HttpResult | None = None,
               exc: BaseException | None = None, land: Callable[[], bool] | None = None) -> None:
        """I/O ``io`` completes now; the adapter harvests it in a pass of its endpoint."""
        self.io.remove(io)
        result: object = None
        error: BaseException | None = None
        if io.kind == "send":
            assert io.send is not None
            if exc is not None:
                error = exc
            else:
                assert report is not None
                result = SendReport(result=report, started_at_ms=io.started_ms, finished_at_ms=self.now,
                                    url=io.send.config.url, endpoint_config_version=io.send.config.config_version)
        elif ok:
            for w in io.writes:
                w()
            if io.kind == "check":
                result = self.db.check(io.did)
            elif io.kind == "load":
                result = self.db.load(io.did)
        else:
            error = TimeoutError("Cassandra timed out")
            for w in io.writes:  # a timed-out write may still have landed, statement by statement
                if land is not None and land():
                    w()
        drv = self.drivers[io.ep]
        if io.kind == "record" and error is None and io.request_id:
            self.manual_acked.add(io.request_id)
        queued_before = drv.spilled
        drv.io_done(io.kind, io.did, result, error, self.now)
        if (io.kind == "persist" and error is None and queued_before and io.did in drv.items
                and io.did not in drv._superseded):
            p = drv.items[io.did]
            # a fresh delivery behind a queue goes to the back of it, not into memory
            assert p.stage is not Stage.READY or p.manual or p.attempt_count, (
                f"{io.did} stayed in memory behind a queue of {queued_before}")
        self.pass_(io.ep)

    def time_out(self, io: Io) -> None:
        """I/O no rule completed: a request times out, Cassandra answers (failures are rules')."""
        if io.kind == "send":
            self.finish(io, report=HttpResult(status=None, error=ErrorClass.TIMEOUT, detail="total timeout"))
        else:
            self.finish(io)

    # -- time --------------------------------------------------------------------------------------
    def on_timer(self, ep: str, ts: int) -> None:
        if self.wakes.get(ep) == ts:
            del self.wakes[ep]
        self.pass_(ep)

    def count_passes(self) -> Counter[str]:
        """Timer-driven passes per endpoint from now on."""
        passes = Counter[str]()
        real = self.on_timer

        def counting(ep: str, ts: int) -> None:
            passes[ep] += 1
            real(ep, ts)

        self.on_timer = counting  # type: ignore[method-assign]
        return passes

    def advance(self, delta_ms: int) -> None:
        """Processing time moves on: timers fire and I/O times out, in time order."""
        target = self.now + delta_ms
        counted: dict[str, Counter[str]] = {}
        steps = 0
        while True:
            nxt_timer = min(((ts, ep) for ep, ts_map in self.timers.items() for ts in ts_map), default=None)
            nxt_io = min(self.io, key=lambda o: (o.timeout_at, o.seq), default=None)
            t_timer = nxt_timer[0] if nxt_timer else None
            t_io = nxt_io.timeout_at if nxt_io else None
            if (t_timer is None or t_timer > target) and (t_io is None or t_io > target):
                break
            steps += 1
            assert steps < 20_000, f"runaway: {steps} events within {delta_ms} ms"
            if t_io is not None and (t_timer is None or t_io < t_timer):
                assert nxt_io is not None
                self.now = max(self.now, t_io)
                self.time_out(nxt_io)
                continue
            assert nxt_timer is not None
            ts, ep = nxt_timer
            self.now = max(self.now, ts)
            reason = self.timers[ep].pop(ts)
            # A key next in line for a slot asks every pickup interval (core.fairness: a grant
            # to a sleeping key would sit idle); that is its reason, not a poll.
            if not self.io_busy(ep) and reason != NEXT_IN_LINE:
                counted.setdefault(ep, Counter())[reason] += 1
            self.on_timer(ep, ts)
        self.now = target
        if self.rate_bound:
            bound = MAX_WAKES_PER_S * delta_ms // 1000 + WAKE_SLACK
            for ep, reasons in counted.items():
                n = sum(reasons.values())
                assert n <= bound, (f"{ep} woken {n} times in {delta_ms} ms without I/O in flight (bound {bound}):"
                                    f" {dict(reasons)}")

    def fire_next_timer(self) -> None:
        nxt = min((ts for ts_map in self.timers.values() for ts in ts_map), default=None)
        if nxt is not None:
            self.advance(nxt - self.now)

    # -- checkpoints and crashes -------------------------------------------------------------------
    def checkpoint(self) -> None:
        timers = copy.deepcopy(self.timers)
        for io in self.io:  # the adapter's I/O poll timer is checkpointed with the others
            timers[io.ep].setdefault(self.now + HARVEST_MS, "io poll")
        self.ckpt = (copy.deepcopy(self.stores), timers)
        self.inputs_since_ckpt = []
        self.manual_done_at_ckpt = set(self.manual_acked)

    def crash_and_restore(self, land: Callable[[], bool], downtime_ms: int = 0) -> None:
        for io in self.io:  # writes in flight may or may not have landed, statement by statement
            for w in io.writes:
                if land():
                    w()
        self.final_before_crash |= {did for did in self.accepted if self.db.final(did)}
        # The restored state is the checkpoint's: a manual request it still owes may be sent
        # again even if its record landed after that checkpoint (the duplicate has its own row).
        self.manual_acked = set(self.manual_done_at_ckpt)
        self.crashes += 1
        self.io = []
        self.drivers = {}
        self.wakes = {}
        self.scheduler = FairScheduler(pool_size=self.pool, tenant_quota=self.quota)
        self.rng = random.Random(self.seed + self.crashes)
        self.now += downtime_ms
        stores, timers = self.ckpt
        self.stores, self.timers = copy.deepcopy(stores), copy.deepcopy(timers)
        self.policy = replace(self.base_policy, check_created_before_ms=self.now + RESTORE_SKEW_MS)
        for ep, kind, item in self.inputs_since_ckpt:  # Kafka re-reads from the checkpoint's offsets
            if isinstance(item, ReplayRequest):
                self.may_resend.add(item.request_id)
            self.input(ep, kind, item, refeed=True)
        self.advance(0)  # timers that came due while the job was down fire at once

    # -- the end -----------------------------------------------------------------------------------
    def settled(self) -> bool:
        return (not self.io and all(self.db.final(did) for did in self.accepted)
                and not any(s.pending or s.replay_requests or s.spilled or s.retry_queue for s in self.stores.values()))

    def drain(self, max_rounds: int = 120) -> None:
        """Receivers recover, Cassandra answers, time passes: everything must end."""
        self.drain_started = self.now
        for _ in range(max_rounds):
            while self.io:
                io = min(self.io, key=lambda o: o.seq)
                if io.kind == "send":
                    self.finish(io, report=HttpResult(status=200))
                else:
                    self.finish(io)
                check_all(self)
            if self.settled():
                return
            self.advance(5_000)
            check_all(self)

    def stuck(self) -> list[str]:
        out = []
        for did, d in self.accepted.items():
            if not self.db.final(did):
                drv = self.drivers.get(d.endpoint_id)
                p = drv.items.get(did) if drv else None
                out.append(f"{did}: {self.db.status.get(did)} held as {p and (p.stage, p.busy, p.manual)}"
                           f" blocked={drv and blocked_by(drv, self.now)} timers={self.timers[d.endpoint_id]}")
        return out


# -- invariants ---------------------------------------------------------------------------------------



def blocked_by(drv: EndpointDriver, now: int) -> str | None:
    """EndpointDriver._blocked without its side effects."""
    cfg = drv.config
    if cfg is None:
        return "no config"
    if cfg.status is not EndpointStatus.ACTIVE:
        return str(cfg.status)
    if drv.gone_at is not None and cfg.config_version <= drv.gone_at:
        return "gone"
    if cfg.config_version < drv.needs_version:
        return "config older"
    if drv.held_until_ms > now:
        return "held"
    return None


def check_all(sim: Sim) -> None:
    check_slots(sim)
    check_timely(sim)
    check_memory_holds_what_is_due_soonest(sim)
    check_status_monotonic(sim)
    check_nothing_lost(sim)
    check_rows_cover_requests(sim)


def check_slots(sim: Sim) -> None:
    sched = sim.scheduler
    grants: Counter[str] = Counter()
    for key, (tenant, slots) in sched._grants.items():
        assert key in sim.drivers, f"untaken grant of {slots} for {key}, which has no driver"
        grants[tenant] += slots
    holding: Counter[str] = Counter()
    for ep, drv in sim.drivers.items():
        sends = sum(1 for io in sim.io if io.ep == ep and io.kind == "send")
        assert drv.in_flight == sends, f"{ep}: in_flight {drv.in_flight} but {sends} requests in flight"
        holding[ENDPOINTS[ep]] += drv.in_flight
        why = blocked_by(drv, sim.now)
        b = drv.breaker
        if why in (None, "held") and b.state is brk.CircuitState.OPEN and sim.now < (b.open_until_ms or 0) \
                and not drv._manual:
            why = "breaker open"
        if why not in (None, "held"):
            tickets = [k for k, w in sched._waiting.items() if ep in w._entries]
            assert not tickets and ep not in sched._grants, (
                f"{ep} cannot send ({why}) but holds tickets {tickets} / grant {sched._grants.get(ep)}")
    for tenant in set(ENDPOINTS.values()):
        assert holding[tenant] + grants[tenant] == sched.in_flight(tenant), (
            f"{tenant}: drivers hold {holding[tenant]}, untaken grants {grants[tenant]},"
            f" scheduler counts {sched.in_flight(tenant)}")
        assert sched.in_flight(tenant) <= sim.quota
    assert sum(holding.values()) + sum(grants.values()) == sched.in_flight_total() <= sim.pool
    for waiting in sched._waiting.values():
        for key in waiting._entries:
            assert key in sim.drivers, f"ticket for {key}, which has no driver"
    # No slot granted and idle for longer than the pickup interval while anyone waits
    # for one (the keys next in line ask every interval, and their grant call hands it on).
    if sched.waiting_count():
        for key, at in sched._granted_at.items():
            assert sim.now - at <= 2 * sched.grant_pickup_ms, (
                f"a slot granted to {key} {sim.now - at} ms ago is idle while {sched.waiting_count()} wait")


def check_timely(sim: Sim) -> None:
    """No wake later than needed: an endpoint that may send and has room is woken by the time its
    next retry is due, or within a slot / token back-off (<= 1 s here) when work is due now."""
    for ep, drv in sim.drivers.items():
        assert drv.config is not None or blocked_by(drv, sim.now) is not None
        queued_due = min(drv._rq, default=None)  # the retry queue's next bucket, whatever the endpoint's state
        if queued_due is not None and queued_due > sim.now:
            first = min(sim.timers[ep], default=None)
            assert first is not None and first <= queued_due, (
                f"{ep} has queued retries due in {queued_due - sim.now} ms but its first timer is "
                f"{'none' if first is None else first - sim.now} ms away")
        if blocked_by(drv, sim.now) is not None or drv.breaker.state is not brk.CircuitState.CLOSED:
            continue
        assert drv.config is not None
        if drv.in_flight >= (drv.config.max_in_flight or sim.policy.default_max_in_flight):
            continue  # a finished request drives it
        ready = [p for p in drv.items.values() if p.stage in WAITING_STAGES and not p.busy]
        if drv._readying:
            continue  # restored work is being read: due work waits for those reads, which drive it
        times = [p.next_attempt_at_ms for p in ready if p.auto_retry_active and not p.manual
                 and drv._may_send_auto(p.delivery_id)]  # the rest wait for their key's head
        if any(p.manual for p in ready):
            times.append(sim.now)
        if not times:
            continue
        due = min(times)
        limit = due if due > sim.now else sim.now + sim.policy.slot_wait_max_ms
        first = min(sim.timers[ep], default=None)
        assert first is not None and first <= limit, (
            f"{ep} has work due in {due - sim.now} ms but its first timer is "
            f"{'none' if first is None else first - sim.now} ms away")


def check_memory_holds_what_is_due_soonest(sim: Sim) -> None:
    """A fresh delivery waiting in the overflow queue while the fresh window has room for it, or a
    queued retry that is due, is never kept out of a full memory by a retry due later (more than a
    retry bucket from now) that could go to the retry queue instead. So on an endpoint that
    accepts fresh work, retries refused for a day cannot delay it, however many there are."""
    for ep, drv in sim.drivers.items():
        policy = drv.policy
        window = policy.memory_window
        page = max(1, window // 2)
        need = 0
        if drv.spilled and window - len(drv._fresh) >= min(policy.page_size, page, drv.spilled):
            need = min(policy.page_size, page, drv.spilled)
        if any(b <= sim.now for b in drv._rq):
            need = max(need, 1)
        if not need or 2 * window - len(drv.items) >= need:
            continue
        later = sorted(did for did, p in drv.items.items()
                       if drv._may_queue(p) and p.next_attempt_at_ms > sim.now + policy.retry_bucket_ms)
        assert not later, (f"{ep}: memory full ({len(drv.items)} of {2 * window}) with work waiting for it"
                           f" (overflow {drv.spilled}, due queued buckets {[b for b in drv._rq if b <= sim.now]}),"
                           f" and it holds retries due later: {later}")


def check_status_monotonic(sim: Sim) -> None:
    """Final stays final, succeeded stays succeeded, the attempt count never goes back, and no
    automatic record is written for a delivery already final in Cassandra (it would rewrite its
    status and count: the driver did not read its durable record first)."""
    assert not sim.db.violations, sim.db.violations[0]
    for did, cell in sim.db.status.items():
        assert cell.attempt_count >= sim.max_count.get(did, 0), (
            f"{did}: attempt count back from {sim.max_count[did]} to {cell.attempt_count}")
        sim.max_count[did] = cell.attempt_count
        if cell.status in FINAL_STATUSES:
            sim.ever_final.add(did)
        if cell.status == "succeeded":
            sim.ever_succeeded.add(did)
    for did in sim.ever_final:
        assert sim.db.final(did), f"{did} was final, now {sim.db.status[did].status}"
    for did in sim.ever_succeeded:
        assert sim.db.status[did].status == "succeeded", f"{did} succeeded, now {sim.db.status[did].status}"


def check_nothing_lost(sim: Sim) -> None:
    for ts_map in sim.timers.values():
        assert all(ts > sim.now for ts in ts_map), "a due timer did not fire"
    in_flight = {(io.ep, io.kind, io.did) for io in sim.io}
    for ep, drv in sim.drivers.items():
        assert set(drv.items) == set(sim.stores[ep].pending), (
            f"{ep}: driver holds {sorted(set(drv.items) - set(sim.stores[ep].pending))} that keyed state"
            f" does not; keyed state holds {sorted(set(sim.stores[ep].pending) - set(drv.items))} it does not")
        for did, p in drv.items.items():
            kind = {Stage.CHECK: "check", Stage.PERSIST: "persist", Stage.RESERVE: "reserve", Stage.SENDING: "send",
                    Stage.RECORDING: "record"}.get(p.stage)
            if p.busy:
                assert (ep, kind, did) in in_flight, f"{did} is busy in {p.stage} with no I/O in flight"
        for did in drv._loading:
            assert (ep, "load", did) in in_flight, f"{did} loading with no load in flight"
        assert drv.spilled == len(sim.stores[ep].spilled), "the overflow queue's range and entries disagree"
        index = sim.stores[ep].retry_bucket_index
        assert drv.queued_retries == len(sim.stores[ep].retry_queue) == sum(t[2] - t[0] for t in index.values()), (
            "the retry queue's index and entries disagree")
        assert {b: e.stored() for b, e in drv._rq.items()} == index, "retry queue index: memory and keyed state differ"
        for (bucket, seq), t in sim.stores[ep].retry_queue.items():
            assert index[bucket][0] <= seq < index[bucket][2], f"queued retry {t[0]} outside its bucket's range"
            assert bucket <= decode_spilled(t, ep)[0].next_attempt_at_ms < bucket + drv.policy.retry_bucket_ms
        # a queued copy that comes back sendable (queued by this incarnation, not superseded) is
        # the only copy: two would both be sent
        sendable_queued = {t[0] for seq, t in sim.stores[ep].spilled.items()
                           if seq >= drv._own_from and len(t) > 2 and t[0] not in drv._superseded}
        sendable_queued |= {t[0] for (bucket, seq), t in sim.stores[ep].retry_queue.items()
                            if seq >= drv._rq_own_from.get(bucket, 0) and len(t) > 2 and t[0] not in drv._superseded}
        assert not sendable_queued & set(drv.items), "a delivery both in memory and queued to come back sendable"
    for ep in EPS:
        live = sim.drivers.get(ep)
        if (live is not None and (live.items or live._loads)) or sim.stores[ep].pending \
                or sim.stores[ep].replay_requests or sim.stores[ep].spilled or sim.stores[ep].retry_queue:
            assert sim.timers[ep] or sim.io_busy(ep), f"{ep} holds work with no timer and no I/O in flight"
    for did, d in sim.accepted.items():
        if sim.db.final(did):
            continue
        owner = sim.drivers.get(d.endpoint_id)
        store = sim.stores[d.endpoint_id]
        held = ((did in owner.items if owner is not None else did in store.pending) or did in store.spilled_ids()
                or did in store.queued_retry_ids())
        assert held, f"{did} is neither final in Cassandra nor held: {sim.db.status.get(did)}"


def check_rows_cover_requests(sim: Sim) -> None:
    for did, numbers in sim.requests.items():
        rows = sim.db.attempts.get(did, {})
        assert len(rows) >= len(numbers) and set(numbers) <= set(rows), (
            f"{did}: requests {numbers}, attempt rows {sorted(rows)}")


# Once the world is well (the drain: receivers answer, Cassandra takes every write), how long past
# its deadline -- or past the drain's start, for one already late -- a delivery may take to be
# final: a write that failed just before retries after up to 60 s (core.dispatch back-off), a
# manual request owed on it waits up to manual_wait (20 s here) and is what it waits for, a
# hold (8 s) or an open breaker (16 s) is sat out, and a pass runs at each 5 s drain round.
FINAL_SLACK_MS = 60_000 + 20_000 + 16_000 + 3 * 5_000


def check_final_by_deadline(sim: Sim) -> None:
    """Every delivery -- in memory or in the overflow queue -- is final by its deadline (or,
    late already when the world became well, soon after), within FINAL_SLACK_MS."""
    assert sim.drain_started is not None
    for did, d in sim.accepted.items():
        due = max(d.expires_at_ms, sim.drain_started) + FINAL_SLACK_MS
        at = sim.db.final_at.get(did)
        assert at is not None and at <= due, (
            f"{did} final {'never' if at is None else f'{(at - d.expires_at_ms) // 1000} s after its deadline'}"
            f" (world well {(sim.drain_started - d.expires_at_ms) // 1000} s after it)")


def check_drained(sim: Sim) -> None:
    assert sim.settled(), "did not settle:\n" + "\n".join(sim.stuck())
    assert sim.scheduler.in_flight_total() == 0 and sim.scheduler.waiting_count() == 0
    assert not sim.scheduler._grants
    rows_by_request = {row.request_id for rows in sim.db.attempts.values() for row in rows.values()
                       if row.request_id}
    for rid, info in sim.replays.items():
        if info.valid and info.outcome in ("queued", "loading"):
            assert rid in rows_by_request, (
                f"manual request {rid} for {info.delivery_id} ({info.outcome}) ended without an attempt row")


# -- the state machine --------------------------------------------------------------------------------

RESULTS = {
    "200": HttpResult(status=200),
    "500": HttpResult(status=500),
    "503": HttpResult(status=503, retry_after="3"),
    "429": HttpResult(status=429, retry_after="120"),
    "410": HttpResult(status=410),
    "400": HttpResult(status=400),
    "timeout": HttpResult(status=None, error=ErrorClass.TIMEOUT),
    "connect": HttpResult(status=None, error=ErrorClass.CONNECT),
    "dns": HttpResult(status=None, error=ErrorClass.DNS),
}
CONFIG_CHANGES = ("disable", "enable", "delete", "url", "rate_limit", "no_rate_limit", "max_in_flight",
                  "bad_key", "good_key", "ordered", "ordered", "unordered")


class DriverMachine(RuleBasedStateMachine):
    sim: Sim

    @initialize(seed=st.integers(0, 2**16), lag=st.sampled_from(EPS + [""]), pool=st.sampled_from([2, 4]),
                quota=st.sampled_from([1, 2, 2]), patient=st.sampled_from([False, False, True]))
    def init(self, seed: int, lag: str, pool: int, quota: int, patient: bool = False) -> None:
        # A tiny memory window: the overflow queue is in play in every run. A patient breaker
        # (some runs) stays closed through refusals: memory fills with retries while the receiver
        # is sent fresh work, which is when the retry queue is in play.
        window = int(os.environ.get("MODEL_WINDOW", "3"))  # explore without the queues: a large one
        policy = make_policy(memory_window=window, page_size=2, retry_bucket_ms=250)
        if patient:
            policy = replace(policy, breaker=replace(BREAKER, failure_threshold=10**6, fast_failure_threshold=10**6))
        self.sim = Sim(seed=seed, pool=pool, quota=quota, policy=policy)
        for ep in EPS:
            self.sim.publish(ep, deliver=ep != lag)

    @rule(ep=st.sampled_from(EPS), age=st.sampled_from([0, 200, 2_000, 40_000]), n=st.integers(1, 4))
    def new_deliveries(self, ep: str, age: int, n: int) -> None:
        for _ in range(n):
            self.sim.new_delivery(ep, age)

    @rule(ep=st.sampled_from(EPS), n=st.integers(4, 10))
    def refused_burst(self, ep: str, n: int) -> None:
        """``n`` deliveries whose every request the receiver refuses (500) as it leaves, the
        endpoint's storage answering meanwhile: retries fill memory (the breaker opens first
        unless it is patient)."""
        sim = self.sim
        for _ in range(n):
            sim.new_delivery(ep)
        for _ in range(4 * n):
            mine = [io for io in sim.io if io.ep == ep]
            if not mine:
                break
            io = min(mine, key=lambda o: o.seq)
            if io.kind == "send":
                sim.finish(io, report=RESULTS["500"])
            else:
                sim.finish(io)

    @precondition(lambda self: any(self.sim.now - d.created_at_ms > self.sim.policy.fresh_window_ms
                                   for d in self.sim.accepted.values()))
    @rule(pick=st.integers(0, 1 << 16))
    def recreate(self, pick: int) -> None:
        fresh = self.sim.policy.fresh_window_ms
        old = [d for d in self.sim.accepted.values() if self.sim.now - d.created_at_ms > fresh]
        self.sim.recreate(old[pick % len(old)])

    @rule(pick=st.integers(0, 1 << 16),
          mode=st.sampled_from(["ok", "ok", "unknown", "wrong_tenant", "wrong_endpoint", "repeat_id"]))
    def replay(self, pick: int, mode: str) -> None:
        sim = self.sim
        ids = sorted(sim.accepted)
        if mode == "unknown" or not ids:
            sim.replay(f"dlv_unknown_{pick % 3}")
            return
        d = sim.accepted[ids[pick % len(ids)]]
        if mode == "wrong_tenant":
            sim.replay(d.delivery_id, tenant="ta" if d.tenant_id == "tb" else "tb")
        elif mode == "wrong_endpoint":
            others = [ep for ep in EPS if ep != d.endpoint_id]
            sim.replay(d.delivery_id, endpoint=others[pick % len(others)])
        elif mode == "repeat_id" and sim.replays:
            rids = sorted(sim.replays)
            sim.repeat_replay(rids[pick % len(rids)])
        else:
            sim.replay(d.delivery_id)

    @precondition(lambda self: any(c.status is not EndpointStatus.DELETED for c in self.sim.published.values()))
    @rule(ep=st.sampled_from(EPS), change=st.sampled_from(CONFIG_CHANGES), deliver=st.booleans(),
          value=st.sampled_from([1, 2, 5]))
    def change_config(self, ep: str, change: str, deliver: bool, value: int) -> None:
        sim = self.sim
        if sim.published[ep].status is EndpointStatus.DELETED:
            return  # deleted for good
        changes: dict[str, object] = {
            "disable": {"status": EndpointStatus.DISABLED},
            "enable": {"status": EndpointStatus.ACTIVE},
            "delete": {"status": EndpointStatus.DELETED},
            "url": {"url": f"https://{ep}/v{sim.published[ep].config_version + 1}"},
            "rate_limit": {"rate_limit_per_s": float(value)},
            "no_rate_limit": {"rate_limit_per_s": None},
            "max_in_flight": {"max_in_flight": value},
            "bad_key": {"signing_keys": (SigningKey(2, BAD_KEY),)},
            "good_key": {"signing_keys": (SigningKey(3, "ok"),)},
            "ordered": {"ordering_key": "object_id"},
            "unordered": {"ordering_key": ""},
        }[change]  # type: ignore[assignment]
        sim.publish(ep, deliver=deliver, **changes)  # type: ignore[arg-type]

    @precondition(lambda self: any(self.sim.lagging.values()))
    @rule(ep=st.sampled_from(EPS))
    def deliver_lagging_config(self, ep: str) -> None:
        self.sim.deliver_configs(ep, 1)

    @rule(ms=st.sampled_from([1, 7, 60, 400, 1_000, 1_000, 2_500, 2_500, 9_000, 30_000, 70_000, 24 * 3600 * 1000 + 1]))
    def advance(self, ms: int) -> None:
        self.sim.advance(ms)

    @rule()
    def fire_next_timer(self) -> None:
        self.sim.fire_next_timer()

    @precondition(lambda self: bool(self.sim.io))
    @rule(pick=st.integers(0, 1 << 16), result=st.sampled_from([*RESULTS, "exception"]), landing=st.integers(0, 3))
    def complete_io(self, pick: int, result: str, landing: int) -> None:
        """A request answers ``result``; a storage read or write fails when ``result`` is one of
        500/timeout/exception (then each statement of a write lands by a bit of ``landing``)."""
        sim = self.sim
        io = sorted(sim.io, key=lambda o: o.seq)[pick % len(sim.io)]
        if io.kind == "send":
            if result == "exception":
                sim.finish(io, exc=RuntimeError("sender bug"))
            else:
                sim.finish(io, report=RESULTS[result])
        else:
            bits = iter([landing & 1, landing & 2] * 4)
            sim.finish(io, ok=result not in ("500", "timeout", "exception"), land=lambda: bool(next(bits)))

    @rule(event=st.sampled_from(["checkpoint", "checkpoint", "crash"]), landing=st.integers(0, 255),
          downtime=st.sampled_from([0, 1_500, 20_000]))
    def flink(self, event: str, landing: int, downtime: int) -> None:
        """A checkpoint, or a crash: writes in flight land statement by statement (a bit of
        ``landing`` each), the job restores the last checkpoint after ``downtime``."""
        if event == "checkpoint":
            self.sim.checkpoint()
            return
        bits = iter([(landing >> i) & 1 for i in range(8)] * 64)
        self.sim.crash_and_restore(land=lambda: bool(next(bits, 0)), downtime_ms=downtime)

    @rule(k=st.integers(0, 3))
    def adapter_raises(self, k: int) -> None:
        """The next pass with more than ``k`` actions raises while starting action ``k``."""
        self.sim.raise_after = k

    @precondition(lambda self: bool(self.sim.accepted))
    @rule(ep=st.sampled_from(EPS), n=st.sampled_from([100, 300]))
    def bulk_replay(self, ep: str, n: int) -> None:
        """An operator replays an endpoint's deliveries in bulk (RecoverFailedDeliveries): ``n``
        requests over them, several per delivery when it has few."""
        sim = self.sim
        mine = sorted(did for did, d in sim.accepted.items() if d.endpoint_id == ep)
        for i in range(n if mine else 0):
            sim.replay(mine[i % len(mine)])

    @invariant()
    def world_invariants(self) -> None:
        check_all(self.sim)

    def teardown(self) -> None:
        if hasattr(self, "sim"):
            self.sim.drain()
            check_drained(self.sim)
            check_final_by_deadline(self.sim)


DriverMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None, derandomize=True, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestDriverModel = DriverMachine.TestCase


@pytest.fixture(autouse=True)
def _cases_independent_of_the_other_test_files() -> Iterator[None]:
    """Derandomized, the machine still explored other cases depending on which test files ran
    with it: hypothesis draws one value in twenty from the constants of every non-test module
    imported so far in the process (6.170, providers._get_local_constants), so the modules other
    files import changed the cases (from the fourth on, run with the dispatcher adapter's tests),
    and a failing case was found in one order only. The seeds and picks drawn here have
    nothing to do with the code's constants: the machine draws from the global constants only,
    the same 200 cases alone, in any subset, or in the whole suite. (Private API, pinned in
    requirements.lock: a hypothesis upgrade that renames it fails here, loudly.)"""
    empty = providers.Constants()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(providers, "_get_local_constants", lambda: empty)
        providers.CONSTANTS_CACHE.cache.clear()  # filled from the pool by earlier tests
        yield
        providers.CONSTANTS_CACHE.cache.clear()  # filled without it by this one


# -- the defects as seeds ---------------------------------------------------------------------


def sends_of(sim: Sim) -> list[Io]:
    return [io for io in sim.io if io.kind == "send"]


def settle_storage(sim: Sim) -> None:
    """Let every storage read and write succeed (and what follows from them)."""
    while any(io.kind != "send" for io in sim.io):
        sim.finish(next(io for io in sim.io if io.kind != "send"))


def test_re_enabled_endpoint_drains_at_once() -> None:
    sim = Sim()
    for ep in EPS:
        sim.publish(ep)
    sim.publish("ep_b1", status=EndpointStatus.DISABLED)
    # fan-out saw it active a moment ago (its config reached the dispatcher first)
    sim.published["ep_b1"] = replace(sim.published["ep_b1"], status=EndpointStatus.ACTIVE)
    for _ in range(3):
        d = sim.new_delivery("ep_b1")
        assert d is not None
    sim.published["ep_b1"] = replace(sim.published["ep_b1"], status=EndpointStatus.DISABLED)
    settle_storage(sim)
    sim.advance(10_000)
    assert not sends_of(sim) and not sim.requests
    sim.publish("ep_b1", status=EndpointStatus.ACTIVE)  # v3 > the deliveries' v2
    settle_storage(sim)
    assert len(sends_of(sim)) == 2  # at once, up to the endpoint's in-flight cap
    for io in sends_of(sim):
        sim.finish(io, report=HttpResult(status=200))
    settle_storage(sim)
    assert len(sim.requests) == 3
    sim.drain()
    check_drained(sim)
    assert all(sim.db.status[did].status == "succeeded" for did in sim.accepted)


def test_replay_to_disabled_endpoint_ends_visibly_within_the_manual_wait() -> None:
    sim = Sim()
    sim.publish("ep_a1")
    d = sim.new_delivery("ep_a1")
    assert d is not None
    settle_storage(sim)
    (io,) = sends_of(sim)
    sim.finish(io, report=HttpResult(status=200))
    settle_storage(sim)
    assert sim.db.status[d.delivery_id].status == "succeeded"
    sim.advance(25 * 3600 * 1000)  # older than 24 h: long past its deadline
    sim.publish("ep_a1", status=EndpointStatus.DISABLED)
    rid = sim.replay(d.delivery_id)
    assert sim.replays[rid].outcome == "loading"
    settle_storage(sim)
    wait = sim.policy.manual_wait_ms
    sim.advance(wait - 1)
    assert not sends_of(sim) and not any(r.request_id == rid for r in sim.db.attempts[d.delivery_id].values())
    sim.advance(1)
    settle_storage(sim)
    (row,) = [r for r in sim.db.attempts[d.delivery_id].values() if r.request_id == rid]
    assert row.outcome == "not_sent" and row.manual and not row.sent
    assert sim.db.status[d.delivery_id].status == "succeeded"  # a manual not-sent says nothing of it
    assert sim.requests[d.delivery_id] == [1]
    check_drained(sim)


def test_tenant_quota_one_slot_comes_back_when_its_endpoint_is_disabled() -> None:
    sim = Sim(pool=4, quota=1)
    for ep in EPS:
        sim.publish(ep)
    a = sim.new_delivery("ep_a1")
    settle_storage(sim)
    (first,) = sends_of(sim)  # ep_a1 holds tenant ta's only slot
    sim.new_delivery("ep_a1")
    b = sim.new_delivery("ep_a2")
    settle_storage(sim)
    assert len(sends_of(sim)) == 1  # both wait for the slot, with tickets
    assert a is not None and b is not None
    sim.finish(first, report=HttpResult(status=200))  # ep_a1 takes it again, or ep_a2 gets it
    settle_storage(sim)
    sim.advance(2_000)
    check_slots(sim)
    holder = sends_of(sim)[0].ep
    sim.publish(holder, status=EndpointStatus.DISABLED)
    for io in sends_of(sim):
        sim.finish(io, report=HttpResult(status=200))
    settle_storage(sim)
    sim.advance(2_000)  # the other endpoint of ta gets the slot within its back-off
    other = "ep_a2" if holder == "ep_a1" else "ep_a1"
    assert [io.ep for io in sends_of(sim)] == [other]
    check_slots(sim)


def test_blocked_endpoints_are_not_polled() -> None:
    """Defect 1: bucket at 1/s with 5 due, and an open breaker with 30 due."""
    sim = Sim(pool=64, quota=64, write_budget=1000)
    sim.publish("ep_a1", rate_limit_per_s=1.0, max_in_flight=64)
    sim.publish("ep_b1", max_in_flight=64)
    for _ in range(5):
        sim.new_delivery("ep_a1")
    for _ in range(30):
        sim.new_delivery("ep_b1")
    settle_storage(sim)
    for io in sends_of(sim):
        if io.ep == "ep_b1":
            sim.finish(io, report=HttpResult(status=503))
    settle_storage(sim)
    assert sim.drivers["ep_b1"].breaker.state is brk.CircuitState.OPEN
    passes = sim.count_passes()
    for _ in range(10):
        sim.advance(1_000)
        for io in sends_of(sim):
            sim.finish(io, report=HttpResult(status=200) if io.ep == "ep_a1" else HttpResult(status=503))
        settle_storage(sim)
    assert len(sim.requests) >= 5 and passes["ep_a1"] <= 20 and passes["ep_b1"] <= 20, passes


def test_final_before_a_crash_is_not_sent_again() -> None:
    sim = Sim()
    sim.publish("ep_a1")
    sim.checkpoint()
    ds = [sim.new_delivery("ep_a1") for _ in range(4)]
    settle_storage(sim)
    for io in sends_of(sim):
        sim.finish(io, report=HttpResult(status=200))
    settle_storage(sim)  # two succeeded and durable; two sent, in flight at the crash
    assert len(sim.requests) == 4 and sum(1 for d in ds if d and sim.db.final(d.delivery_id)) == 2
    sim.crash_and_restore(land=lambda: False)
    sim.drain()
    check_drained(sim)
    again = [did for did, numbers in sim.requests.items() if len(numbers) > 1]
    assert len(again) == 2 and all(did not in sim.final_before_crash for did in again)
    assert all(sim.requests[did] == [1, 2] for did in again)  # the re-send has its own attempt row


def test_a_manual_request_answered_before_a_checkpoint_is_not_sent_again() -> None:
    """Keyed state drops a manual request once its record is durable: a restore from a later
    checkpoint does not send it again (a request read again from Kafka after the restore is)."""
    sim = Sim()
    sim.publish("ep_a1")
    d = sim.new_delivery("ep_a1")
    assert d is not None
    settle_storage(sim)
    sim.finish(sends_of(sim)[0], report=HttpResult(status=500))  # pending, retried later
    settle_storage(sim)
    rid = sim.replay(d.delivery_id)  # sent at once, manual
    sim.finish(sends_of(sim)[0], report=HttpResult(status=500))  # the manual try fails: still pending
    settle_storage(sim)
    assert [r.outcome for r in sim.db.attempts[d.delivery_id].values() if r.request_id == rid] == ["failed"]
    sim.checkpoint()
    sim.crash_and_restore(land=lambda: False)
    sim.drain()  # request_leaves asserts the manual request is not sent again
    check_drained(sim)
    assert sim.manual_requests[d.delivery_id] == 1


# -- defects the machine found, fixed since: regression tests --------------------------------------


def succeeded(sim: Sim, ep: str = "ep_a1") -> NewDelivery:
    """A delivery sent once and recorded as succeeded (it has left the driver)."""
    d = sim.new_delivery(ep)
    assert d is not None
    settle_storage(sim)
    sim.finish(next(io for io in sends_of(sim) if io.did == d.delivery_id), report=HttpResult(status=200))
    settle_storage(sim)
    assert sim.db.status[d.delivery_id].status == "succeeded" and d.delivery_id not in sim.stores[ep].pending
    return d


def test_a_replay_during_an_expiry_write_does_not_lose_the_delivery() -> None:
    """A replay while an expiry is being written must not put that (not yet durable) expiry in keyed
    state: a crash would lose the delivery 'pending' for good. Found by the machine; fixed in a93f8d5."""
    sim = Sim()
    sim.publish("ep_a1", deliver=False)  # fan-out has the config, the dispatcher not yet
    d = sim.new_delivery("ep_a1")
    assert d is not None
    settle_storage(sim)
    sim.advance(60_000)  # its deadline: the expiry record is being written
    assert [io.kind for io in sim.io] == ["record"]
    sim.replay(d.delivery_id)  # a person asks for it meanwhile
    sim.checkpoint()
    sim.crash_and_restore(land=lambda: False)  # the expiry write did not land
    sim.drain()  # the manual request ends not_sent, and the delivery leaves keyed state 'pending'
    check_drained(sim)


def test_a_replay_during_a_manual_send_keeps_that_request_through_a_crash() -> None:
    """Found by the machine; fixed in 6b2c999 (the stored form keeps a request being sent owed)."""
    sim = Sim()
    sim.publish("ep_a1")
    d = succeeded(sim)
    first = sim.replay(d.delivery_id)
    settle_storage(sim)  # loaded, reserved, sent
    assert sim.manual_requests[d.delivery_id] == 1
    sim.replay(d.delivery_id)  # a second request while the first is in flight
    sim.checkpoint()
    sim.crash_and_restore(land=lambda: False)
    sim.drain()
    rows = [r for r in sim.db.attempts[d.delivery_id].values() if r.request_id == first]
    assert rows, f"request {first} reached the receiver and has no attempt row: history cannot explain it"


def test_after_a_restore_a_delivery_still_waits_for_its_config_version() -> None:
    """Defect 8 after a restore: needs_version comes back from keyed state. Found by the machine;
    fixed in a93f8d5."""
    sim = Sim()
    sim.publish("ep_a1")
    sim.publish("ep_a1", deliver=False, url="https://ep_a1/v2")  # fan-out sees v2, the dispatcher not yet
    d = sim.new_delivery("ep_a1")
    assert d is not None and d.endpoint_config_version == 2
    sim.checkpoint()  # with its creation write in flight (and the adapter's timer to harvest it)
    sim.crash_and_restore(land=lambda: True)
    sim.fire_next_timer()  # that timer builds the driver from keyed state
    settle_storage(sim)  # CHECK, RESERVE ... and it is sent with v1 (request_leaves asserts)


def test_a_replay_waits_for_the_config_version_of_its_delivery() -> None:
    """Defect 8 for a replay loaded from Cassandra. Found by the machine; fixed in a93f8d5."""
    sim = Sim()
    sim.publish("ep_a1")
    sim.publish("ep_a1", deliver=False, url="https://ep_a1/v2")
    d = sim.new_delivery("ep_a1")
    assert d is not None
    settle_storage(sim)
    sim.advance(61_000)  # expired, never sent: the dispatcher's config stayed older
    settle_storage(sim)
    assert sim.db.status[d.delivery_id].status == "expired" and "ep_a1" not in sim.drivers
    sim.replay(d.delivery_id)
    settle_storage(sim)  # loaded by a new driver, and sent with v1 (request_leaves asserts)


def test_a_replay_to_a_deleted_endpoint_ends_visibly() -> None:
    """Defect 3 for a deleted endpoint: its waiting manual requests end with not_sent rows. Found by
    the machine; fixed in a93f8d5."""
    sim = Sim()
    sim.publish("ep_a1")
    d = succeeded(sim)
    sim.publish("ep_a1", status=EndpointStatus.DELETED)
    sim.replay(d.delivery_id)
    sim.drain()
    check_drained(sim)


def test_a_forged_replay_does_not_cancel_a_valid_one() -> None:
    """Defect 9: a forged request loaded together with a valid one refuses only itself. Found by the
    machine; fixed in a93f8d5."""
    sim = Sim()
    sim.publish("ep_a1")
    d = succeeded(sim)
    sim.replay(d.delivery_id)
    sim.replay(d.delivery_id, tenant="tb")  # tenant tb asks for ta's delivery: refused, rightly
    sim.drain()
    check_drained(sim)  # but ta's own request was refused with it, silently


def test_removing_a_rate_limit_takes_effect_without_a_wake_loop() -> None:
    """Removing a rate limit drops the old bucket (it went on gating at the old rate, with a 5-10 ms
    wake loop). Found by the machine; fixed in a93f8d5."""
    sim = Sim(pool=8, quota=8)
    sim.publish("ep_a1", rate_limit_per_s=1.0, max_in_flight=8)
    for _ in range(6):
        sim.new_delivery("ep_a1")
    settle_storage(sim)
    assert len(sends_of(sim)) == 1  # a burst of one
    sim.publish("ep_a1", rate_limit_per_s=None)
    sim.finish(sends_of(sim)[0], report=HttpResult(status=200))
    settle_storage(sim)
    assert len(sends_of(sim)) == 5, "the limit is gone: the other five may go at once"


def test_after_sending_what_was_due_the_next_retry_still_has_a_timer() -> None:
    """After sending what was due, the next retry still has its wake (it waited for a leftover slot
    back-off). Found by the machine; fixed in a93f8d5."""
    sim = Sim(seed=13, quota=1)
    sim.publish("ep_a1")
    for _ in range(3):
        sim.new_delivery("ep_a1")
    settle_storage(sim)  # d1 sent; d2, d3 wait for the tenant's only slot
    sim.finish(sends_of(sim)[0], report=HttpResult(status=503, retry_after="3"))  # d1 retries in ~3 s; d2 goes
    sim.advance(2_900)  # d3 backs off waiting for the slot
    settle_storage(sim)  # d1's retry is recorded: due in a few hundred ms; d3 is due (no slot), so no wake for d1
    sim.finish(sends_of(sim)[0], report=HttpResult(status=200))  # d2 done, d3 goes ... and d1's retry time?
    check_timely(sim)  # its first timer is a leftover slot back-off, later than the retry


def test_a_send_that_could_not_start_leaves_a_timer() -> None:
    """Defect 5: send_not_started holds the endpoint after the step chose its wake, so the adapter
    wakes it when the hold ends (it had no timer at all, not even its deadline). Found by the
    machine; fixed in a93f8d5 (operators/dispatcher.py; Sim.pass_ mirrors it)."""
    sim = Sim()
    sim.publish("ep_a1", signing_keys=(SigningKey(2, BAD_KEY),))
    d = sim.new_delivery("ep_a1")
    assert d is not None
    settle_storage(sim)  # the request could not be built: held 1 s ... with no timer at all
    sim.advance(120_000)  # so it is not even expired at its deadline
    assert sim.db.final(d.delivery_id), sim.stuck()


def test_write_budget_wait_is_not_a_poll() -> None:
    """Waiting for the operator's write budget backs off instead of polling every 10 ms. Found by the
    machine; fixed in a93f8d5."""
    sim = Sim(write_budget=1)
    for ep in EPS:
        sim.publish(ep)
    sim.new_delivery("ep_a1")  # its persist takes the whole budget for ~3 s (a slow Cassandra)
    sim.new_delivery("ep_b1")  # waits for the budget
    passes = sim.count_passes()
    sim.advance(2_900)
    assert passes["ep_b1"] <= MAX_WAKES_PER_S * 3 + WAKE_SLACK, f"{passes['ep_b1']} passes in 2.9 s"


# -- defects the machine found after the lazy restore read (fixed; regression tests) -----------------


def test_a_restored_delivery_reads_its_record_before_it_is_expired() -> None:
    sim = Sim()
    sim.publish("ep_a2")
    d = sim.new_delivery("ep_a2")
    assert d is not None
    sim.checkpoint()  # keyed state has it as it arrived: no attempt numbers taken
    settle_storage(sim)
    sim.finish(sends_of(sim)[0], report=HttpResult(status=500))
    settle_storage(sim)
    sim.advance(1_000)  # its retry is sent: #2
    sim.finish(sends_of(sim)[0], report=HttpResult(status=400))
    settle_storage(sim)
    assert sim.db.status[d.delivery_id].status == "failed" and sim.db.status[d.delivery_id].attempt_count == 2
    sim.crash_and_restore(land=lambda: False, downtime_ms=60_000)  # back after its deadline
    sim.fire_next_timer()
    settle_storage(sim)  # 'expired', attempt count 0, written over 'failed' with 2 (check_all)
    sim.replay(d.delivery_id)  # and a replay now would reuse attempt number 1 (request_leaves)
    settle_storage(sim)
    check_all(sim)


def test_restored_work_waiting_for_its_read_is_not_polled() -> None:
    sim = Sim(quota=1)
    sim.publish("ep_a2")
    for _ in range(2):
        sim.new_delivery("ep_a2")
    settle_storage(sim)  # one sent, one waiting for the tenant's only slot
    sim.checkpoint()
    sim.crash_and_restore(land=lambda: False)
    sim.fire_next_timer()  # the checkpointed timer builds the driver: both restored, both due
    sim.fire_next_timer()  # the first one's record is read (one at a time: one slot)
    sim.finish(next(io for io in sim.io if io.kind == "check"), ok=False)  # the read times out
    sim.advance(400)  # retried in 500 ms; meanwhile: "woken 59 times in 400 ms" (the rate bound)


def test_breaker_blocked_work_files_no_slot_ticket() -> None:
    """The machine's example, as it printed it: ep_a1's breaker opens on a DNS failure while a
    manual request is in flight; once that request's record is durable and the manual request
    after it is sent, the automatic work left is due but breaker-blocked, and the driver keeps a
    ticket for it ("more due than slots granted") that any grant() may fill."""
    m = DriverMachine()
    m.init(seed=0, lag="ep_a2", pool=2, quota=2)
    m.deliver_lagging_config(ep="ep_a2")
    m.new_deliveries(age=0, ep="ep_a1", n=1)
    m.complete_io(landing=0, pick=0, result="200")
    m.replay(mode="ok", pick=0)
    m.replay(mode="unknown", pick=0)
    m.new_deliveries(age=0, ep="ep_a2", n=3)
    m.complete_io(landing=0, pick=0, result="200")
    m.complete_io(landing=0, pick=1, result="200")
    m.new_deliveries(age=40000, ep="ep_a1", n=1)
    m.replay(mode="ok", pick=0)
    m.complete_io(landing=0, pick=3, result="200")
    m.replay(mode="ok", pick=1)
    m.complete_io(landing=0, pick=5, result="dns")
    m.complete_io(landing=0, pick=0, result="200")
    m.world_invariants()
    m.teardown()


def test_a_due_retry_bucket_takes_memory_from_later_retries() -> None:
    """The machine's example, as it printed it (found when run with the dispatcher adapter's
    tests): memory full, a pass out of page-in budget left due retries queued and retries due
    later in memory, and slept until its next retry (test_endpoint_driver has it step by step)."""
    m = DriverMachine()
    m.init(seed=13734, lag="", pool=2, quota=2, patient=True)
    m.refused_burst(ep="ep_a1", n=6)
    m.fire_next_timer()
    m.refused_burst(ep="ep_b1", n=6)
    m.refused_burst(ep="ep_a1", n=6)
    m.refused_burst(ep="ep_b1", n=6)
    m.refused_burst(ep="ep_a1", n=10)
    m.fire_next_timer()
    m.fire_next_timer()
    m.fire_next_timer()
    m.world_invariants()
    m.teardown()
