"""The Dispatcher adapter with fake Flink context, timers, history, sender and I/O loop: what it
does with the driver's decisions when its own I/O side misbehaves."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Iterable
from dataclasses import replace
from typing import Any

import pytest
from cassandra import OperationTimedOut

from core import dispatch, telemetry
from core.endpoint_driver import EndpointDriver
from core.endpoint_store import InMemoryEndpointStore, RetryBucket
from core.fanout import NewDelivery
from core.outcomes import HttpResult
from core.records import EndpointConfig, EndpointStatus, EventRecord, SigningKey
from core.settings import Settings
from operators import dispatcher as dispatcher_module
from operators.dispatch_input import CONFIG, NEW
from operators.dispatcher import Dispatcher
from operators.endpoint_state import FlinkEndpointStore
from operators.write_batcher import BatchCompletion

T0 = 1_700_000_000_000
POOL = 8


class FakeStore(InMemoryEndpointStore):
    """Keyed state as the dispatcher uses it: the driver's store plus held payloads."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads: dict[str, bytes] = {}

    def payload(self, delivery_id: str) -> bytes | None:
        return self.payloads.get(delivery_id)

    def put_payload(self, delivery_id: str, payload: bytes) -> None:
        self.payloads[delivery_id] = payload

    def remove_payload(self, delivery_id: str) -> None:
        self.payloads.pop(delivery_id, None)


class KeyedStore:
    """Keyed state: one FakeStore per endpoint, the one of the key in context (set by the test
    before each element or timer, as Flink does)."""

    def __init__(self) -> None:
        self.stores: dict[str, FakeStore] = {}
        self.key = ""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stores.setdefault(self.key, FakeStore()), name)


class FakeRuntime:
    """The background I/O loop: coroutines wait until the test runs them."""

    def __init__(self, *_: Any) -> None:
        self.pending: list[tuple[Coroutine[Any, Any, Any], concurrent.futures.Future[Any]]] = []
        self.fail_submit_all: BaseException | None = None

    def call(self, coro: Any, timeout: float | None = None) -> None:
        if asyncio.iscoroutine(coro):
            coro.close()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.pending.append((coro, fut))
        return fut

    def submit_all(self, coros: list[Coroutine[Any, Any, Any]]) -> list[concurrent.futures.Future[Any]]:
        if self.fail_submit_all is not None:
            exc, self.fail_submit_all = self.fail_submit_all, None
            raise exc
        return [self.submit(c) for c in coros]

    def run_all(self) -> None:
        pending, self.pending = self.pending, []
        loop = asyncio.new_event_loop()
        try:
            for coro, fut in pending:
                try:
                    fut.set_result(loop.run_until_complete(coro))
                except Exception as exc:  # noqa: BLE001 -- the future carries it
                    fut.set_exception(exc)
        finally:
            loop.close()

    def close(self) -> None:
        pass


class FakeSender:
    def __init__(self, *_: Any) -> None:
        self.sent: list[str] = []
        self.refuse: set[str] = set()  # deliveries the receiver answers 500
        self.fail_keys_at: int | None = None  # the how-manieth call of keys() raises, once
        self.unbuildable: set[str] = set()  # deliveries whose next request cannot be built, once

    def keys(self, cfg: EndpointConfig, now_ms: int) -> list[Any]:
        if self.fail_keys_at is not None:
            self.fail_keys_at -= 1
            if self.fail_keys_at == 0:
                self.fail_keys_at = None
                raise ValueError("a bug building the request")
        return []

    async def send(self, p: dispatch.Pending, payload: bytes, cfg: EndpointConfig, keys: Any) -> dispatch.SendReport:
        if p.delivery_id in self.unbuildable:
            self.unbuildable.discard(p.delivery_id)
            raise dispatch.NotSent("building the request failed: UnicodeEncodeError")
        self.sent.append(p.delivery_id)
        status = 500 if p.delivery_id in self.refuse else 200
        return dispatch.SendReport(result=HttpResult(status=status), started_at_ms=T0, finished_at_ms=T0,
                                   url=cfg.url, endpoint_config_version=cfg.config_version)

    async def close(self) -> None:
        pass


class FakeHistory:
    """Cassandra that acknowledges every write at once and holds every event row."""

    def __init__(self, *_: Any) -> None:
        self.payload_reads = 0
        self.fail_persist: BaseException | None = None  # the next persist raises, once
        self.poison: set[str] = set()  # deliveries whose persist raises as the driver binds its values
        self.fail_payload_reads: BaseException | None = None  # every payload read raises this
        self.records: list[dispatch.AttemptRecord] = []
        self.slow = False  # writes stay in flight until complete_writes()
        self.in_flight: list[BatchCompletion] = []
        self.persisted: list[str] = []  # delivery ids, in the order their creation writes started
        self.catch_up: list[bool] = []  # each change of pace, in order
        self.refused_replays: list[tuple[Any, ...]] = []  # (request, reason, at)

    def _done(self, *_: Any) -> BatchCompletion:
        c = BatchCompletion()
        if self.slow:
            self.in_flight.append(c)
        else:
            c.succeed()
        return c

    def complete_writes(self) -> None:
        for c in self.in_flight:
            c.succeed()
        self.in_flight = []

    reserve = report_backlog = _done

    def record(self, d: NewDelivery, r: dispatch.AttemptRecord, *_: Any) -> BatchCompletion:
        self.records.append(r)
        return self._done()

    def persist(self, d: NewDelivery, *_: Any) -> BatchCompletion:
        if self.fail_persist is not None:
            exc, self.fail_persist = self.fail_persist, None
            raise exc
        if d.delivery_id in self.poison:
            # What the Cassandra driver raises binding a text value with a lone surrogate (a JSON
            # "\ud800" escape that passed ingest), sending a large payload's event row alone.
            d.event.object_id.encode("utf-8")
        self.persisted.append(d.delivery_id)
        return self._done()

    async def check(self, delivery_id: str) -> dispatch.DurableRecord:
        return dispatch.DurableRecord(status=None)

    async def load_for_replay(self, delivery_id: str) -> None:
        return None  # not in Cassandra: the driver counts the replay unknown

    async def load_payload(self, event_id: str) -> bytes:
        self.payload_reads += 1
        if self.fail_payload_reads is not None:
            raise self.fail_payload_reads
        return b"{}"

    def refuse_replay(self, r: Any, reason: str, at_ms: int) -> BatchCompletion:
        self.refused_replays.append((r, reason, at_ms))
        return self._done()

    def catching_up(self, behind: bool) -> None:
        self.catch_up.append(behind)

    def flush_if_due(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class FakeRegistry:
    def sweep(self) -> None:
        pass

    def register(self, what: str, release: Any) -> object:
        return object()

    def unregister(self, token: object) -> None:
        pass


class FakeCounter:
    def inc(self, n: int = 1) -> None:
        pass

    def dec(self, n: int = 1) -> None:
        pass


class FakeGroup:
    def counter(self, name: str) -> FakeCounter:
        return FakeCounter()

    def add_group(self, key: str, value: str) -> FakeGroup:
        return self


class FakeRuntimeContext:
    def get_metrics_group(self) -> FakeGroup:
        return FakeGroup()


class Timers:
    """Processing time and the timers set, each (time, key)."""

    def __init__(self) -> None:
        self.now = T0
        self.set: set[tuple[int, str]] = set()


class Ctx:
    def __init__(self, timers: Timers, key: str) -> None:
        self._timers, self._key = timers, key

    def timer_service(self) -> Ctx:
        return self

    def current_processing_time(self) -> int:
        return self._timers.now

    def register_processing_time_timer(self, at_ms: int) -> None:
        self._timers.set.add((at_ms, self._key))

    def get_current_key(self) -> str:
        return self._key


class World:
    """One Dispatcher opened on fakes, one endpoint ``ep_1``, and its clock and timers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, max_concurrent_writes: int = 1024,
                 **dispatch_settings: Any) -> None:
        for name, fake in (("FlinkEndpointStore", lambda _ctx: KeyedStore()), ("AsyncRuntime", FakeRuntime),
                           ("Sender", FakeSender), ("CassandraHistory", FakeHistory),
                           ("SnapshotWriter", lambda *_a, **_k: None)):
            monkeypatch.setattr(dispatcher_module, name, fake)
        monkeypatch.setattr(dispatcher_module.task_resources, "REGISTRY", FakeRegistry())
        monkeypatch.setattr(dispatcher_module.gc, "freeze", lambda: None)
        s = Settings()
        s = s.model_copy(update={"dispatch": s.dispatch.model_copy(update={
            "max_in_flight": POOL, "tenant_max_in_flight": POOL, "default_max_in_flight": POOL, **dispatch_settings}),
            "cassandra": s.cassandra.model_copy(update={"max_concurrent_writes": max_concurrent_writes})})
        self.d = Dispatcher(s)
        self.d.open(FakeRuntimeContext())  # type: ignore[arg-type]
        self.timers = Timers()
        self.ep = "ep_1"
        self.configure(self.ep, "t_1")

    def configure(self, ep: str, tenant: str, status: EndpointStatus = EndpointStatus.ACTIVE) -> None:
        cfg = EndpointConfig(
            endpoint_id=ep, tenant_id=tenant, url=f"https://example.com/{ep}", status=status,
            event_types=("*",), config_version=1, published_at_ms=T0,
            signing_keys=(SigningKey(version=1, ciphertext_b64="x", not_after_ms=None),))
        self.element(CONFIG, cfg, ep)

    @property
    def rt(self) -> FakeRuntime:
        return self.d._rt  # type: ignore[return-value]

    @property
    def history(self) -> FakeHistory:
        return self.d._history  # type: ignore[return-value]

    @property
    def sender(self) -> FakeSender:
        return self.d._sender  # type: ignore[return-value]

    def element(self, kind: str, item: Any, ep: str | None = None) -> list[str]:
        ep = ep or self.ep
        self.d._store.key = ep  # type: ignore[attr-defined]
        return list(self.d.process_element((ep, (kind, item)), Ctx(self.timers, ep)))

    def new(self, n: int, payload: bytes = b"{}", ep: str | None = None, tenant: str = "t_1",
            age_ms: int = 0) -> None:
        """Delivery ``dlv_<n>`` arrives now, its event ``age_ms`` old (its Kafka time before now)."""
        ep = ep or self.ep
        e = EventRecord(event_id=f"evt_{n}", tenant_id=tenant, event_type="invoice.paid", schema_version="1",
                        object_id="", object_version=0, occurred_at_ms=self.timers.now, payload=payload)
        self.element(NEW, NewDelivery(
            delivery_id=f"dlv_{n}", event=e, endpoint_id=ep, tenant_id=tenant, endpoint_config_version=1,
            created_at_ms=self.timers.now - age_ms, expires_at_ms=self.timers.now + 24 * 3600 * 1000), ep)

    def fire_timers_until(self, until_ms: int, before_each: Any = None) -> None:
        """Fire every timer due up to ``until_ms``, in order, running the I/O loop between them."""
        while True:
            self.rt.run_all()
            if before_each is not None:
                before_each()
            due = sorted(t for t in self.timers.set if t[0] <= until_ms)
            if not due:
                break
            t, key = due[0]
            self.timers.set.discard((t, key))
            self.timers.now = max(self.timers.now, t)
            self.d._store.key = key  # type: ignore[attr-defined]
            list(self.d.on_timer(t, Ctx(self.timers, key)))
        self.timers.now = until_ms

    def free_pool_slots(self) -> int:
        """Slots of the shared pool nobody holds (probed with another tenant's take and release)."""
        sched = self.d._scheduler
        got = sched.acquire_uncontended("probe", POOL)
        sched.release("probe", got)
        return got

    def busy_without_io(self) -> list[str]:
        """Deliveries marked busy with no I/O of theirs in flight: stranded."""
        drv = self.d._drivers.get(self.ep)
        io = self.d._io._by_endpoint.get(self.ep, {})
        in_flight = {key for _, key in io}
        return [did for did, p in (drv.items.items() if drv else ()) if p.busy and did not in in_flight]


def sends_in_flight(w: World) -> int:
    return sum(1 for kind, _ in w.d._io._by_endpoint.get(w.ep, {}) if kind == "send")


def _ids(n: int) -> Iterable[int]:
    return range(1, n + 1)


def _fail_submit_all(w: World) -> None:
    w.rt.fail_submit_all = RuntimeError("the I/O loop refused the batch")


def _fail_second_keys(w: World) -> None:
    w.sender.fail_keys_at = 2


def _fail_first_persist(w: World) -> None:
    # A failure of the store, not of this write's values (those fail that delivery only: below).
    w.history.fail_persist = RuntimeError("Cassandra session is shut down")


@pytest.mark.parametrize("fail", [_fail_submit_all, _fail_second_keys, _fail_first_persist],
                         ids=["submitting the requests", "the second request", "the first write"])
def test_an_action_that_raises_in_start_leaves_no_work_busy_without_io_and_releases_its_slots(
        monkeypatch: pytest.MonkeyPatch, fail: Any) -> None:
    w = World(monkeypatch)
    fail(w)
    for n in _ids(3):
        w.new(n)
    w.fire_timers_until(T0 + 50)  # the pass that starts their writes or requests raises
    drv = w.d._drivers[w.ep]
    assert w.d._counts["endpoint_internal_errors"] == 1
    assert w.busy_without_io() == []
    assert drv.in_flight == sends_in_flight(w)
    assert w.free_pool_slots() == POOL - drv.in_flight
    assert drv.held_until_ms > w.timers.now  # held, as a contained error should be
    # held once, for the error: the requests handed back do not each double the hold
    assert drv.held_until_ms <= T0 + 50 + w.d._policy.hold_base_ms
    w.fire_timers_until(drv.held_until_ms + 5_000)
    assert sorted(w.sender.sent) == ["dlv_1", "dlv_2", "dlv_3"]  # after the hold, every one goes
    assert w.free_pool_slots() == POOL and drv.in_flight == 0
    assert w.d._counts["attempts"] == 3  # a request handed back unsent is not an attempt


def test_a_failed_payload_read_is_not_a_sent_attempt_and_spends_no_retry_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(monkeypatch, payload_cache_bytes=0)  # once persisted, the bytes are only in Cassandra
    w.history.fail_payload_reads = OperationTimedOut("read of the event row timed out")
    w.new(1)
    w.fire_timers_until(T0 + 3_600_000)  # an hour of failing reads
    assert w.history.payload_reads > 1  # tried again and again
    assert [r.outcome for r in w.history.records] == []  # no attempt row: no request was made
    p = w.d._drivers[w.ep].items["dlv_1"]
    assert p.attempt_count == 0 and p.stage is dispatch.Stage.READY
    w.history.fail_payload_reads = None
    w.fire_timers_until(T0 + 3 * 3_600_000)
    assert w.sender.sent == ["dlv_1"]
    assert [(r.sent, r.outcome) for r in w.history.records] == [(True, "succeeded")]


def test_a_poison_write_fails_only_its_delivery_which_ends_with_a_recorded_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The poison delivery's creation write raised as the adapter started it, every pass: the whole
    # pass was contained, the endpoint held up to 300 s and every request after it handed back.
    w = World(monkeypatch)
    w.history.poison.add("dlv_2")
    for n in _ids(5):
        e = EventRecord(event_id=f"evt_{n}", tenant_id="t_1", event_type="invoice.paid", schema_version="1",
                        object_id="obj_\ud800" if n == 2 else "obj", object_version=0, occurred_at_ms=T0,
                        payload=b"{}")
        w.element(NEW, NewDelivery(delivery_id=f"dlv_{n}", event=e, endpoint_id=w.ep, tenant_id="t_1",
                                   endpoint_config_version=1, created_at_ms=T0, expires_at_ms=T0 + 86_400_000))
    w.fire_timers_until(T0 + 1_000)
    assert sorted(w.sender.sent) == ["dlv_1", "dlv_3", "dlv_4", "dlv_5"]  # at once, not after a hold
    assert w.d._counts["endpoint_internal_errors"] == 0
    for n in range(6, 66):  # the endpoint's traffic goes on: other writes keep succeeding
        w.new(n)
        w.fire_timers_until(w.timers.now + 500)
    assert len(w.sender.sent) == 64
    ended = [r for r in w.history.records if r.error_class == dispatch.WRITE_REJECTED]
    assert [(r.delivery_status, r.sent) for r in ended] == [("failed", False)]
    assert w.d._counts["writes_rejected"] == 1 and "dlv_2" not in w.d._drivers[w.ep].items
    assert "dlv_2" not in w.sender.sent and w.busy_without_io() == []
    assert w.d._drivers[w.ep].held_until_ms <= w.timers.now


def test_a_write_refused_for_every_delivery_ends_none_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same error type from every write (a column missing after a bad migration) is no
    # delivery's poison: with no write succeeding, none is ended; they wait, unsent.
    w = World(monkeypatch)
    w.history.poison.update(f"dlv_{n}" for n in _ids(3))
    for n in _ids(3):
        e = EventRecord(event_id=f"evt_{n}", tenant_id="t_1", event_type="invoice.paid", schema_version="1",
                        object_id="obj_\ud800", object_version=0, occurred_at_ms=T0, payload=b"{}")
        w.element(NEW, NewDelivery(delivery_id=f"dlv_{n}", event=e, endpoint_id=w.ep, tenant_id="t_1",
                                   endpoint_config_version=1, created_at_ms=T0, expires_at_ms=T0 + 86_400_000))
    w.fire_timers_until(T0 + 600_000)
    assert w.history.records == [] and w.sender.sent == []
    assert w.d._counts["writes_rejected"] == 0 and len(w.d._drivers[w.ep].items) == 3
    w.history.poison.clear()  # the schema is fixed
    w.fire_timers_until(T0 + 700_000)
    assert sorted(w.sender.sent) == ["dlv_1", "dlv_2", "dlv_3"]


def test_a_request_that_fails_before_it_leaves_is_recorded_not_sent_and_holds_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(monkeypatch)
    w.sender.unbuildable.add("dlv_2")
    for n in _ids(3):
        w.new(n)
    w.fire_timers_until(T0 + 1_000)
    assert sorted(w.sender.sent) == ["dlv_1", "dlv_3"]
    (unsent,) = [r for r in w.history.records if not r.sent]
    assert (unsent.outcome, unsent.error_class, unsent.delivery_status) == (
        "not_sent", dispatch.INTERNAL_BEFORE_SEND, "pending")
    drv = w.d._drivers[w.ep]
    assert drv.held_until_ms == 0 and w.d._counts["endpoint_internal_errors"] == 0
    w.fire_timers_until(T0 + 3_600_000)
    assert sorted(w.sender.sent) == ["dlv_1", "dlv_2", "dlv_3"]
    assert w.d._counts["attempts"] == 3 and w.d._counts["failed_before_sending"] == 1
    assert w.free_pool_slots() == POOL


def test_one_endpoints_storage_backlog_leaves_another_tenants_writes_their_share(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(monkeypatch, max_concurrent_writes=8)
    w.history.slow = True  # every write takes one 10 ms round of the loop below
    w.configure("ep_big", "t_big")
    for n in range(1000):
        w.new(n, ep="ep_big", tenant="t_big")
    w.timers.now += 1
    w.configure("ep_small", "t_small")
    w.new(5000, ep="ep_small", tenant="t_small")
    while "dlv_5000" not in w.history.persisted and w.timers.now < T0 + 5_000:
        w.history.complete_writes()
        w.fire_timers_until(w.timers.now + 10)
    waited, big_done = w.timers.now - T0, len(w.history.persisted) - 1
    assert waited <= 100, f"the small tenant's first write waited {waited} ms, behind {big_done} others"
    assert big_done < 1000  # it did not just wait for the big backlog to end
    while w.timers.set:
        w.history.complete_writes()
        w.fire_timers_until(w.timers.now + 10)
    assert len(w.history.persisted) == 1001 and len(w.sender.sent) == 1001
    assert w.d._shares.in_flight == 0  # every storage operation started was counted finished


def test_the_gauge_refresh_rebuilds_only_the_endpoints_a_pass_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    viewed: list[str] = []
    view = EndpointDriver.view

    def counting_view(drv: EndpointDriver, now_ms: int, window_ms: int) -> Any:
        viewed.append(drv.endpoint_id)
        return view(drv, now_ms, window_ms)

    monkeypatch.setattr(EndpointDriver, "view", counting_view)
    w = World(monkeypatch)
    w.configure("ep_parked", "t_2", EndpointStatus.DISABLED)
    for n in range(100):  # held in memory, untouched while disabled
        w.new(1000 + n, ep="ep_parked", tenant="t_2")
    w.fire_timers_until(T0 + 1_000)
    viewed.clear()
    for n in range(10):  # ep_1 keeps passing: a gauge refresh every second
        w.new(n)
        w.fire_timers_until(w.timers.now + 1_000)
    assert viewed.count("ep_parked") == 0, f"{viewed.count('ep_parked')} views of an endpoint no pass changed"
    assert w.d._gauges.pending_new == 100 and w.d._gauges.endpoints_parked == 1
    w.new(2000, ep="ep_parked", tenant="t_2")  # a pass: its next refresh sees it
    w.fire_timers_until(w.timers.now + 1_000)
    assert w.d._gauges.pending_new == 101


def test_the_gauge_refresh_visits_no_held_delivery_and_reads_as_the_full_recount(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Healthy endpoints draining a backlog at 5 requests/s are touched by a pass every second, and
    # each refresh rebuilt a view of every delivery they held: ~all of 99,855 held deliveries,
    # 156 ms of task-thread CPU a second. The summary is kept as deliveries move instead.
    visited: list[int] = []
    view = EndpointDriver.view

    def counting_view(drv: EndpointDriver, now_ms: int, window_ms: int) -> Any:
        visited.append(len(drv.items))
        return view(drv, now_ms, window_ms)

    monkeypatch.setattr(EndpointDriver, "view", counting_view)
    w = World(monkeypatch)
    refreshes: list[tuple[int, bool]] = []  # each refresh: held deliveries it visited, gauges == recount
    refresh = Dispatcher._refresh_gauges

    def checking_refresh(d: Dispatcher, now: int) -> None:
        before = len(visited)
        refresh(d, now)
        cost = sum(visited[before:])
        window = int(d._settings.dispatch.retry_deadline_s * 1000)
        recount = telemetry.aggregate(
            (telemetry.summarize(view(drv, now, window)) for ep, drv in d._drivers.items() if ep not in d._idle_since),
            d._scheduler.tenants_at_quota())
        refreshes.append((cost, d._gauges == recount))

    monkeypatch.setattr(Dispatcher, "_refresh_gauges", checking_refresh)
    for ep in ("ep_1", "ep_2"):
        w.element(CONFIG, replace(EndpointConfig(
            endpoint_id=ep, tenant_id="t_1", url=f"https://example.com/{ep}", status=EndpointStatus.ACTIVE,
            event_types=("*",), config_version=1, published_at_ms=T0,
            signing_keys=(SigningKey(version=1, ciphertext_b64="x", not_after_ms=None),)), rate_limit_per_s=5), ep)
        for n in range(400):
            if n % 3 == 0:
                w.sender.refuse.add(f"dlv_{ep}_{n}")
            w.timers.now += 1
            e = EventRecord(event_id=f"evt_{ep}_{n}", tenant_id="t_1", event_type="invoice.paid", schema_version="1",
                            object_id="", object_version=0, occurred_at_ms=w.timers.now, payload=b"{}")
            w.element(NEW, NewDelivery(delivery_id=f"dlv_{ep}_{n}", event=e, endpoint_id=ep, tenant_id="t_1",
                                       endpoint_config_version=1, created_at_ms=w.timers.now,
                                       expires_at_ms=w.timers.now + 86_400_000), ep)
    w.fire_timers_until(w.timers.now + 30_000)
    assert w.d._counts["endpoint_internal_errors"] == 0 and len(refreshes) >= 25 and len(w.sender.sent) > 200
    assert max(cost for cost, _ in refreshes) == 0, f"refreshes visited {[c for c, _ in refreshes]} held deliveries"
    assert all(same for _, same in refreshes), "the gauges differ from the full recount"
    g = w.d._gauges
    assert g.pending_new > 0 and g.pending_retry > 0 and g.endpoints == 2


def test_retries_beyond_memory_are_queued_and_come_back_on_the_timer_the_driver_asks_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(monkeypatch, memory_window=2, page_size=1, breaker_failure_threshold=10**6)
    refused = [f"dlv_{n}" for n in _ids(8)]
    w.sender.refuse.update(refused)
    for n in _ids(8):
        w.new(n)
        w.fire_timers_until(w.timers.now + 10)
    for n in range(100, 104):  # fresh work the receiver accepts: memory is made for it
        w.new(n)
        w.fire_timers_until(w.timers.now + 500)
    store = w.d._store.stores[w.ep]  # type: ignore[attr-defined]
    assert store.retry_queue and all(f"dlv_{n}" in w.sender.sent for n in range(100, 104))
    queued = store.queued_retry_ids()
    due = min(store.retry_bucket_index)
    wakes = [at for at, key in w.timers.set if key == w.ep]
    if due > w.timers.now:
        assert any(at <= due for at in wakes), (due, wakes)  # woken when the first bucket starts
    else:
        # The first bucket has started and its retries wait for room (memory holds work due
        # sooner; which depends on the jittered back-offs): the endpoint is woken again before
        # the next bucket starts, when the retry due soonest in memory comes up.
        next_bucket = due + w.d._policy.retry_bucket_ms  # type: ignore[attr-defined]
        assert any(at <= next_bucket for at in wakes), (due, next_bucket, wakes)
    sent_before = len(w.sender.sent)
    w.fire_timers_until(T0 + 3_600_000)
    assert not store.retry_queue or min(store.retry_bucket_index) > due
    assert queued & set(w.sender.sent[sent_before:]), "queued retries were not paged back in and sent"


class FakeMapState:
    def __init__(self) -> None:
        self.d: dict[Any, Any] = {}

    def get(self, key: Any) -> Any:
        return self.d.get(key)

    def put(self, key: Any, value: Any) -> None:
        self.d[key] = value

    def remove(self, key: Any) -> None:
        self.d.pop(key, None)

    def contains(self, key: Any) -> bool:
        return key in self.d

    def items(self) -> list[tuple[Any, Any]]:
        return list(self.d.items())

    def keys(self) -> list[Any]:
        return list(self.d)


class FakeValueState:
    def __init__(self) -> None:
        self.v: Any = None

    def value(self) -> Any:
        return self.v

    def update(self, value: Any) -> None:
        self.v = value

    def clear(self) -> None:
        self.v = None


class FakeKeyedState:
    """Flink keyed state of one key, by state name (a restore: a new store over the same one)."""

    def __init__(self) -> None:
        self.maps: dict[str, FakeMapState] = {}
        self.values: dict[str, FakeValueState] = {}

    def get_map_state(self, desc: Any) -> FakeMapState:
        return self.maps.setdefault(desc.get_name(), FakeMapState())

    def get_state(self, desc: Any) -> FakeValueState:
        return self.values.setdefault(desc.get_name(), FakeValueState())


def test_the_retry_queue_is_new_keyed_state_that_a_restore_reads_back() -> None:
    state = FakeKeyedState()
    store = FlinkEndpointStore(state)  # type: ignore[arg-type]
    # A savepoint of the job before the retry queue restores: every state it had keeps its name
    # (and format); the queue is two new names, empty in such a savepoint.
    assert set(state.maps) == {"pending-v2", "payloads", "replays-to-load", "replay-request-ids", "spilled",
                               "retry-queue", "retry-queue-buckets"}
    assert set(state.values) == {"endpoint-config", "breaker", "bucket", "gone-at-version", "spill-range"}
    assert list(store.retry_buckets()) == []
    e = EventRecord(event_id="evt_1", tenant_id="t_1", event_type="invoice.paid", schema_version="1",
                    object_id="", object_version=0, occurred_at_ms=T0, payload=b"")
    p = dispatch.Pending(
        delivery=NewDelivery(delivery_id="dlv_1", event=e, endpoint_id="ep_1", tenant_id="t_1",
                             endpoint_config_version=1, created_at_ms=T0, expires_at_ms=T0 + 86_400_000),
        stage=dispatch.Stage.READY, attempt_count=2, issued=3, next_attempt_at_ms=T0 + 65_432,
        intent=dispatch.Intent(3, "att_3"))
    store.put(p)
    index = RetryBucket()
    store.queue_retry(T0 + 65_000, index.append(p.delivery.expires_at_ms), p)
    store.put_retry_bucket(T0 + 65_000, index)
    assert store.entries("ep_1") == []  # out of the pending map: a restore reads it from the queue
    restored = FlinkEndpointStore(state)  # type: ignore[arg-type]
    ((bucket, got),) = restored.retry_buckets()
    assert bucket == T0 + 65_000 and got == index and got.earliest_deadline_ms == T0 + 86_400_000
    ((seq, back, intent),) = restored.unqueue_retries("ep_1", bucket, got.take(1))
    assert seq == 0 and intent == p.intent
    assert (back.delivery_id, back.attempt_count, back.issued, back.next_attempt_at_ms) == ("dlv_1", 2, 3, T0 + 65_432)
    restored.put_retry_bucket(bucket, got)  # empty: the bucket leaves the index
    assert not state.maps["retry-queue"].d and not state.maps["retry-queue-buckets"].d


def _touched(w: World) -> list[str]:
    """Deliveries of ep_1 with I/O started (their CHECK or creation write), in no order."""
    return sorted(key for _, key in w.d._io._by_endpoint.get(w.ep, {}))


def test_deliveries_arriving_while_a_look_is_due_within_the_harvest_interval_wait_for_it_together(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Under load an endpoint has I/O in flight and a look due within one harvest interval: a new
    # delivery joins the driver (and keyed state) and waits for that look, which steps them all in
    # one pass, instead of a pass of its own each.
    w = World(monkeypatch)
    w.new(1)
    assert _touched(w) == ["dlv_1"]  # nothing was due: a pass at once, its I/O in flight
    passes = w.d._counts["passes"]
    w.timers.now += 1
    for n in range(2, 6):
        w.new(n)
    assert w.d._counts["passes"] == passes, "a pass per delivery while a look was due anyway"
    assert _touched(w) == ["dlv_1"]
    assert all(f"dlv_{n}" in w.d._store.stores["ep_1"].pending for n in _ids(5)), "each in keyed state at once"
    look = min(t for t, key in w.timers.set if key == w.ep)
    assert look <= T0 + 10  # the harvest interval
    w.fire_timers_until(look)
    assert w.d._counts["passes"] == passes + 1, "one pass stepped the four"
    assert set(_touched(w)) >= {f"dlv_{n}" for n in range(2, 6)}
    for _ in range(20):
        w.fire_timers_until(w.timers.now + 50)
    assert sorted(w.sender.sent) == sorted(f"dlv_{n}" for n in _ids(5))


def _busy(w: World) -> int:
    """Eight deliveries with their creation writes in flight; the time of the endpoint's next look."""
    w.history.slow = True
    for n in _ids(8):
        w.new(n)
    w.fire_timers_until(T0 + 10)  # the first look steps the seven that waited for it
    assert len(_touched(w)) == 8
    return min(t for t, key in w.timers.set if key == w.ep)


@pytest.mark.parametrize(("busy_max", "look_after_ms"), [
    (40, 40),  # the default: eight writes in flight, one look every 40 ms
    (10, 10),  # both settings equal: a fixed interval
])
def test_a_busy_endpoint_is_looked_at_less_often(monkeypatch: pytest.MonkeyPatch, busy_max: int,
                                                 look_after_ms: int) -> None:
    # Each look is a timer and a crossing into Python; with many requests in flight a rarer look
    # finds several finished.
    w = World(monkeypatch, harvest_busy_max_ms=busy_max)
    assert _busy(w) == T0 + 10 + look_after_ms


def test_a_delivery_arriving_at_a_busy_endpoint_waits_for_its_look(monkeypatch: pytest.MonkeyPatch) -> None:
    # 35 ms before the look, more than the base interval: it joins the look due anyway.
    w = World(monkeypatch)
    look = _busy(w)
    passes = w.d._counts["passes"]
    w.timers.now = look - 35
    w.new(9)
    assert w.d._counts["passes"] == passes, "a pass of its own while a look was due anyway"
    assert "dlv_9" not in _touched(w)
    w.fire_timers_until(look)
    assert w.d._counts["passes"] == passes + 1 and "dlv_9" in _touched(w)
    w.history.complete_writes()
    w.history.slow = False
    for _ in range(20):
        w.fire_timers_until(w.timers.now + 50)
    assert sorted(w.sender.sent) == sorted(f"dlv_{n}" for n in _ids(9))


def test_a_delivery_to_an_endpoint_with_nothing_due_soon_is_stepped_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Light load: nothing in flight, no look due, so waiting would only add latency.
    w = World(monkeypatch)
    w.new(1)
    w.fire_timers_until(T0 + 1_000)
    assert w.sender.sent == ["dlv_1"]
    w.timers.now += 60_000
    w.new(2)
    assert _touched(w) == ["dlv_2"]


def _built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Endpoints whose driver was built (from keyed state), in order."""
    built: list[str] = []
    init = EndpointDriver.__init__

    def counting_init(drv: EndpointDriver, endpoint_id: str, *a: Any, **k: Any) -> None:
        built.append(endpoint_id)
        init(drv, endpoint_id, *a, **k)

    monkeypatch.setattr(EndpointDriver, "__init__", counting_init)
    return built


def test_a_driver_that_holds_nothing_is_kept_a_moment_for_the_next_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under load an endpoint often holds nothing between one outcome and the next arrival:
    # rebuilding its driver reads keyed state (a call into Java each) and costs its timer a pass.
    built = _built(monkeypatch)
    w = World(monkeypatch, idle_driver_keep_ms=2_000)
    w.new(1)
    w.fire_timers_until(T0 + 500)
    assert w.sender.sent == ["dlv_1"] and w.ep in w.d._drivers, "dropped although kept for 2 s"
    w.fire_timers_until(T0 + 1_500)
    w.new(2)
    w.fire_timers_until(T0 + 2_000)
    assert w.sender.sent == ["dlv_1", "dlv_2"]
    assert built.count(w.ep) == 1, "rebuilt from keyed state within the keep time"  # since its config
    w.configure("ep_other", "t_2")  # any endpoint's pass sweeps the operator's idle drivers
    assert w.ep in w.d._drivers
    w.timers.now = T0 + 2_000 + 2_000
    w.configure("ep_other", "t_2")
    assert w.ep not in w.d._drivers, "an idle driver outlived its keep time"
    w.new(3)
    w.fire_timers_until(w.timers.now + 500)
    assert w.sender.sent == ["dlv_1", "dlv_2", "dlv_3"] and built.count(w.ep) == 2


def test_a_kept_idle_driver_is_not_counted_as_an_endpoint_holding_deliveries(monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(monkeypatch, idle_driver_keep_ms=60_000)
    w.new(1)
    w.fire_timers_until(T0 + 3_000)  # the gauge refresh runs at least once a second while changes come
    assert w.sender.sent == ["dlv_1"] and w.ep in w.d._drivers
    w.d._refresh_gauges(w.timers.now)
    assert (w.d._gauges.endpoints, w.d._gauges.pending_new) == (0, 0)


def test_with_no_keep_time_a_driver_is_dropped_as_soon_as_it_holds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _built(monkeypatch)
    w = World(monkeypatch, idle_driver_keep_ms=0)
    w.new(1)
    w.fire_timers_until(T0 + 500)
    assert w.ep not in w.d._drivers
    before = built.count(w.ep)
    w.new(2)
    assert built.count(w.ep) == before + 1  # from keyed state again
    w.fire_timers_until(T0 + 1_000)
    assert w.ep not in w.d._drivers and w.sender.sent == ["dlv_1", "dlv_2"]


def _next_look(w: World) -> int:
    return min(t for t, key in w.timers.set if key == w.ep) - w.timers.now


def test_late_deliveries_put_the_dispatcher_into_catch_up_until_none_has_come_for_the_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Behind its input, the dispatcher looks at I/O and sends history batches less often: each
    # look and each request costs the same whatever it carries, and a delivery that already
    # waited in Kafka does not feel ~10 ms more.
    w = World(monkeypatch)
    late = w.d._settings.dispatch.catch_up_late_ms
    w.history.slow = True
    w.new(1, age_ms=late - 1)
    assert w.history.catch_up == [] and _next_look(w) == 10  # fresh enough: light-load pace
    w.new(2, age_ms=late)
    assert w.history.catch_up == [True]
    w.history.complete_writes()
    w.fire_timers_until(w.timers.now + 10)
    assert _next_look(w) == 20, "looks at I/O in flight while catching up"
    assert w.d._counts["catch_up_started"] == 1
    late_at = w.timers.now
    w.fire_timers_until(late_at + 1500, before_each=w.history.complete_writes)
    w.new(3)  # a fresh arrival does not end it before the hold
    assert w.history.catch_up == [True]
    w.fire_timers_until(late_at + 2100, before_each=w.history.complete_writes)
    w.new(4)
    assert w.history.catch_up == [True, False] and w.d._counts["catch_up_ended"] == 1
    assert _next_look(w) == 10
    w.fire_timers_until(w.timers.now + 5000, before_each=w.history.complete_writes)
    assert len(w.history.records) == 4 and w.busy_without_io() == []
