"""The endpoint driver, driven the way the Flink adapter drives it, with a simulated clock, history
and receiver. Each test named after a defect reproduces it as it was reported.

``Sim`` plays the adapter: it feeds inputs, runs the storage actions against an in-memory
history (instantly, unless told to hold them), completes HTTP requests with scripted answers, and
wakes each endpoint exactly when its driver asked. Counting passes is how busy loops show up.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core import breaker as brk
from core import dispatch as dsp
from core.endpoint_driver import (
    Check,
    DriverPolicy,
    EndpointDriver,
    Load,
    Persist,
    Record,
    Reserve,
    Send,
    StorageHealth,
)
from core.endpoint_store import InMemoryEndpointStore
from core.fairness import FairScheduler
from core.fanout import NewDelivery
from core.outcomes import ErrorClass, HttpResult
from core.records import EndpointConfig, EndpointStatus, EventRecord, ReplayRequest, SigningKey
from core.retry import RetrySchedule
from core.telemetry import summarize

T0 = 1_700_000_000_000
DAY_MS = 24 * 3600 * 1000
SCHEDULE = RetrySchedule(base_s=5.0, cap_s=3600.0, max_attempts=20, deadline_s=24 * 3600.0, max_retry_after_s=3600.0)
BREAKER = brk.BreakerConfig(failure_threshold=5, fast_failure_threshold=2, open_s=30.0, max_open_s=600.0)
POLICY = DriverPolicy(schedule=SCHEDULE, breaker=BREAKER, default_max_in_flight=8, manual_wait_ms=60_000)


def config(endpoint_id: str = "ep_1", tenant: str = "t_1", version: int = 1, **changes: Any) -> EndpointConfig:
    base = EndpointConfig(
        endpoint_id=endpoint_id, tenant_id=tenant, url=f"https://example.com/{endpoint_id}",
        status=EndpointStatus.ACTIVE, event_types=("*",), config_version=version, published_at_ms=T0,
        signing_keys=(SigningKey(version=1, ciphertext_b64="x", not_after_ms=None),))
    return replace(base, **changes)


def delivery(n: int, endpoint_id: str = "ep_1", tenant: str = "t_1", created: int = T0,
             version: int = 1) -> NewDelivery:
    e = EventRecord(event_id=f"evt_{n}", tenant_id=tenant, event_type="invoice.paid", schema_version="1",
                    object_id="", object_version=0, occurred_at_ms=created, payload=b"{}")
    return NewDelivery(delivery_id=f"dlv_{endpoint_id}_{n}", event=e, endpoint_id=endpoint_id, tenant_id=tenant,
                       endpoint_config_version=version, created_at_ms=created, expires_at_ms=created + DAY_MS)


@dataclass
class Durable:
    status: str = "pending"
    attempt_count: int = 0
    next_attempt_at_ms: int | None = None
    auto: bool = True
    rows: dict[int, str] = field(default_factory=dict)  # attempt number -> outcome
    error_class: str | None = None


class Sim:
    def __init__(self, pool: int = 64, quota: int = 64, policy: DriverPolicy = POLICY, seed: int = 1) -> None:
        self.now = T0
        self.scheduler = FairScheduler(pool_size=pool, tenant_quota=quota)
        self.policy = policy
        self.rng = random.Random(seed)
        self.stores: dict[str, InMemoryEndpointStore] = {}
        self.drivers: dict[str, EndpointDriver] = {}
        self.counts: Counter[str] = Counter()
        self.history: dict[str, Durable] = {}
        self.requests: Counter[str] = Counter()
        self.sends: dict[str, list[Send]] = {}  # endpoint -> requests in flight
        self.wakes: dict[str, tuple[int, str] | None] = {}
        self.passes: Counter[str] = Counter()
        self.answer: dict[str, HttpResult] = {}  # endpoint -> what its receiver answers
        self.answer_for: dict[str, HttpResult] = {}  # delivery -> what the receiver answers it
        self.hold_storage = False
        self.held: list[tuple[str, Any]] = []
        self.sent_numbers: dict[str, list[int]] = {}
        self.fail_writes: set[str] = set()  # deliveries whose every storage action fails
        # deliveries whose storage actions are refused for their values (poison); "all": even the
        # record that carries none of them
        self.reject_writes: dict[str, str] = {}
        self.storage = StorageHealth()
        self.send_errors: dict[str, list[BaseException]] = {}  # delivery -> what its next sends raise
        self.unbuildable = False  # no request can be built (no signing key decrypts)
        self.created: dict[str, NewDelivery] = {}
        self.first_request_at: dict[str, int] = {}
        # delivery -> (when each request left, the durable next attempt time it was due at)
        self.sent_at: dict[str, list[tuple[int, int | None]]] = {}

    def driver(self, ep: str) -> EndpointDriver:
        if ep not in self.drivers:
            store = self.stores.setdefault(ep, InMemoryEndpointStore())
            self.drivers[ep] = EndpointDriver(ep, self.policy, self.rng, store, self.scheduler, self.counts,
                                              self.storage)
        return self.drivers[ep]

    # inputs, each followed by a pass like the adapter's process_element
    def new(self, d: NewDelivery, recheck: bool = False) -> None:
        self.created[d.delivery_id] = d  # what a replay's load reads back
        self.driver(d.endpoint_id).add_new(d, self.now, recheck=recheck)
        self.run(d.endpoint_id)

    def config(self, cfg: EndpointConfig) -> None:
        self.driver(cfg.endpoint_id).set_config(cfg)
        self.run(cfg.endpoint_id)

    def replay(self, r: ReplayRequest) -> str:
        out = self.driver(r.endpoint_id).add_replay(r, self.now)
        self.run(r.endpoint_id)
        return out

    def run(self, ep: str) -> None:
        """One pass: step, apply storage actions (instantly unless held), start sends."""
        drv = self.driver(ep)
        for _ in range(1000):  # storage completes instantly: loop until the driver waits
            self.passes[ep] += 1
            dec = drv.step(self.now, 1024)
            done_any = False
            for a in dec.actions:
                if isinstance(a, Send) and self.unbuildable:
                    drv.send_not_started(a.p.delivery_id, "no signing key decrypts", self.now)
                elif isinstance(a, Send):
                    row = self.history[a.p.delivery_id].rows
                    assert a.p.intent is not None and a.p.intent.number in row, "request before its attempt row"
                    self.requests[a.p.delivery_id] += 1
                    self.first_request_at.setdefault(a.p.delivery_id, self.now)
                    self.sent_at.setdefault(a.p.delivery_id, []).append(
                        (self.now, self.history[a.p.delivery_id].next_attempt_at_ms))
                    self.sent_numbers.setdefault(a.p.delivery_id, []).append(a.p.intent.number)
                    self.sends.setdefault(ep, []).append(a)
                elif self.hold_storage:
                    self.held.append((ep, a))
                elif not isinstance(a, Load) and a.p.delivery_id in self.fail_writes:
                    kind = {Check: "check", Persist: "persist", Reserve: "reserve", Record: "record"}[type(a)]
                    drv.io_done(kind, a.p.delivery_id, None, TimeoutError("write timed out"), self.now)
                    done_any = True  # a finished I/O, failed or not, drives a pass
                elif not isinstance(a, Load) and self._rejected(a):
                    kind = {Check: "check", Persist: "persist", Reserve: "reserve", Record: "record"}[type(a)]
                    drv.io_done(kind, a.p.delivery_id, None, dsp.WriteRejected("UnicodeEncodeError"), self.now)
                    done_any = True
                else:
                    self._storage(drv, a)
                    done_any = True
            self.wakes[ep] = (dec.wake.at_ms, dec.wake.reason) if dec.wake else None
            if drv.held_until_ms > self.now and (dec.wake is None or drv.held_until_ms < dec.wake.at_ms):
                self.wakes[ep] = (drv.held_until_ms, "hold ends")  # held after the step chose its wake
            if not done_any:
                # The gauges' summary, kept as deliveries move, is the full recount's after each pass
                # (every 25th with a large backlog, whose recount is the slow part of a test).
                if len(drv.items) <= 300 or self.passes[ep] % 25 == 0:
                    assert drv.summary(self.now, DAY_MS) == summarize(drv.view(self.now, DAY_MS))
                return
        raise AssertionError("storage never settled")

    def _rejected(self, a: Check | Persist | Reserve | Record) -> bool:
        how = self.reject_writes.get(a.p.delivery_id)
        valueless = isinstance(a, Record) and a.p.record is not None and a.p.record.detail == dsp.WITHOUT_VALUES
        return how == "all" or (how is not None and not valueless)

    def _storage(self, drv: EndpointDriver, a: Any) -> None:
        if isinstance(a, Check):
            h = self.history.get(a.p.delivery_id)
            rec = dsp.DurableRecord(status=None) if h is None else dsp.DurableRecord(
                h.status, h.attempt_count, h.next_attempt_at_ms, h.auto, max(h.rows, default=0))
            drv.io_done("check", a.p.delivery_id, rec, None, self.now)
        elif isinstance(a, Persist | Reserve):
            h = self.history.setdefault(a.p.delivery_id, Durable())
            assert a.p.intent is not None
            h.rows.setdefault(a.p.intent.number, "reserved")
            drv.io_done("persist" if isinstance(a, Persist) else "reserve", a.p.delivery_id, None, None, self.now)
        elif isinstance(a, Record):
            r = a.p.record
            assert r is not None
            h = self.history.setdefault(a.p.delivery_id, Durable())
            if r.intent is not None:
                h.rows[r.intent.number] = r.outcome
            if a.p.intent is not None:
                h.rows.setdefault(a.p.intent.number, "reserved")
            if r.delivery_status is not None and h.status not in dsp.FINAL_STATUSES:
                h.status, h.next_attempt_at_ms, h.auto = r.delivery_status, r.next_attempt_at_ms, r.auto_retry_active
                h.attempt_count, h.error_class = a.p.attempt_count, r.error_class
            drv.io_done("record", a.p.delivery_id, None, None, self.now)
        elif isinstance(a, Load):
            d, h = self.created.get(a.delivery_id), self.history.get(a.delivery_id)
            loaded = None if d is None or h is None else (d, dsp.DurableRecord(
                h.status, h.attempt_count, h.next_attempt_at_ms, h.auto, max(h.rows, default=0)))
            drv.io_done("load", a.delivery_id, loaded, None, self.now)

    def answer_all(self, ep: str, result: HttpResult | None = None) -> int:
        """The receiver answers every request in flight to ``ep``; then one pass."""
        drv = self.driver(ep)
        sends, self.sends[ep] = self.sends.get(ep, []), []
        for s in sends:
            errors = self.send_errors.get(s.p.delivery_id)
            if errors:
                drv.io_done("send", s.p.delivery_id, None, errors.pop(0), self.now)
                continue
            res = result or self.answer_for.get(s.p.delivery_id) or self.answer.get(ep, HttpResult(200))
            drv.io_done("send", s.p.delivery_id, dsp.SendReport(res, self.now, self.now, s.config.url,
                                                                   s.config.config_version), None, self.now)
        self.run(ep)
        return len(sends)

    def advance(self, until: int, answer: bool = True) -> None:
        """Let simulated time pass, waking each endpoint exactly when its driver asked (and
        answering requests at once, as a fast receiver would)."""
        while True:
            due = [(w[0], ep) for ep, w in self.wakes.items() if w is not None and w[0] <= until]
            if not due:
                break
            at, ep = min(due)
            self.now = max(self.now, at)
            self.wakes[ep] = None
            self.run(ep)
            if answer and self.sends.get(ep):
                self.answer_all(ep)
        self.now = until

    def restore(self) -> None:
        """A crash: memory, I/O and slots gone; keyed state as checkpointed now (a copy of it)."""
        self.stores = {ep: _copy_store(s) for ep, s in self.stores.items()}
        self.drivers, self.sends = {}, {}
        self.scheduler = FairScheduler(pool_size=64, tenant_quota=64)

    def watch(self, *kinds: type) -> list[str]:
        """The delivery ids of the storage actions of these kinds from now on, in order."""
        seen: list[str] = []
        real = self._storage

        def watching(drv: EndpointDriver, a: Any) -> None:
            if isinstance(a, kinds):
                seen.append(a.p.delivery_id)
            real(drv, a)

        self._storage = watching  # type: ignore[method-assign]
        return seen

    def slots_conserved(self) -> None:
        untaken = sum(n for _, n in self.scheduler._grants.values())
        assert sum(d.in_flight for d in self.drivers.values()) + untaken == self.scheduler.in_flight_total()
        for ep, drv in self.drivers.items():
            assert drv.in_flight == len(self.sends.get(ep, []))


def backlog_behind_open_breaker(n: int, policy: DriverPolicy = POLICY) -> Sim:
    """``n`` deliveries for ep_1 arriving one by one (each persisted, and queued, in arrival
    order), whose TLS failures have opened its breaker."""
    sim = Sim(policy=policy)
    sim.config(config())
    sim.answer["ep_1"] = HttpResult(None, ErrorClass.TLS)
    for i in range(n):
        sim.driver("ep_1").add_new(delivery(i), sim.now)
        sim.run("ep_1")
        sim.answer_all("ep_1")
    assert sim.driver("ep_1").breaker.state is brk.CircuitState.OPEN
    return sim


# -- defect 1: busy loops ------------------------------------------------------------------------


def test_an_empty_token_bucket_wakes_at_its_refill_not_every_millisecond() -> None:
    sim = Sim()
    sim.config(config(rate_limit_per_s=1.0))
    for n in range(10):
        sim.new(delivery(n))
    start = sum(sim.passes.values())
    sim.advance(T0 + 5_000)
    sent = sum(sim.requests.values())
    assert 5 <= sent <= 7  # 1 request/s (plus the full bucket's first token)
    passes = sum(sim.passes.values()) - start
    assert passes <= 3 * sent + 5, f"{passes} passes for {sent} sends in 5 s"
    assert sim.wakes["ep_1"] is not None and sim.wakes["ep_1"][1] == "rate limit refill"


def test_an_open_breaker_with_a_backlog_wakes_for_its_probe_only() -> None:
    sim = Sim()
    sim.config(config())
    sim.answer["ep_1"] = HttpResult(None, ErrorClass.TLS)  # fast failures: opens after two
    for n in range(30):
        sim.new(delivery(n))
    sim.answer_all("ep_1")
    drv = sim.driver("ep_1")
    assert drv.breaker.state is brk.CircuitState.OPEN
    start = sum(sim.passes.values())
    sim.advance(T0 + 10_000)
    assert sum(sim.passes.values()) - start <= 3
    assert sim.wakes["ep_1"] is not None
    at, reason = sim.wakes["ep_1"]
    assert reason == "breaker probe" and at == drv.breaker.open_until_ms


# -- defect 2: a re-enabled endpoint drains at once ------------------------------------------------


def test_deliveries_held_while_disabled_go_as_soon_as_the_endpoint_is_enabled() -> None:
    sim = Sim()
    sim.config(config(status=EndpointStatus.DISABLED))
    for n in range(5):
        sim.new(delivery(n))
    sim.advance(T0 + 60_000)
    assert sum(sim.requests.values()) == 0
    assert sim.wakes["ep_1"] == (T0 + DAY_MS, "deadline")  # no polling while disabled
    sim.config(config(version=2))
    assert sum(sim.requests.values()) == 5  # in the same pass as the config


def test_an_endpoint_awaiting_verification_is_sent_what_it_holds() -> None:
    """Fan-out routes only the challenge to such an endpoint; the dispatcher must send it (it
    would hold it like a disabled endpoint's deliveries, and the challenge could never be answered)."""
    sim = Sim()
    sim.config(config(status=EndpointStatus.PENDING_VERIFICATION))
    sim.new(delivery(0))
    sim.advance(T0 + 1_000)
    assert sum(sim.requests.values()) == 1


def test_an_unreadable_config_holds_the_endpoint_until_a_readable_one_replaces_it() -> None:
    sim = Sim()
    sim.config(config())
    drv = sim.driver("ep_1")
    drv.refuse_config("KeyError: 'url'")  # it may have changed the URL or the keys: send nothing
    assert sim.stores["ep_1"].config().refused == "KeyError: 'url'"  # kept in keyed state
    for n in range(3):
        sim.new(delivery(n))
    sim.advance(T0 + 60_000)
    assert sum(sim.requests.values()) == 0
    sim.config(config())  # the control plane republishes the same version, readable this time
    assert sum(sim.requests.values()) == 3


def test_clearing_a_410_mark_with_a_new_config_drains_the_endpoint() -> None:
    sim = Sim()
    sim.config(config())
    sim.answer["ep_1"] = HttpResult(410)
    sim.new(delivery(0))
    sim.answer_all("ep_1")
    assert sim.driver("ep_1").gone_at == 1
    sim.new(delivery(1))
    assert sim.requests["dlv_ep_1_1"] == 0
    sim.answer["ep_1"] = HttpResult(200)
    sim.config(config(version=2))
    assert sim.requests["dlv_ep_1_1"] == 1


# -- defect 3: a manual replay to an endpoint that cannot be sent to ends visibly -------------------


def test_a_manual_replay_to_a_disabled_endpoint_ends_not_sent_within_its_wait() -> None:
    sim = Sim()
    sim.config(config())
    sim.new(delivery(0))
    sim.answer_all("ep_1")
    assert sim.history["dlv_ep_1_0"].status == "succeeded"
    sim.config(config(version=2, status=EndpointStatus.DISABLED))
    sim.history_loader = None
    drv = sim.driver("ep_1")
    # the delivery left state when it succeeded: a replay loads it from history first
    out = drv.add_replay(ReplayRequest("dlv_ep_1_0", "t_1", "ep_1", "alice", sim.now, "req-1"), sim.now)
    assert out == "loading"
    d0 = delivery(0)
    drv.io_done("load", "dlv_ep_1_0", (d0, dsp.DurableRecord("succeeded", 1, None, False, 1)), None, sim.now)
    sim.run("ep_1")
    assert sim.wakes["ep_1"] == (sim.now + 60_000, "manual request wait")
    passes = sim.passes["ep_1"]
    sim.advance(sim.now + 120_000)
    assert sim.passes["ep_1"] - passes <= 3
    assert sim.requests["dlv_ep_1_0"] == 1  # only the original request
    rows = sim.history["dlv_ep_1_0"].rows
    assert rows[2] == "not_sent"  # the manual request's own attempt row, with a reason
    assert sim.history["dlv_ep_1_0"].status == "succeeded"
    assert "dlv_ep_1_0" not in drv.items and sim.counts["manual_not_sent"] == 1


# -- defect 4: tenant slots never leak --------------------------------------------------------------


def test_a_slot_granted_to_an_endpoint_that_becomes_unsendable_goes_back() -> None:
    sim = Sim(pool=8, quota=1)
    sim.config(config("ep_a"))
    sim.config(config("ep_b"))
    sim.new(delivery(0, "ep_a"))  # takes the tenant's only slot
    sim.new(delivery(0, "ep_b"))  # waits for it: files a ticket
    assert sim.requests["dlv_ep_b_0"] == 0
    sim.answer_all("ep_a")  # the slot frees and is granted to ep_b's ticket ...
    sim.scheduler.grant(sim.now)
    assert sim.scheduler.has_grant("ep_b")
    sim.config(config("ep_b", version=2, status=EndpointStatus.DISABLED))  # ... which cannot use it
    sim.slots_conserved()
    assert not sim.scheduler.has_grant("ep_b") and sim.scheduler.in_flight_total() == 0
    sim.new(delivery(1, "ep_a"))  # a healthy endpoint of the same tenant is not starved
    assert sim.requests["dlv_ep_a_1"] == 1
    sim.slots_conserved()


def test_no_slot_is_asked_for_while_the_breaker_or_bucket_would_refuse() -> None:
    sim = Sim(pool=8, quota=1)
    sim.config(config("ep_a", rate_limit_per_s=0.001))  # one token, then ~17 min per token
    sim.config(config("ep_b"))
    sim.new(delivery(0, "ep_a"))
    sim.answer_all("ep_a")
    sim.new(delivery(1, "ep_a"))  # bucket empty: must not hold a ticket or a slot
    assert sim.scheduler.waiting_count() == 0
    sim.new(delivery(0, "ep_b"))
    assert sim.requests["dlv_ep_b_0"] == 1
    sim.slots_conserved()


# -- defect 5: an internal error holds one endpoint, not the job ------------------------------------


def test_a_bad_signing_key_holds_that_endpoint_and_others_flow() -> None:
    sim = Sim()
    sim.config(config("ep_bad"))
    sim.config(config("ep_ok"))
    sim.hold_storage = False
    drv = sim.driver("ep_bad")
    sim.new(delivery(0, "ep_bad"))
    # the adapter could not decrypt the key: the request never left
    sends = sim.sends.pop("ep_bad")
    assert len(sends) == 1
    sim.requests["dlv_ep_bad_0"] -= 1
    sim.sent_numbers["dlv_ep_bad_0"].pop()
    drv.send_not_started("dlv_ep_bad_0", "signing key v1 does not decrypt", sim.now)
    sim.run("ep_bad")
    assert drv.in_flight == 0 and sim.scheduler.in_flight_total() == 0
    assert sim.wakes["ep_bad"] == (T0 + 1_000, "hold after internal error ends")
    sim.new(delivery(0, "ep_ok"))
    assert sim.requests["dlv_ep_ok_0"] == 1
    # a new config (rotated key) releases the hold at once; the same intent is used
    sim.config(config("ep_bad", version=2))
    assert sim.requests["dlv_ep_bad_0"] == 1 and sim.sent_numbers["dlv_ep_bad_0"] == [1]


def test_repeated_internal_errors_back_off() -> None:
    sim = Sim()
    drv = sim.driver("ep_1")
    periods = []
    for _ in range(12):
        drv.hold(sim.now, "boom")
        periods.append(drv.held_until_ms - sim.now)
    assert periods[:4] == [1_000, 2_000, 4_000, 8_000] and periods[-1] == POLICY.hold_max_ms


# -- defect 6: after a crash only what was in flight is sent again, each with its own row ------------


def test_an_event_republished_after_the_dedupe_window_is_checked_not_resent() -> None:
    """Fan-out's dedupe state expires; a record of an event re-published after it
    (a relay re-snapshot, a replayed topic) arrives with a fresh Kafka time, so only the event's
    own time says it may be old. It was sent again with attempt number 1 -- a second request
    whose row overwrote nothing, so history no longer explained it (found on the real stack)."""
    sim = Sim(policy=replace(POLICY, dedupe_window_ms=3_600_000))
    sim.config(config())
    sim.new(delivery(1))
    sim.answer_all("ep_1")
    assert sim.history["dlv_ep_1_1"].status == "succeeded"
    sim.now += 3_600_001  # past the window: fan-out no longer remembers the event
    again = replace(delivery(1, created=sim.now), event=delivery(1).event)  # new Kafka time, same event
    sim.new(again)
    sim.answer_all("ep_1")
    assert sim.requests["dlv_ep_1_1"] == 1
    assert sim.counts["final_not_resent"] == 1


def test_an_old_event_seen_first_is_checked_then_sent() -> None:
    sim = Sim(policy=replace(POLICY, dedupe_window_ms=3_600_000))
    sim.config(config())
    sim.now += 2 * 3_600_000
    sim.new(replace(delivery(1, created=sim.now), event=delivery(1).event))  # a backfill of old events
    assert sim.answer_all("ep_1") == 1 and sim.history["dlv_ep_1_1"].status == "succeeded"


def test_a_restore_does_not_resend_what_history_shows_final_and_numbers_go_on() -> None:
    sim = Sim()
    sim.config(config())
    for n in range(20):
        sim.new(delivery(n))
    checkpoint = {ep: _copy_store(s) for ep, s in sim.stores.items()}  # every delivery just PERSISTed
    sim.answer_all("ep_1")  # 8 (the endpoint's cap) answered and recorded ...
    sim.answer_all("ep_1")  # ... 8 more; 4 left in flight at the crash
    in_flight = {s.p.delivery_id for s in sim.sends["ep_1"]}
    assert len(in_flight) == 4
    # crash: memory and I/O gone, keyed state back to the checkpoint, the topic re-read from it
    sim.stores = checkpoint
    sim.drivers, sim.sends = {}, {}
    sim.scheduler = FairScheduler(pool_size=64, tenant_quota=64)
    sim.policy = replace(POLICY, check_created_before_ms=sim.now + 5_000)
    before = Counter(sim.requests)
    for n in range(20):
        sim.new(delivery(n))  # fan-out re-emits them (arrived before the restore)
    sim.advance(sim.now + 1)  # restored entries are checked once due, a cap's worth at a time
    sim.answer_all("ep_1")
    resent = {did for did in sim.requests if sim.requests[did] > before[did]}
    assert resent == in_flight  # the duplicates are exactly what was in flight
    for did, h in sim.history.items():
        assert h.status == "succeeded"
        assert len(h.rows) >= sim.requests[did]  # history explains every duplicate
        assert len(set(sim.sent_numbers[did])) == len(sim.sent_numbers[did])  # numbers never reused
    # every adopted entry found final was counted (re-emitted copies that arrived after their
    # entry was dropped are checked and counted again)
    assert sim.counts["final_not_resent"] >= 16


def _copy_store(s: InMemoryEndpointStore) -> InMemoryEndpointStore:
    c = InMemoryEndpointStore()
    c.pending, c.cfg, c.breaker_state = dict(s.pending), s.cfg, s.breaker_state
    c.bucket_state, c.gone, c.replay_requests = s.bucket_state, s.gone, dict(s.replay_requests)
    c.request_ids = dict(s.request_ids)
    c.spilled, c.spill_head_tail = dict(s.spilled), s.spill_head_tail
    c.retry_queue, c.retry_bucket_index = dict(s.retry_queue), dict(s.retry_bucket_index)
    return c


# -- defect 7: a delivery already final is not sent again when re-created ---------------------------


def test_a_recreated_old_delivery_is_checked_and_not_resent() -> None:
    sim = Sim()
    sim.config(config())
    old = delivery(0, created=T0 - 2 * 3600_000)  # re-read after it left state
    sim.history[old.delivery_id] = Durable(status="succeeded", attempt_count=1, auto=False, rows={1: "succeeded"})
    sim.new(old)
    assert sim.requests[old.delivery_id] == 0
    assert sim.history[old.delivery_id].status == "succeeded"
    assert old.delivery_id not in sim.driver("ep_1").items


@pytest.mark.parametrize(("durable", "requests", "status"), [
    # reconciliation redrives a fresh delivery: what Cassandra says decides, whatever its age
    (Durable(status="succeeded", attempt_count=1, auto=False, rows={1: "succeeded"}), 0, "succeeded"),
    (Durable(status="failed", attempt_count=3, auto=False, rows={1: "retry", 2: "retry", 3: "failed"}), 0,
     "failed"),
    (None, 1, "succeeded"),  # no row at all: persisted, then sent
    (Durable(status="pending", attempt_count=1, next_attempt_at_ms=T0, rows={1: "retry"}), 1, "succeeded"),
])
def test_a_redriven_fresh_delivery_is_checked_first(durable: Durable | None, requests: int, status: str) -> None:
    sim = Sim()
    sim.config(config())
    d = delivery(0)  # created now: without recheck it would be sent at once, unchecked
    before = max(durable.rows) if durable is not None and durable.rows else 0
    if durable is not None:
        sim.history[d.delivery_id] = durable
    sim.new(d, recheck=True)
    sim.answer_all("ep_1")
    assert sim.requests[d.delivery_id] == requests
    assert sim.history[d.delivery_id].status == status
    if requests:  # numbering goes on after the attempts already recorded
        assert max(sim.history[d.delivery_id].rows) == before + 1


def test_a_fresh_delivery_does_not_pay_for_a_check() -> None:
    sim = Sim()
    sim.config(config())
    sim.new(delivery(0))
    assert sim.requests["dlv_ep_1_0"] == 1 and sim.counts["final_not_resent"] == 0


# -- defect 8: never send with a config older than the one fan-out matched ----------------------------


def test_a_delivery_waits_for_the_config_version_it_was_fanned_out_with() -> None:
    sim = Sim()
    sim.config(config(version=1, url="https://old.example.com/x"))
    sim.new(delivery(0, version=2))
    assert sim.requests["dlv_ep_1_0"] == 0
    assert sim.wakes["ep_1"] == (T0 + DAY_MS, "deadline")  # the config's arrival drives it
    sim.config(config(version=2, url="https://new.example.com/x"))
    assert sim.requests["dlv_ep_1_0"] == 1
    sent = sim.sends["ep_1"][0]
    assert sent.config.url == "https://new.example.com/x"


# -- defect 9: replays are checked, attributed and deduplicated --------------------------------------


def test_a_forged_replay_for_another_tenants_delivery_is_refused() -> None:
    sim = Sim()
    sim.config(config("ep_b", tenant="t_b"))
    drv = sim.driver("ep_b")
    # routed to ep_b by its key, but the delivery belongs to ep_a of tenant t_a
    assert drv.add_replay(ReplayRequest("dlv_ep_a_0", "t_b", "ep_b", "mallory", sim.now, "r1"), sim.now) == "loading"
    other = delivery(0, "ep_a", tenant="t_a")
    drv.io_done("load", "dlv_ep_a_0", (other, dsp.DurableRecord("succeeded", 1, None, False, 1)), None, sim.now)
    sim.run("ep_b")
    assert sim.requests["dlv_ep_a_0"] == 0 and sim.counts["replays_refused"] == 1 and not drv.items
    # a record whose key and endpoint disagree is refused before anything is loaded
    assert drv.add_replay(ReplayRequest("dlv_ep_a_0", "t_b", "ep_a", "mallory", sim.now, "r2"), sim.now) == "refused"


def test_a_replay_of_a_held_delivery_by_another_tenant_is_refused() -> None:
    sim = Sim()
    sim.config(config(status=EndpointStatus.DISABLED))
    sim.new(delivery(0))
    out = sim.replay(ReplayRequest("dlv_ep_1_0", "t_other", "ep_1", "mallory", sim.now, "r1"))
    assert out == "refused" and not sim.driver("ep_1").items["dlv_ep_1_0"].manual


def test_replays_are_deduplicated_by_request_id_and_attributed() -> None:
    sim = Sim()
    sim.config(config())
    sim.answer["ep_1"] = HttpResult(500)
    sim.new(delivery(0))
    sim.answer_all("ep_1")  # attempt 1 failed; the next automatic try is seconds away
    r = ReplayRequest("dlv_ep_1_0", "t_1", "ep_1", "alice@t_1", sim.now, "req-9")
    assert sim.replay(r) == "queued"
    assert sim.replay(r) == "duplicate"  # the replays topic delivered it twice
    assert sim.requests["dlv_ep_1_0"] == 2
    manual = sim.sends["ep_1"][0]
    assert manual.p.sending_manual is not None and manual.p.sending_manual.requested_by == "alice@t_1"
    sim.answer_all("ep_1")
    p = sim.driver("ep_1").items["dlv_ep_1_0"]
    assert p.attempt_count == 1  # the manual try did not use the automatic budget
    assert p.auto_retry_active


# -- defect 11: expiry does not wait for sends ------------------------------------------------------


def test_an_open_breaker_backlog_past_its_deadline_expires_without_probes() -> None:
    sim = backlog_behind_open_breaker(2_000)
    sim.answer["ep_1"] = HttpResult(503)  # every probe fails: the breaker stays open
    sim.advance(T0 + DAY_MS + 1_000)
    statuses = Counter(h.status for h in sim.history.values())
    assert statuses["expired"] == 2_000 - statuses["failed"]
    assert not sim.driver("ep_1").items
    assert sum(sim.requests.values()) < 200  # a probe now and then, not a send per expiry


# -- wake reasons -----------------------------------------------------------------------------------


def test_waiting_for_a_slot_backs_off_with_jitter_unless_next_in_line() -> None:
    sim = Sim(pool=1, quota=1)
    for ep in ("ep_a", "ep_b", "ep_c"):
        sim.config(config(ep))
        sim.new(delivery(0, ep))  # ep_a takes the slot; ep_b's ticket is the tenant's oldest
    waits = []
    for _ in range(8):
        at, reason = sim.wakes["ep_c"]  # type: ignore[misc]
        assert reason == "waiting for a tenant or pool slot"
        waits.append(at - sim.now)
        sim.now = at
        sim.run("ep_c")
    assert waits[0] <= 10 and 500 <= waits[-1] <= 1_000
    at, reason = sim.wakes["ep_b"]  # type: ignore[misc]
    assert reason == "next in line for a tenant or pool slot" and at <= T0 + sim.scheduler.grant_pickup_ms
    sim.slots_conserved()


# -- the stored form --------------------------------------------------------------------------------


def test_the_stored_form_round_trips_and_is_small() -> None:
    import pickle

    from core.endpoint_store import decode, encode

    p = dsp.Pending(delivery=delivery(3), stage=dsp.Stage.READY, attempt_count=2, issued=3,
                    next_attempt_at_ms=T0 + 5_000, manual=(dsp.ManualRequest("r1", "alice", T0, "t_1"),))
    back = decode(encode(p), "ep_1", p.delivery_id)
    assert back == replace(p, delivery=replace(p.delivery, event=replace(p.delivery.event, payload=b"")))
    # a manual request being sent stays owed in state until its record is durable
    sending = dsp.start_sending(replace(p, intent=dsp.Intent(4, "a-4")))
    assert decode(encode(sending), "ep_1", p.delivery_id).manual == p.manual
    assert len(pickle.dumps(encode(p), protocol=pickle.HIGHEST_PROTOCOL)) < 300


def test_an_entry_stored_before_ordering_keys_is_read_and_takes_a_skip() -> None:
    from core.endpoint_store import STORED_V1, decode, encode, with_manual, with_skip

    p = dsp.Pending(delivery=delivery(3), stage=dsp.Stage.READY, attempt_count=1, issued=1,
                    manual=(dsp.ManualRequest("r1", "alice", T0, "t_1"),))
    v1 = (STORED_V1, *encode(p)[1:-2])  # the shape savepoints of earlier versions hold
    back = decode(v1, "ep_1", p.delivery_id)
    assert back.delivery.ordering_key == "" and back.skip is None and back.manual == p.manual
    skip = dsp.ManualRequest("s1", "ops", T0, "t_1")
    assert decode(with_skip(v1, skip), "ep_1", p.delivery_id).skip == skip
    more = dsp.ManualRequest("r2", "bob", T0, "t_1")
    assert decode(with_manual(v1, (more,)), "ep_1", p.delivery_id).manual == (*p.manual, more)


def test_a_restored_backlog_behind_an_open_breaker_is_read_back_lazily() -> None:
    """A restore must not read every pending delivery's record before anything else
    (a 50,000 backlog took ~100 s of Cassandra reads while healthy endpoints waited)."""
    sim = backlog_behind_open_breaker(1_000)
    sim.restore()
    checks = sim.watch(Check)
    sim.run("ep_1")
    assert checks == [] and len(sim.driver("ep_1").items) == 1_000  # nothing read while the breaker is open
    probe_at = sim.driver("ep_1").breaker.open_until_ms
    assert probe_at is not None
    sim.answer["ep_1"] = HttpResult(503)
    before = sum(sim.requests.values())
    sim.advance(probe_at)
    assert len(checks) == 1 and sum(sim.requests.values()) == before + 1  # one record read, one probe


# -- a backlog beyond the memory window waits in keyed state ------------------------------

WINDOW = replace(POLICY, memory_window=50, page_size=10)




def test_a_backlog_beyond_the_window_leaves_memory_and_the_pending_map() -> None:
    sim = backlog_behind_open_breaker(1_000, WINDOW)
    drv, store = sim.driver("ep_1"), sim.stores["ep_1"]
    # the window bounds fresh work: the two attempts that opened the breaker are retries
    assert len(drv._fresh) <= WINDOW.memory_window + 1 and len(drv.items) <= 2 * WINDOW.memory_window
    assert set(store.pending) == set(drv.items)  # a restore reads the window back, not the backlog
    assert drv.spilled == len(store.spilled) == 1_000 - len(drv.items)
    assert sim.counts["spilled"] == drv.spilled


def test_the_queue_drains_in_arrival_order_with_its_reserved_intents_once_the_endpoint_recovers() -> None:
    sim = backlog_behind_open_breaker(1_000, WINDOW)
    reserves = sim.watch(Reserve, Check)
    sim.answer["ep_1"] = HttpResult(200)
    first_sent: dict[str, int] = {}
    for _ in range(2_000):
        while sim.answer_all("ep_1"):  # the receiver answers what is in flight (the adapter polls it)
            pass
        sim.advance(sim.now + 60_000)
        for did in sim.requests:
            first_sent.setdefault(did, len(first_sent))
        if all(h.status == "succeeded" for h in sim.history.values()):
            break
    assert len(sim.history) == 1_000 and all(h.status == "succeeded" for h in sim.history.values())
    drv = sim.driver("ep_1")
    assert not drv.items and drv.spilled == 0 and not sim.stores["ep_1"].spilled
    assert reserves == []  # spilled by this incarnation: sent with the intent reserved at persist
    # each delivery: one request that succeeded (a few more for those tried before the breaker opened)
    assert sum(sim.requests.values()) <= 1_000 + BREAKER.failure_threshold + 20
    queued = [f"dlv_ep_1_{i}" for i in range(1_000) if f"dlv_ep_1_{i}" in first_sent]
    order = [first_sent[did] for did in queued[-900:]]  # the queue's part: first sent in arrival order
    assert order == sorted(order)


def test_a_restored_queue_is_read_back_a_page_at_a_time_and_checked_before_sending() -> None:
    sim = backlog_behind_open_breaker(600, WINDOW)
    spilled_before = sim.driver("ep_1").spilled
    sim.restore()
    checks = sim.watch(Check)
    sim.run("ep_1")
    drv = sim.driver("ep_1")
    assert drv.spilled == spilled_before and len(drv._fresh) <= WINDOW.memory_window + 1
    sim.answer["ep_1"] = HttpResult(200)
    for _ in range(2_000):
        while sim.answer_all("ep_1"):
            pass
        sim.advance(sim.now + 60_000)
        if all(h.status == "succeeded" for h in sim.history.values()):
            break
    assert all(h.status == "succeeded" for h in sim.history.values())
    assert len(set(checks)) == 600  # every restored delivery, queued or not, read its record first


def test_a_queued_delivery_past_its_deadline_expires_while_the_breaker_stays_open() -> None:
    sim = backlog_behind_open_breaker(400, WINDOW)
    sim.advance(T0 + DAY_MS + 1)
    for _ in range(100):
        sim.advance(sim.now + 1_000)
    drv = sim.driver("ep_1")
    assert drv.spilled == 0 and not drv.items
    assert {h.status for h in sim.history.values()} == {"expired"}


def test_a_spilled_delivery_replayed_and_finished_is_not_sent_again_from_the_queue() -> None:
    sim = backlog_behind_open_breaker(300, WINDOW)
    drv = sim.driver("ep_1")
    queued = sorted(sim.stores["ep_1"].spilled_ids())[0]
    h = sim.history[queued]
    h.status, h.auto = "succeeded", False  # say a person's replay loaded it and it succeeded
    drv._superseded.add(queued)  # what _finish_load records for a delivery it may have queued
    sim.answer["ep_1"] = HttpResult(200)
    for _ in range(2_000):
        while sim.answer_all("ep_1"):
            pass
        sim.advance(sim.now + 60_000)
        if not drv.items and not drv.spilled:
            break
    assert not drv.items and not drv.spilled
    assert sim.requests[queued] == 0


def test_after_a_long_consumer_lag_new_deliveries_still_wait_in_the_queue() -> None:
    """Deliveries that reach the dispatcher more than fresh_window_ms after their Kafka time (a
    job catching up after an outage) are CHECKed like re-creations; once the check finds they
    were never persisted they are fresh, and must queue behind the backlog, not fill memory."""
    sim = backlog_behind_open_breaker(200, WINDOW)
    drv = sim.driver("ep_1")
    queued = drv.spilled
    late = sim.now - WINDOW.fresh_window_ms - 60_000
    for i in range(1_000, 1_300):
        drv.add_new(delivery(i, created=late), sim.now)
        sim.run("ep_1")
    assert drv.spilled == queued + 300
    assert len(drv._fresh) <= WINDOW.memory_window + 1 and not drv._superseded


def test_a_restored_backlog_is_read_ahead_of_the_sends_while_the_breaker_is_closed() -> None:
    """One record read per granted slot drained a restored backlog at ~270/s (read +
    reserve + request latency per slot). With the breaker closed, reads run up to four times the
    endpoint's cap ahead of the sends; a probing breaker still reads only what it may send."""
    sim = Sim()
    sim.config(config())
    sim.hold_storage = True  # the checkpoint holds 500 deliveries, none sent yet
    for n in range(500):
        sim.driver("ep_1").add_new(delivery(n), sim.now)
    sim.restore()
    sim.hold_storage = False
    drv = sim.driver("ep_1")
    drv.step(sim.now, 1024)  # due restored work: marked to be read
    reads = [a for a in drv.step(sim.now, 1024).actions if isinstance(a, Check)]
    assert len(reads) == 4 * POLICY.default_max_in_flight


# -- what the operator exports ------------------------------------------------------------


def test_attempts_are_counted_by_status_class_and_first_attempts_by_latency_bucket() -> None:
    sim = Sim()
    sim.config(config())
    sim.now = T0 + 700  # the event arrived 700 ms ago
    sim.new(delivery(1))
    sim.answer_all("ep_1", HttpResult(503))
    sim.advance(T0 + 3_600_000, answer=False)
    sim.answer_all("ep_1", HttpResult(200))
    c = sim.counts
    assert (c["attempts_by_class:5xx"], c["attempts_by_class:2xx"], c["attempts"]) == (1, 1, 2)
    # One first attempt, 700 ms after arrival: in every bucket from 1,000 ms up, none below.
    assert [c[f"first_attempt_latency_ms:{le}"] for le in ("500", "1000", "10000", "inf")] == [0, 1, 1, 1]


def test_the_gauge_view_sees_new_retry_and_a_parked_endpoint() -> None:
    sim = backlog_behind_open_breaker(5)
    drv = sim.driver("ep_1")
    view = drv.view(sim.now, DAY_MS)
    assert view.parked and view.breaker is brk.CircuitState.OPEN
    assert sum(p.attempted for p in view.pending) >= 2  # the failures that opened it wait as retries
    sim.config(config(status=EndpointStatus.DISABLED, version=2))
    assert sim.driver("ep_1").view(sim.now, DAY_MS).parked


def test_throttling_is_counted_where_it_happens() -> None:
    sim = Sim(pool=64, quota=1)
    sim.config(config(rate_limit_per_s=1.0))
    sim.config(config("ep_2"))
    for n in range(3):
        sim.new(delivery(n))
    assert sim.counts["throttled_rate_limit"] >= 1  # the one token went; the bucket is empty
    sim.new(delivery(9, "ep_2"))  # same tenant, its single slot held by ep_1's request
    assert sim.counts["throttled_slots"] >= 1


# -- defects found by simulating the driver and the adapter ----------------------------------


def _wait_until_backed_off(sim: Sim, ep: str, until: int) -> None:
    """Let ``ep`` wake on its slot back-off (nothing answered meanwhile) until ``until``."""
    while True:
        w = sim.wakes[ep]
        assert w is not None and "for a tenant or pool slot" in w[1]
        if w[0] > until:
            return
        sim.now = w[0]
        sim.run(ep)


def test_a_slot_freed_or_granted_while_an_endpoint_waits_is_used_within_the_pickup_interval() -> None:
    sim = Sim(pool=1, quota=1)
    for ep in ("ep_a", "ep_b", "ep_c"):
        sim.config(config(ep, tenant=f"t_{ep}"))
    sim.new(delivery(0, "ep_a", tenant="t_ep_a"))  # takes the pool's only slot
    sim.new(delivery(0, "ep_b", tenant="t_ep_b"))  # waits for it, the oldest ticket
    sim.new(delivery(1, "ep_a", tenant="t_ep_a"))
    _wait_until_backed_off(sim, "ep_b", T0 + 3_000)  # long past the first, short back-offs
    sim.now = T0 + 3_000
    # ep_a's request finishes: its pass asks for a slot for its next delivery, and the scheduler
    # grants the freed slot to ep_b's older ticket; nothing but ep_b's own timer wakes ep_b.
    sim.answer_all("ep_a")
    assert sim.scheduler.has_grant("ep_b")
    pickup = sim.scheduler.grant_pickup_ms
    sim.advance(sim.now + pickup, answer=False)
    assert sim.requests["dlv_ep_b_0"] == 1  # was: idle until ep_b's back-off (up to 1 s) ended
    sim.slots_conserved()


def test_retries_taken_without_contention_leave_the_share_kept_for_new_work() -> None:
    patient = replace(POLICY, breaker=brk.BreakerConfig(failure_threshold=100, fast_failure_threshold=100,
                                                        open_s=30.0, max_open_s=600.0))
    sim = Sim(pool=10, quota=10, policy=patient)
    sim.config(config("ep_a", tenant="t_a", max_in_flight=16))
    sim.config(config("ep_b", tenant="t_b"))
    sim.answer["ep_a"] = HttpResult(500)
    for i in range(10):
        sim.new(delivery(i, "ep_a", tenant="t_a"))
    sim.answer_all("ep_a")
    sim.now = T0 + 600_000  # every retry due at once, nobody else waiting
    sim.run("ep_a")
    assert len(sim.sends["ep_a"]) == 9  # was 10: the whole pool
    sim.new(delivery(0, "ep_b", tenant="t_b", created=sim.now))
    assert sim.requests["dlv_ep_b_0"] == 1  # new work finds the headroom
    sim.slots_conserved()


def test_a_manual_replay_waits_for_an_open_breaker_and_ends_not_sent_if_it_stays_open() -> None:
    policy = replace(POLICY, breaker=brk.BreakerConfig(failure_threshold=5, fast_failure_threshold=2,
                                                       open_s=120.0, max_open_s=600.0))
    sim = Sim(policy=policy)
    sim.config(config())
    sim.answer["ep_1"] = HttpResult(None, ErrorClass.TLS)  # fast failures: opens after two
    for n in range(3):
        sim.new(delivery(n))
        sim.answer_all("ep_1")
    drv = sim.driver("ep_1")
    assert drv.breaker.state is brk.CircuitState.OPEN
    sent = sum(sim.requests.values())
    assert sim.replay(ReplayRequest("dlv_ep_1_0", "t_1", "ep_1", "alice", sim.now, "req-1")) == "queued"
    assert sum(sim.requests.values()) == sent  # was: sent through the open breaker
    sim.advance(sim.now + 61_000)  # the breaker stays open past the request's 60 s wait
    assert sum(sim.requests.values()) == sent
    assert sim.counts["manual_not_sent"] == 1
    assert "not_sent" in sim.history["dlv_ep_1_0"].rows.values()


def test_a_replay_whose_load_keeps_failing_backs_off_and_is_kept() -> None:
    sim = Sim()
    sim.config(config())
    drv = sim.driver("ep_1")
    assert drv.add_replay(ReplayRequest("dlv_ep_1_0", "t_1", "ep_1", "alice", sim.now, "req-1"), sim.now) == "loading"
    loads = 0
    end = sim.now + 6 * 3600 * 1000
    while True:
        dec = drv.step(sim.now, 1024)
        for a in dec.actions:
            assert isinstance(a, Load)
            loads += 1
            drv.io_done("load", a.delivery_id, None, RuntimeError("history unavailable"), sim.now)
        if dec.actions:
            continue  # the finished load drives the next pass
        assert dec.wake is not None
        if dec.wake.at_ms > end:
            break
        sim.now = dec.wake.at_ms
    assert loads <= 6 * 12 + 10, loads  # was 21,601 in 6 h: one a second
    assert drv.store.replays()  # the person's request is kept: it ends with its own attempt row
    sim.now = dec.wake.at_ms  # history answers again
    dec = drv.step(sim.now, 1024)
    (load,) = dec.actions
    drv.io_done("load", "dlv_ep_1_0", (delivery(0), dsp.DurableRecord("succeeded", 1, None, False, 1)), None, sim.now)
    sim.run("ep_1")
    assert sim.requests["dlv_ep_1_0"] == 1  # the manual attempt



class _CountingItems(dict[str, Any]):
    """The driver's items, counting lookups: how much of the held work one pass touches."""

    lookups = 0

    def __getitem__(self, key: str) -> Any:
        self.lookups += 1
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)


def test_a_pass_touches_the_oldest_manual_requests_not_all_of_them() -> None:
    sim = Sim()
    sim.config(config(max_in_flight=1))
    n = 2_000
    for i in range(n):
        sim.driver("ep_1").add_new(delivery(i), sim.now)
    sim.run("ep_1")  # one request in flight (the cap), the rest wait
    for i in range(n):
        sim.driver("ep_1").add_replay(ReplayRequest(f"dlv_ep_1_{i}", "t_1", "ep_1", "alice", sim.now + i,
                                                    f"req-{i}"), sim.now + i)
    sim.run("ep_1")
    drv = sim.driver("ep_1")
    assert len(drv._manual) >= n - 1
    drv.items = _CountingItems(drv.items)
    sim.now += n
    sim.run("ep_1")
    assert drv.items.lookups < 100, drv.items.lookups  # was a lookup (and a sort) over every waiting request
    (first,) = sim.requests  # the one automatic request in flight
    sim.answer_all("ep_1")  # the slot frees: the oldest waiting manual request goes
    oldest, nxt = [f"dlv_ep_1_{i}" for i in range(n) if f"dlv_ep_1_{i}" != first][:2]
    assert sim.requests[oldest] == 1 and sim.requests[nxt] == 0


def test_fresh_deliveries_are_not_starved_by_a_memory_full_of_retries() -> None:
    patient = replace(WINDOW, breaker=brk.BreakerConfig(failure_threshold=1000, fast_failure_threshold=1000,
                                                        open_s=30.0, max_open_s=600.0))
    sim = Sim(policy=patient)
    sim.config(config())
    for i in range(50):  # deliveries the receiver keeps refusing, a window of them: retried for a day
        sim.answer_for[f"dlv_ep_1_{i}"] = HttpResult(500)
        sim.new(delivery(i))
        sim.answer_all("ep_1")
    drv = sim.driver("ep_1")
    assert len(drv.items) == 50
    for i in range(100, 120):  # fresh work the receiver accepts, arriving behind them
        sim.new(delivery(i, created=sim.now))
        sim.answer_all("ep_1")
    sim.advance(sim.now + 60_000)
    fresh = [f"dlv_ep_1_{i}" for i in range(100, 120)]
    assert all(sim.requests[did] == 1 for did in fresh), [sim.requests[did] for did in fresh]  # was: queued 23 h
    assert len(drv.items) <= 2 * patient.memory_window


def test_a_bulk_replay_beyond_a_minute_of_capacity_is_sent_not_timed_out() -> None:
    patient = replace(POLICY, breaker=brk.BreakerConfig(failure_threshold=10_000, fast_failure_threshold=10_000,
                                                        open_s=30.0, max_open_s=600.0))
    sim = Sim(policy=patient)
    sim.config(config(max_in_flight=300))
    sim.answer["ep_1"] = HttpResult(500)
    n = 300
    for i in range(n):
        sim.driver("ep_1").add_new(delivery(i), sim.now)
    sim.run("ep_1")
    sim.answer_all("ep_1")  # every delivery retries later
    sim.config(config(version=2, max_in_flight=2))  # two requests a second: 150 s for the lot
    for i in range(n):
        sim.driver("ep_1").add_replay(ReplayRequest(f"dlv_ep_1_{i}", "t_1", "ep_1", "ops", sim.now, f"r{i}"), sim.now)
    sim.run("ep_1")
    for _ in range(200):
        sim.advance(sim.now + 1_000, answer=False)
        sim.answer_all("ep_1")
    assert sim.counts["manual_not_sent"] == 0  # was: most of them, each 60 s wait counted from arrival
    assert all(not p.manual for p in sim.driver("ep_1").items.values())


def _versioned(n: int, version: int, created: int) -> NewDelivery:
    d = delivery(n, created=created)
    return replace(d, event=replace(d.event, object_id="inv_1", object_version=version), ordering_key="inv_1")


def test_a_replayed_older_delivery_does_not_become_the_head_of_its_key() -> None:
    patient = replace(POLICY, breaker=brk.BreakerConfig(failure_threshold=100, fast_failure_threshold=100,
                                                        open_s=30.0, max_open_s=600.0))
    sim = Sim(policy=patient)
    sim.config(config(ordering_key="object_id"))
    v1, v2 = _versioned(1, 1, T0), _versioned(2, 2, T0)
    sim.new(v1)
    sim.answer_all("ep_1")  # v1 succeeded: final, gone from memory
    sim.answer_for[v2.delivery_id] = HttpResult(500)
    sim.new(v2)
    sim.answer_all("ep_1")  # v2 is the head now, and retries
    drv = sim.driver("ep_1")
    assert drv._order.is_head(v2.delivery_id)
    assert drv.add_replay(ReplayRequest(v1.delivery_id, "t_1", "ep_1", "ops", sim.now, "r1"), sim.now) == "loading"
    drv.io_done("load", v1.delivery_id, (v1, dsp.DurableRecord("succeeded", 1, None, False, 1)), None, sim.now)
    sim.run("ep_1")
    assert drv._order.is_head(v2.delivery_id)  # was: the replayed v1 displaced it
    sim.answer_all("ep_1")  # v1's manual attempt
    v0 = _versioned(0, 0, sim.now)  # a late lower version waits behind the head that retries
    sim.new(v0)
    assert sim.requests[v0.delivery_id] == 0


def test_a_broker_clock_ahead_of_the_task_manager_does_not_delay_the_first_attempt() -> None:
    sim = Sim()
    sim.config(config())
    sim.new(delivery(0, created=sim.now + 7_000))  # Kafka's timestamp is 7 s ahead of this clock
    assert sim.requests["dlv_ep_1_0"] == 1  # was: sent 7 s later, at the broker's "now"


def test_a_delivery_whose_history_write_keeps_failing_is_given_up_a_bound_after_its_deadline() -> None:
    """Its outcome can never be recorded (a row Cassandra keeps refusing, a long outage): the
    driver retried the write for ever and held the delivery past its 24 h deadline. It gives up
    ``storage_give_up_ms`` after the deadline, counts it, and leaves the row -- still pending in
    history -- to reconciliation, which names it orphaned and redrives it (checked first)."""
    sim = Sim()
    sim.config(config())
    sim.answer["ep_1"] = HttpResult(503)
    d1, d2 = delivery(1), delivery(2)
    sim.new(d1)
    sim.new(d2)
    sim.answer_all("ep_1")
    sim.fail_writes.add(d1.delivery_id)
    drv = sim.driver("ep_1")
    give_up = d1.expires_at_ms + POLICY.storage_give_up_ms
    sim.advance(give_up - 61_000)
    assert d1.delivery_id in drv.items, "given up before its bound"
    assert sim.counts["history_write_failures"] > 0
    sim.advance(give_up + 61_000)
    assert d1.delivery_id not in drv.items
    assert d1.delivery_id not in sim.stores["ep_1"].pending
    assert sim.counts["expired_unrecorded"] == 1
    assert sim.history[d1.delivery_id].status == "pending", "left for reconciliation to find"
    # the endpoint's other delivery, whose writes worked, ended normally long before
    assert sim.history[d2.delivery_id].status in dsp.FINAL_STATUSES


def test_a_manual_request_that_cannot_be_built_ends_not_sent_after_its_wait_and_its_delivery_still_expires() -> None:
    """No signing key decrypts: each try is handed back (send_not_started) and the endpoint held
    for a doubling period. The request's wait restarted with each try, so it was tried for ever
    and the delivery it rode on -- out of the deadline index while a person's request is owed --
    never reached its deadline (found by the model-based test)."""
    sim = Sim()
    sim.config(config())
    sim.answer["ep_1"] = HttpResult(503)
    sim.new(delivery(0))
    sim.answer_all("ep_1")  # attempt 1 refused: a retry waits
    sim.unbuildable = True
    assert sim.replay(ReplayRequest("dlv_ep_1_0", "t_1", "ep_1", "alice", sim.now, "req-1")) == "queued"
    sim.advance(sim.now + POLICY.manual_wait_ms + POLICY.hold_max_ms)
    assert sim.counts["manual_not_sent"] == 1
    assert "not_sent" in sim.history["dlv_ep_1_0"].rows.values()
    sim.advance(T0 + DAY_MS + POLICY.hold_max_ms)
    assert sim.history["dlv_ep_1_0"].status == "expired"


def test_a_replay_of_a_delivery_long_past_its_deadline_is_not_given_up_at_its_first_failed_write() -> None:
    """The give-up bound counts from the first of an unbroken run of failures, not only from the
    deadline: a replayed old delivery is always past its deadline, and one failed write must not
    drop it and the person's request with it (found by the model-based test's bulk replays)."""
    sim = Sim()
    sim.config(config())
    d0 = delivery(0)
    sim.new(d0)
    sim.answer_all("ep_1")  # succeeded
    sim.advance(T0 + DAY_MS + 2 * POLICY.storage_give_up_ms)
    sim.fail_writes.add(d0.delivery_id)
    assert sim.replay(ReplayRequest(d0.delivery_id, "t_1", "ep_1", "alice", sim.now, "req-1")) == "loading"
    sim.fail_writes.clear()
    sim.advance(sim.now + 5_000)  # the reservation is retried and the request goes
    assert sim.counts["expired_unrecorded"] == 0
    assert sim.requests[d0.delivery_id] == 2


# A fresh delivery's first request, on an endpoint that answers it at once and has room in its
# in-flight cap, goes out within this of its arrival, whatever its memory and overflow queue hold
# (the slot back-off tops out at 1 s; page-ins ride on the passes finished requests drive).
FRESH_OBJECTIVE_MS = 1_000


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(window=st.integers(2, 8), refused_per_window=st.sampled_from([0, 0.5, 1, 1.5, 2, 3, 4, 6]),
       arrivals=st.lists(st.tuples(st.integers(1, 6), st.sampled_from([0, 10, 900, 7_000, 45_000])),
                         min_size=1, max_size=8))
def test_a_healthy_endpoints_fresh_delivery_goes_within_its_objective_whatever_the_overflow_queue_holds(
        window: int, refused_per_window: float, arrivals: list[tuple[int, int]]) -> None:
    """Property form of the overflow-queue starvation defect: deliveries the receiver keeps
    refusing (retried all day, never opening the breaker here) fill memory and the queue; fresh
    deliveries the receiver accepts arrive in bursts between them, and each is attempted within
    FRESH_OBJECTIVE_MS of its arrival -- however many retries there are: up to six windows' worth
    here (past twice the window, the retries due latest wait in the retry queue, not in memory;
    it held for at most 1.5 windows before, when memory kept every retry)."""
    refused = int(refused_per_window * window)
    patient = replace(WINDOW, memory_window=window, page_size=max(1, window // 2),
                      breaker=brk.BreakerConfig(failure_threshold=10**6, fast_failure_threshold=10**6,
                                                open_s=30.0, max_open_s=600.0))
    sim = Sim(policy=patient)
    sim.config(config(max_in_flight=64))
    for i in range(refused):
        sim.answer_for[f"dlv_ep_1_{i}"] = HttpResult(500)
        sim.new(delivery(i))
        sim.answer_all("ep_1")
    arrived: dict[str, int] = {}

    def receiver_answers_for(ms: int) -> None:  # the receiver answers each request within 50 ms
        end = sim.now + ms
        while sim.now < end:
            sim.advance(min(end, sim.now + 50))
            sim.answer_all("ep_1")

    n = 1_000
    for burst, gap in arrivals:
        receiver_answers_for(gap)
        for _ in range(burst):
            n += 1
            d = delivery(n, created=sim.now)
            arrived[d.delivery_id] = sim.now
            sim.new(d)
    receiver_answers_for(10_000)
    late = {did: sim.first_request_at.get(did, -1) - at for did, at in arrived.items()
            if sim.first_request_at.get(did, at + FRESH_OBJECTIVE_MS + 1) - at > FRESH_OBJECTIVE_MS}
    assert not late, f"fresh deliveries attempted late (ms after arrival, -1 = never): {late}"


# -- retries beyond memory wait in the retry queue (keyed state), by due time ------------------------

PATIENT = replace(WINDOW, memory_window=4, page_size=2,
                  breaker=brk.BreakerConfig(failure_threshold=10**6, fast_failure_threshold=10**6,
                                            open_s=30.0, max_open_s=600.0))
REFUSED = 40  # ten windows' worth of deliveries the receiver keeps refusing


def refusing(sim: Sim, n: int = REFUSED) -> list[str]:
    """``n`` deliveries to ep_1 that its receiver refuses (500) every time, arrived and tried once."""
    sim.config(config(max_in_flight=64))
    dids = []
    for i in range(n):
        sim.answer_for[f"dlv_ep_1_{i}"] = HttpResult(500)
        sim.new(delivery(i, created=sim.now))
        sim.answer_all("ep_1")
        dids.append(f"dlv_ep_1_{i}")
    return dids


def answering_for(sim: Sim, ms: int) -> None:
    """Time passes; the receiver answers each request within 50 ms."""
    end = sim.now + ms
    while sim.now < end:
        sim.advance(min(end, sim.now + 50))
        sim.answer_all("ep_1")


def test_retries_beyond_memory_wait_in_the_retry_queue_and_keep_their_schedule() -> None:
    sim = Sim(policy=PATIENT)
    refused = refusing(sim)
    fresh = 1_000
    for _ in range(20):  # fresh work keeps arriving: it takes memory from the retries due latest
        fresh += 1
        sim.new(delivery(fresh, created=sim.now))
        answering_for(sim, 15_000)
    drv, store = sim.driver("ep_1"), sim.stores["ep_1"]
    assert sim.counts["retries_queued"] > 0 and sim.counts["retries_paged_in"] > 0
    assert len(drv.items) <= 2 * PATIENT.memory_window
    assert set(store.pending) == set(drv.items)  # a restore reads memory back, not the retry queue
    assert drv.queued_retries == len(store.retry_queue) > 0
    assert all(sim.requests[f"dlv_ep_1_{i}"] == 1 for i in range(1_001, fresh + 1))
    for did in refused:
        times = sim.sent_at[did]
        assert len(times) > 2, f"{did} was not retried: {times}"
        for at, due in times[1:]:
            assert due is not None and due <= at <= due + 1_000, f"{did} sent at {at - T0}, due at {due - T0}"


def test_a_restored_retry_queue_is_read_back_by_due_time_and_checked_before_sending() -> None:
    sim = Sim(policy=PATIENT)
    refused = refusing(sim)
    answering_for(sim, 30_000)
    queued = sim.stores["ep_1"].queued_retry_ids()
    assert queued
    sim.restore()
    checks = sim.watch(Check)
    sim.run("ep_1")
    drv = sim.driver("ep_1")
    assert drv.queued_retries == len(queued)  # the index came back from keyed state
    sim.answer_for.clear()  # the receiver recovers
    for _ in range(200):
        answering_for(sim, 60_000)
        if all(sim.history[did].status == "succeeded" for did in refused):
            break
    assert all(sim.history[did].status == "succeeded" for did in refused)
    assert queued <= set(checks)  # each queued before the crash read its record first
    for did in refused:
        assert len(set(sim.sent_numbers[did])) == len(sim.sent_numbers[did])  # numbers never reused
        assert all(due is None or at >= due for at, due in sim.sent_at[did])  # never before its back-off
    assert not drv.items and not drv.queued_retries and not sim.stores["ep_1"].retry_queue
    assert not sim.stores["ep_1"].retry_bucket_index


def test_queued_retries_of_a_disabled_endpoint_expire_by_their_deadline() -> None:
    """Disabled, nothing is sent: memory fills with due retries and the queued ones come due
    behind them. Each still ends, expired, by its deadline (the queue's earliest deadline wakes
    the endpoint and swaps in a page past it)."""
    sim = Sim(policy=PATIENT)
    refused = refusing(sim)
    answering_for(sim, 30_000)
    assert sim.driver("ep_1").queued_retries
    sim.config(config(version=2, status=EndpointStatus.DISABLED))
    sim.advance(T0 + DAY_MS + 60_000)
    for did in refused:
        assert sim.history[did].status == "expired", (did, sim.history[did].status)
    drv = sim.driver("ep_1")
    assert not drv.items and not drv.queued_retries


def test_a_due_bucket_larger_than_a_page_takes_memory_from_later_retries_at_once() -> None:
    """A pass brings back one page of a due bucket. With memory full it stopped there and slept
    until the next retry in memory, holding retries due ten minutes later while due ones waited
    in the queue (the memory invariant of the model test, which found it: seed 13734)."""
    policy = replace(PATIENT, memory_window=3, page_size=1, retry_bucket_ms=10_000)
    sim = Sim(policy=policy)
    sim.config(config(max_in_flight=64))
    later = [f"dlv_ep_1_{i}" for i in range(3)]
    for i in range(13):  # three due in 30 s, then ten due in 60 s: memory holds six
        sim.answer_for[f"dlv_ep_1_{i}"] = HttpResult(503, retry_after="30" if i < 3 else "60")
        sim.new(delivery(i, created=sim.now))
        sim.answer_all("ep_1")
    for did in later:  # at their retry they are told to come back in ten minutes: still in memory
        sim.answer_for[did] = HttpResult(503, retry_after="600")
    sim.advance(T0 + 59_999)
    drv, store = sim.driver("ep_1"), sim.stores["ep_1"]
    assert set(later) <= set(drv.items) and len(store.queued_retry_ids()) == 7
    sim.advance(T0 + 60_000)  # the bucket starts: seven due, a page of one per pass
    assert store.queued_retry_ids(), "memory holds six due in this bucket: the rest wait for room"
    assert not set(later) & set(drv.items), "retries due in ten minutes kept due ones out of memory"



# -- a poison history write ----------------------------------------------------------------------

def _poison_among_traffic(how: str) -> tuple[Sim, NewDelivery]:
    """ep_1 takes a delivery every second for two minutes; the second one's writes are refused
    for their values (``how``: "values" -- not the record without them -- or "all")."""
    sim = Sim()
    sim.config(config())
    poison = delivery(1)
    sim.reject_writes[poison.delivery_id] = how
    for n in range(120):
        sim.new(delivery(n, created=sim.now))
        sim.answer_all("ep_1")
        sim.advance(sim.now + 1_000)
    return sim, poison


def test_a_poison_write_fails_only_its_delivery_which_ends_failed_with_its_reason_recorded() -> None:
    """A write refused for its own values (an encode error) was retried like a timeout: the
    delivery stayed in memory, unrecorded, until the give-up bound an hour past its deadline."""
    sim, poison = _poison_among_traffic("values")
    did = poison.delivery_id
    assert sim.requests[did] == 0, "sent before its creation record was durable"
    assert did not in sim.driver("ep_1").items
    h = sim.history[did]
    assert (h.status, h.error_class) == ("failed", dsp.WRITE_REJECTED)
    assert set(h.rows.values()) == {"not_sent"}  # its reserved row closed: no request was made
    assert sim.counts["writes_rejected"] == 1
    others = [f"dlv_ep_1_{n}" for n in range(120) if n != 1]
    assert all(sim.requests[o] == 1 and sim.history[o].status == "succeeded" for o in others)


def test_a_finished_requests_record_refused_for_its_values_is_written_without_them() -> None:
    """The request went out and succeeded; its record (URL, response prefix) is refused: written
    without those, it stays a success, not a failure."""
    sim = Sim()
    sim.config(config())
    d = delivery(1)
    sim.new(d)
    sim.reject_writes[d.delivery_id] = "values"
    for n in range(2, 40):  # others' writes keep succeeding meanwhile
        sim.answer_all("ep_1")
        sim.new(delivery(n, created=sim.now))
        sim.advance(sim.now + 1_000)
    h = sim.history[d.delivery_id]
    assert sim.requests[d.delivery_id] == 1 and (h.status, h.rows[1]) == ("succeeded", "succeeded")
    assert sim.counts["writes_rejected"] == 1 and d.delivery_id not in sim.driver("ep_1").items


def test_a_poison_delivery_whose_valueless_record_is_refused_too_is_let_go_counted() -> None:
    sim, poison = _poison_among_traffic("all")
    assert poison.delivery_id not in sim.driver("ep_1").items and sim.requests[poison.delivery_id] == 0
    assert sim.counts["rejected_unrecorded"] == 1 and poison.delivery_id not in sim.history


@pytest.mark.parametrize("error", ["rejected", "timeout"])
def test_a_write_refused_while_no_other_write_succeeds_ends_nothing(error: str) -> None:
    """The same refusal from every write (a column missing after a bad migration) or an outage is
    no delivery's poison: nothing ends, nothing is sent, and all goes once writes work again."""
    sim = Sim()
    sim.config(config())
    ds = [delivery(n) for n in range(3)]
    for d in ds:
        if error == "rejected":
            sim.reject_writes[d.delivery_id] = "all"
        else:
            sim.fail_writes.add(d.delivery_id)
        sim.new(d)
    sim.advance(T0 + 600_000)
    assert sim.counts["writes_rejected"] == 0 and len(sim.driver("ep_1").items) == 3
    assert not sim.requests and not sim.history
    sim.reject_writes.clear()
    sim.fail_writes.clear()
    sim.advance(T0 + 700_000)
    assert all(sim.history[d.delivery_id].status == "succeeded" for d in ds)


# -- an error before the request leaves ---------------------------------------------------------

def test_a_request_that_fails_before_it_leaves_is_no_attempt_and_is_tried_again() -> None:
    """An error building the request (signing, headers, the egress check) was recorded as a sent
    attempt of class internal: it spent the retry budget for a request no receiver saw."""
    sim = Sim()
    sim.config(config())
    d = delivery(1)
    sim.send_errors[d.delivery_id] = [dsp.NotSent("building the request failed: ValueError")] * 2
    sim.new(d)
    sim.answer_all("ep_1")
    sim.advance(T0 + 3_600_000)
    h = sim.history[d.delivery_id]
    assert h.rows == {1: "not_sent", 2: "not_sent", 3: "succeeded"}
    assert (h.status, h.attempt_count) == ("succeeded", 1)  # one request: one attempt of the budget
    assert sim.counts["attempts"] == 1 and sim.counts["failed_before_sending"] == 2
    drv = sim.driver("ep_1")
    assert drv.breaker.consecutive_failures == 0 and drv.held_until_ms == 0


@pytest.mark.parametrize(("error", "rows", "attempt_count"), [
    (dsp.NotSent("building the request failed: ValueError"), "not_sent", 0),
    # may have failed after bytes left: recorded as the request the receiver may have seen
    (RuntimeError("sender bug"), "retry", 1),
])
def test_what_a_failed_send_is_recorded_as(error: BaseException, rows: str, attempt_count: int) -> None:
    sim = Sim()
    sim.config(config())
    d = delivery(1)
    sim.send_errors[d.delivery_id] = [error]
    sim.new(d)
    sim.answer_all("ep_1")
    h = sim.history[d.delivery_id]
    assert (h.rows[1], h.status, h.attempt_count) == (rows, "pending", attempt_count)
    assert h.error_class == (dsp.INTERNAL_BEFORE_SEND if rows == "not_sent" else ErrorClass.INTERNAL.value)


def test_a_request_that_never_leaves_ends_expired_at_its_deadline_not_at_max_attempts() -> None:
    sim = Sim()
    sim.config(config())
    d = delivery(1)
    sim.send_errors[d.delivery_id] = [dsp.NotSent("building the request failed: ValueError")] * 1000
    sim.new(d)
    sim.answer_all("ep_1")
    sim.advance(T0 + DAY_MS + 60_000)
    h = sim.history[d.delivery_id]
    assert (h.status, h.attempt_count, h.auto) == ("expired", 0, False)
    assert set(h.rows.values()) == {"not_sent"} and len(h.rows) > SCHEDULE.max_attempts
    assert d.delivery_id not in sim.driver("ep_1").items


def test_a_manual_request_that_fails_before_it_leaves_ends_not_sent_and_the_schedule_goes_on() -> None:
    sim = Sim()
    sim.config(config())
    sim.answer["ep_1"] = HttpResult(503)
    d = delivery(1)
    sim.new(d)
    sim.answer_all("ep_1")  # attempt 1 refused: a retry waits
    sim.send_errors[d.delivery_id] = [dsp.NotSent("building the request failed: ValueError")]
    assert sim.replay(ReplayRequest(d.delivery_id, "t_1", "ep_1", "alice", sim.now, "req-1")) == "queued"
    sim.answer_all("ep_1")
    h = sim.history[d.delivery_id]
    assert h.rows[2] == "not_sent" and (h.status, h.attempt_count, h.auto) == ("pending", 1, True)
    sim.answer.pop("ep_1")
    sim.advance(T0 + 3_600_000)
    assert sim.history[d.delivery_id].status == "succeeded"
