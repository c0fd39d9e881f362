"""The dispatcher: keyed by endpoint, a thin Flink adapter over :mod:`core.dispatch`.

Per endpoint (keyed state, checkpointed): the pending deliveries with their stage and attempt
count, the circuit breaker, the token bucket, and a local "disabled by 410" mark. Per operator
instance (memory, rebuilt after a restore): a background asyncio loop with the HTTP sender and
the Cassandra history writer, the futures of I/O in progress, and the fair scheduler that shares
the instance's pool of in-flight requests between tenants.

Output: :class:`core.records.EndpointSignal` JSON for the control plane (a 410 Gone).

Work is driven from two places only: ``process_element`` (a new delivery or a replay for this
endpoint) and ``on_timer`` (a retry is due, or it is time to harvest finished I/O). Flink state is
therefore only ever touched from the task thread, in the right key's context. Timers are
checkpointed, so after a restore every endpoint with pending work wakes up and re-sends what was
in flight (at-least-once).
"""

from __future__ import annotations

import gc
import logging
import random
import time
import uuid
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from pyflink.common.typeinfo import Types
from pyflink.datastream.functions import KeyedBroadcastProcessFunction, RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from core import breaker as brk
from core import dispatch as logic
from core import ratelimit
from core.egress import EgressPolicy
from core.fairness import FairScheduler
from core.fanout import NewDelivery
from core.outcomes import ErrorClass, HttpResult
from core.records import EndpointConfig, EndpointSignal, EndpointStatus, ReplayRequest
from core.retry import RetrySchedule
from core.secrets import decrypt_secret, redact
from core.settings import Settings
from core.signing import build_headers, secret_bytes
from operators.async_runtime import AsyncRuntime
from operators.endpoint_configs import ENDPOINT_CONFIGS
from operators.history_store import CassandraHistory
from operators.write_batcher import Completion

log = logging.getLogger(__name__)

NEW = "delivery"
REPLAY = "replay"

# A parked endpoint (waiting for a slot) still gets a full pass at least this often, which
# bounds how late anything the park check does not look at (a deadline passing) is noticed.
_PARK_MAX_MS = 5_000

# delivery_id -> (kind, I/O in progress); kinds: persist, send, record, load
IoMap = dict[str, tuple[str, Completion]]


class Dispatcher(KeyedBroadcastProcessFunction):
    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    # -- lifecycle -------------------------------------------------------------------------------
    def open(self, runtime_context: RuntimeContext) -> None:
        s = self._settings
        self._pending = runtime_context.get_map_state(
            MapStateDescriptor("pending", Types.STRING(), Types.PICKLED_BYTE_ARRAY()))
        self._payloads = runtime_context.get_map_state(
            MapStateDescriptor("payloads", Types.STRING(), Types.PICKLED_BYTE_ARRAY()))
        self._replays = runtime_context.get_map_state(
            MapStateDescriptor("replays-loading", Types.STRING(), Types.PICKLED_BYTE_ARRAY()))
        self._breaker = runtime_context.get_state(ValueStateDescriptor("breaker", Types.PICKLED_BYTE_ARRAY()))
        self._bucket = runtime_context.get_state(ValueStateDescriptor("bucket", Types.PICKLED_BYTE_ARRAY()))
        self._gone = runtime_context.get_state(ValueStateDescriptor("gone-at-version", Types.LONG()))
        metrics = runtime_context.get_metrics_group()
        self._m = {name: metrics.counter(name) for name in (
            "attempts", "succeeded", "retried", "failed", "expired", "endpoints_disabled",
            "adopted_after_restore", "history_write_failures", "replays", "replays_unknown")}

        self._incarnation = uuid.uuid4().hex
        self._rng = random.Random()
        self._schedule = RetrySchedule.from_settings(s.dispatch)
        self._breaker_cfg = brk.BreakerConfig.from_settings(s.dispatch)
        self._policy = EgressPolicy.from_settings(s.egress)
        if s.egress.dev_allow_cidrs:
            log.warning("EGRESS DEVELOPMENT ALLOWANCE IS ON: %s may be reached despite the SSRF policy",
                        s.egress.dev_allow_cidrs)
        self._rt = AsyncRuntime("dispatcher-io")
        from operators.http_sender import HttpSender

        self._sender = self._rt.call(HttpSender.create(s.dispatch, self._policy))
        self._history = CassandraHistory(s.cassandra)
        self._master_key = s.master_key_bytes()
        self._keys: dict[tuple[str, int], bytes] = {}
        self._io: dict[str, IoMap] = {}  # endpoint_id -> its I/O in progress
        self._queues: dict[str, logic.EndpointQueue] = {}
        self._writes_in_flight = 0
        # Mirrors of per-endpoint values read on every pass; keyed state stays the source of truth
        # (written on change), and a new incarnation starts empty and fills them on first use.
        self._configs: dict[str, EndpointConfig | None] = {}
        self._breakers: dict[str, brk.BreakerState] = {}
        self._wakes: dict[str, int | None] = {}
        self._gones: dict[str, int | None] = {}
        self._replay_keys: set[str] = set()
        self._replays_checked: set[str] = set()
        self._slot_waits: dict[str, int] = {}  # consecutive passes an endpoint waited for a slot
        # Endpoints whose last pass found due work and no slot for it: endpoint -> (the config
        # that pass saw, when a full pass is due anyway). See _still_parked.
        self._parked: dict[str, tuple[EndpointConfig | None, int]] = {}
        self._events_written: OrderedDict[str, None] = OrderedDict()
        self._started: dict[str, int] = {}  # delivery_id -> when its current I/O was submitted
        self._fair = FairScheduler(pool_size=s.dispatch.max_in_flight,
                                   tenant_quota=s.dispatch.tenant_max_in_flight)
        # Thread mode: this interpreter lives as long as the TaskManager and holds ~150k
        # long-lived objects (PyFlink, aiohttp, the Cassandra driver) that every full collection
        # walked: a ~100 ms pause every 10-25 s, measured as the whole first-attempt p99 tail at
        # light load. Frozen, they are skipped (full collections measured ~14 ms); close() thaws
        # them so a cancelled job's garbage can still be collected.
        gc.collect()
        gc.freeze()

    def close(self) -> None:
        try:
            self._rt.call(self._sender.close(), timeout=5)
        except Exception:  # closing is best effort: the process may be going away
            log.exception("closing the HTTP sender failed")
        self._history.close()
        self._rt.close()
        gc.unfreeze()

    # -- inputs ----------------------------------------------------------------------------------
    def process_broadcast_element(self, value: Any, ctx: KeyedBroadcastProcessFunction.Context) -> None:
        cfg: EndpointConfig = value
        state = ctx.get_broadcast_state(ENDPOINT_CONFIGS)
        current = state.get(cfg.endpoint_id)
        if current is None or cfg.config_version >= current.config_version:
            state.put(cfg.endpoint_id, cfg)
            self._configs[cfg.endpoint_id] = cfg

    def process_element(self, value: Any, ctx: KeyedBroadcastProcessFunction.ReadOnlyContext):  # type: ignore[override]
        endpoint_id, (kind, item) = value
        self._parked.pop(endpoint_id, None)
        q = self._queue(endpoint_id, ctx.timer_service().current_processing_time())
        if kind == NEW:
            d: NewDelivery = item
            if d.delivery_id not in q.items:
                self._payloads.put(d.delivery_id, d.event.payload)
                p = logic.Pending(delivery=_light(d), next_attempt_at_ms=d.created_at_ms)
                self._save(q, p)
                # The fast path for a burst of new deliveries: start making this one durable now
                # and let the endpoint's timer do the rest, instead of a full pass per element.
                if self._writes_in_flight < self._settings.cassandra.max_concurrent_writes:
                    now = ctx.timer_service().current_processing_time()
                    io = self._io.setdefault(endpoint_id, {})
                    self._start_persist(q, io, p, d, now)
                    self._history.flush_if_due()
                    self._schedule_wake(ctx, endpoint_id, now + self._settings.dispatch.harvest_interval_ms, now)
                    return
        elif kind == REPLAY:
            r: ReplayRequest = item
            self._m["replays"].inc()
            existing = q.items.get(r.delivery_id)
            if existing is not None:
                self._save(q, replace(existing, manual_requests=existing.manual_requests + 1))
            else:
                self._replays.put(r.delivery_id, r)
                self._replay_keys.add(endpoint_id)
        yield from self._drive(ctx)

    def on_timer(self, timestamp: int, ctx: KeyedBroadcastProcessFunction.OnTimerContext):  # type: ignore[override]
        key = ctx.get_current_key()
        if self._wakes.get(key) == timestamp:
            self._wakes[key] = None
        now = ctx.timer_service().current_processing_time()
        if self._still_parked(key, now):
            io = self._io.get(key)
            wake = _earliest(now + self._slot_wait_ms(key), self._parked[key][1])
            if io:
                wake = _earliest(wake, now + self._poll_interval_ms(io, now))
            self._schedule_wake(ctx, key, wake, now)
            return
        yield from self._drive(ctx)

    def _still_parked(self, endpoint_id: str, now: int) -> bool:
        """Whether a full pass would find exactly what the last one found: due work and no slot.

        A tenant at its in-flight quota can have a thousand endpoints waiting for a slot; a full
        pass for each of them, every time it re-checks, took most of a core from every other
        tenant (measured with 1,000 hanging endpoints). Nothing a pass depends on changes
        unnoticed here: new deliveries and replays arrive through process_element (which unparks),
        config changes replace the config object, finished I/O is seen in its future, write
        retries, breaker probes and a periodic full pass are in the park's deadline, and a slot
        for this endpoint shows up as a grant."""
        parked = self._parked.get(endpoint_id)
        if parked is None:
            return False
        cfg, until = parked
        if now >= until or self._configs.get(endpoint_id) is not cfg:
            return False
        io = self._io.get(endpoint_id)
        if io and any(fut.done() for _, fut in io.values()):
            return False
        self._fair.grant(now)
        return not self._fair.has_grant(endpoint_id)

    def _slot_wait_ms(self, endpoint_id: str) -> int:
        """How long to wait before looking for a slot again: doubling from 10 ms to about a
        second, jittered, so endpoints that started waiting together (one event fanned out to a
        tenant's thousand endpoints) do not wake together. Flink fires every due timer in one
        go, and a synchronized crowd of them stalls the other tenants' records behind it."""
        waits = self._slot_waits.get(endpoint_id, 0) + 1
        self._slot_waits[endpoint_id] = waits
        backoff = min(1000, 5 * 2 ** min(waits, 8))
        return int(backoff * (0.5 + 0.5 * self._rng.random()))

    # -- keyed state, mirrored by the in-memory index ----------------------------------------------
    def _queue(self, endpoint_id: str, now: int) -> logic.EndpointQueue:
        """This endpoint's index; built from keyed state the first time this incarnation sees
        the endpoint, which is also when work an older incarnation left half-done is adopted."""
        q = self._queues.get(endpoint_id)
        if q is None:
            q = logic.EndpointQueue()
            for did, p in list(self._pending.items()):
                # Only a restore leaves entries here for an index that does not exist yet.
                self._m["adopted_after_restore"].inc()
                adopted = logic.adopt_orphans(p, self._incarnation, now)
                if adopted is not p:
                    self._pending.put(did, adopted)
                q.put(adopted)
            self._queues[endpoint_id] = q
        return q

    def _save(self, q: logic.EndpointQueue, p: logic.Pending) -> None:
        q.put(p)
        self._pending.put(p.delivery.delivery_id, p)

    @staticmethod
    def _mark(q: logic.EndpointQueue, p: logic.Pending) -> None:
        """Change the in-memory index only. Keyed state keeps an earlier version that a restore
        handles the same way (an unowned write is redone, a due delivery is sent), so the state
        write is saved."""
        q.put(p)

    def _start_persist(self, q: logic.EndpointQueue, io: IoMap,
                       p: logic.Pending, full: NewDelivery, now: int) -> None:
        did = p.delivery.delivery_id
        self._mark(q, replace(p, owner=self._incarnation))
        io[did] = ("persist", self._history.persist(full, self._claim_event_row(full.event.event_id)))
        self._started[did] = now
        self._writes_in_flight += 1

    def _drop(self, q: logic.EndpointQueue, did: str) -> None:
        q.remove(did)
        self._pending.remove(did)
        self._payloads.remove(did)

    def _full(self, p: logic.Pending) -> NewDelivery:
        """The delivery with its payload bytes, which live in their own state entry."""
        d = p.delivery
        return replace(d, event=replace(d.event, payload=self._payloads.get(d.delivery_id) or b""))

    # -- the loop body ---------------------------------------------------------------------------
    def _drive(self, ctx: Any):
        endpoint_id: str = ctx.get_current_key()
        now = ctx.timer_service().current_processing_time()
        self._parked.pop(endpoint_id, None)
        cfg = self._config(ctx, endpoint_id)
        io = self._io.setdefault(endpoint_id, {})
        q = self._queue(endpoint_id, now)
        breaker_before = self._breakers.get(endpoint_id)
        if breaker_before is None:
            breaker_before = self._breaker.value() or brk.BreakerState()

        breaker, signals = self._harvest(q, io, breaker_before, now)
        for signal in signals:
            yield signal.to_json().decode()
        self._start_replay_loads(endpoint_id, io)

        sendable, why_not = self._sendable(cfg)
        if cfg is not None and cfg.status is EndpointStatus.DELETED:
            self._fail_all_ready(q, now, "endpoint deleted")
        in_flight = sum(1 for kind, _ in io.values() if kind == "send")
        limits = logic.Limits(max_in_flight=(cfg.max_in_flight if cfg and cfg.max_in_flight
                                             else self._settings.dispatch.default_max_in_flight))
        granted = 0
        free = max(0, limits.max_in_flight - in_flight)
        if sendable and cfg is not None and free and q.has_due(now):
            granted = self._fair.acquire_uncontended(cfg.tenant_id, free)
            if not granted:
                self._fair.request(endpoint_id, cfg.tenant_id, q.due_kind(now), q.oldest_due(now))
                self._fair.grant(now)
                granted = self._fair.take_grant(endpoint_id)
        # While not sendable, look at many due deliveries so expiry stays visible.
        cands, next_ready = q.candidates(now, granted + 1 if sendable else 1000)
        for i, p in enumerate(cands):
            expired = logic.expire_if_past_deadline(p, now)
            if expired is not p:
                self._save(q, expired)
                cands[i] = expired
        bucket = self._bucket_for(cfg, now)
        plan, breaker, bucket = logic.plan(
            cands if sendable else [p for p in cands if p.stage is not logic.Stage.READY],
            in_flight, limits, breaker, bucket, now, granted)
        if granted > len(plan.send) and cfg is not None:
            self._fair.release(cfg.tenant_id, granted - len(plan.send))
        if not q.has_due(now) and not plan.wanting_slots:
            self._fair.cancel(endpoint_id)

        by_id = {p.delivery.delivery_id: p for p in cands}
        sending = set(plan.send)
        for p in cands:  # due but not sent this time: back onto the heap
            if p.stage is logic.Stage.READY and p.delivery.delivery_id not in sending:
                q.put(p)
        # History writes in flight are bounded for the whole instance; what does not fit stays
        # unowned in the index and goes at the next call. Records first: they finish deliveries.
        budget = max(0, self._settings.cassandra.max_concurrent_writes - self._writes_in_flight)
        records = plan.record[:budget]
        persists = plan.persist[:max(0, budget - len(records))]
        if len(records) + len(persists) < len(plan.record) + len(plan.persist):
            plan.wake(now + 5)
        for did in persists:
            self._start_persist(q, io, by_id[did], self._full(by_id[did]), now)
        for did in records:
            p = by_id[did]
            self._mark(q, replace(p, owner=self._incarnation))
            assert p.record is not None
            io[did] = ("record", self._history.record(p.delivery, p.record, p.attempt_count))
            self._started[did] = now
        self._writes_in_flight += len(records)
        self._history.flush_if_due()
        if plan.send:
            assert cfg is not None
            keys = self._live_keys(cfg, now)
            sends = []
            for did in plan.send:
                p = logic.start_sending(by_id[did], self._incarnation)
                if p.sending_manual:
                    self._save(q, p)  # a restore must know a manual send is owed again
                else:
                    # State keeps the entry READY (or PERSIST, see below) and due: a restore
                    # sends it again exactly as it would an interrupted SENDING. One state
                    # write per attempt saved.
                    self._mark(q, p)
                sends.append(self._send(replace(p, delivery=self._full(p)), cfg, keys))
                self._started[did] = now
            # One wake-up of the I/O loop for the whole batch, not one per request.
            for did, fut in zip(plan.send, self._rt.submit_all(sends), strict=True):
                io[did] = ("send", fut)
            self._m["attempts"].inc(len(plan.send))

        if breaker != breaker_before:
            self._breaker.update(breaker)
        self._breakers[endpoint_id] = breaker
        if bucket is not None:
            self._bucket.update(bucket)
        wake = _earliest(plan.wake_at_ms, next_ready)
        if plan.wanting_slots:
            # Waiting for a slot (the pool or the tenant's quota is full). Back off: a tenant with
            # a thousand endpoints waiting on its own quota must not burn the CPU that other
            # tenants' deliveries need by re-checking every few milliseconds.
            wake = _earliest(wake, now + self._slot_wait_ms(endpoint_id))
            if not plan.send:
                self._parked[endpoint_id] = (cfg, _earliest(plan.wake_at_ms, now + _PARK_MAX_MS) or 0)
        elif plan.send:
            self._slot_waits.pop(endpoint_id, None)
        if not sendable and why_not == "disabled":
            # Held while disabled; wake for the earliest deadline so expiry stays visible.
            held = [p.delivery.expires_at_ms for p in cands if p.stage is logic.Stage.READY]
            wake = _earliest(wake, min(held) if held else None)
        if cfg is None and q.items:
            wake = _earliest(wake, now + 100)  # the config broadcast has not reached us yet
        if io:
            wake = _earliest(wake, now + self._poll_interval_ms(io, now))
        self._schedule_wake(ctx, endpoint_id, wake, now)
        if not q.items and not io:
            # Nothing pending: free the index and mirrors (state keeps the breaker).
            del self._queues[endpoint_id]
            self._breakers.pop(endpoint_id, None)
            self._slot_waits.pop(endpoint_id, None)

    # -- in-memory mirrors: read every pass, so kept off the state backend's round trips ---------
    def _config(self, ctx: Any, endpoint_id: str) -> EndpointConfig | None:
        if endpoint_id not in self._configs:
            self._configs[endpoint_id] = ctx.get_broadcast_state(ENDPOINT_CONFIGS).get(endpoint_id)
        return self._configs[endpoint_id]

    def _gone_at(self, endpoint_id: str) -> int | None:
        if endpoint_id not in self._gones:
            self._gones[endpoint_id] = self._gone.value()
        return self._gones[endpoint_id]

    def _claim_event_row(self, event_id: str) -> bool:
        """Write each event's payload row once per incarnation, not once per delivery. A failed
        persist un-claims it, and that delivery stays PERSIST (in state) until the row is written,
        so the row is never missing for good."""
        if event_id in self._events_written:
            self._events_written.move_to_end(event_id)
            return False
        self._events_written[event_id] = None
        if len(self._events_written) > 100_000:
            self._events_written.popitem(last=False)
        return True

    def _harvest(self, q: logic.EndpointQueue, io: IoMap,
                 breaker: brk.BreakerState, now: int) -> tuple[brk.BreakerState, list[EndpointSignal]]:
        """Apply every finished I/O of this endpoint; returns signals for the control plane."""
        signals: list[EndpointSignal] = []
        for did, (kind, fut) in list(io.items()):
            if not fut.done():
                continue
            del io[did]
            self._started.pop(did, None)
            if kind in ("persist", "record"):
                self._writes_in_flight -= 1
            if kind == "load":
                self._finish_replay_load(q, did, fut)
                continue
            p = q.items.get(did)
            if p is None:
                continue
            exc = fut.exception()
            if kind == "persist":
                if exc:
                    self._m["history_write_failures"].inc()
                    self._events_written.pop(p.delivery.event.event_id, None)
                    log.warning("persisting %s failed, will retry: %s", did, redact(str(exc)))
                    self._save(q, logic.after_write_failed(p, now))
                else:
                    # In memory only: state keeps PERSIST, which a restore redoes (an idempotent
                    # upsert) before sending. The next state write (the attempt's outcome)
                    # supersedes it; one state write per delivery saved.
                    self._mark(q, replace(p, stage=logic.Stage.READY, owner="", write_failures=0))
            elif kind == "send":
                self._fair.release(p.delivery.tenant_id)
                report = fut.result() if exc is None else _internal_error_report(p, exc, now)
                p, breaker = logic.apply_result(p, report, breaker, self._breaker_cfg, self._schedule, self._rng)
                assert p.record is not None
                self._count(p.record)
                if p.record.disable_endpoint:
                    # Stop sending at once; the control plane makes it a real, audited disable.
                    self._gone.update(report.endpoint_config_version)
                    self._gones[p.delivery.endpoint_id] = report.endpoint_config_version
                    self._m["endpoints_disabled"].inc()
                    signals.append(EndpointSignal(
                        endpoint_id=p.delivery.endpoint_id, tenant_id=p.delivery.tenant_id,
                        config_version=report.endpoint_config_version, signal="gone",
                        detail=f"receiver answered 410 Gone for delivery {did}", at_ms=now))
                self._save(q, p)
            elif kind == "record":
                if exc:
                    self._m["history_write_failures"].inc()
                    log.warning("writing history of %s failed, will retry: %s", did, redact(str(exc)))
                    self._save(q, logic.after_write_failed(p, now))
                else:
                    nxt = logic.after_record_written(p)
                    if nxt is None:
                        self._drop(q, did)
                    else:
                        self._save(q, nxt)
        return breaker, signals

    def _count(self, r: logic.AttemptRecord) -> None:
        name = {"succeeded": "succeeded", "retry": "retried", "failed": "failed", "expired": "expired"}[r.outcome]
        self._m[name].inc()

    # -- replays ---------------------------------------------------------------------------------
    def _start_replay_loads(self, endpoint_id: str, io: IoMap) -> None:
        # Replays are rare: only look at the state of endpoints known to have some (after a
        # restore every endpoint is looked at once, since the marker set is in memory).
        if endpoint_id in self._replays_checked and endpoint_id not in self._replay_keys:
            return
        self._replays_checked.add(endpoint_id)
        self._replay_keys.discard(endpoint_id)
        for did, _r in list(self._replays.items()):
            self._replay_keys.add(endpoint_id)
            if did not in io:
                self._started[did] = int(time.time() * 1000)
                io[did] = ("load", self._rt.submit(self._history.load_for_replay(did)))

    def _finish_replay_load(self, q: logic.EndpointQueue, did: str, fut: Completion) -> None:
        if fut.exception() is not None:
            return  # the marker stays; the next drive loads again
        self._replays.remove(did)
        loaded = fut.result()
        if loaded is None:
            self._m["replays_unknown"].inc()
            log.warning("replay of unknown or expired delivery %s ignored", did)
            return
        d, attempt_count, auto_active = loaded
        existing = q.items.get(did)
        if existing is not None:
            self._save(q, replace(existing, manual_requests=existing.manual_requests + 1))
        else:
            self._payloads.put(did, d.event.payload)
            self._save(q, logic.Pending(
                delivery=_light(d), stage=logic.Stage.READY, attempt_count=attempt_count,
                next_attempt_at_ms=d.created_at_ms, auto_retry_active=auto_active, manual_requests=1))

    # -- helpers ---------------------------------------------------------------------------------
    def _sendable(self, cfg: EndpointConfig | None) -> tuple[bool, str]:
        if cfg is None:
            return False, "unknown"
        if cfg.status is not EndpointStatus.ACTIVE:
            return False, "disabled"
        gone_at = self._gone_at(cfg.endpoint_id)
        if gone_at is not None:
            if cfg.config_version <= gone_at:
                return False, "disabled"
            self._gone.clear()  # a person re-enabled or changed the endpoint after the 410
            self._gones[cfg.endpoint_id] = None
        return True, ""

    def _fail_all_ready(self, q: logic.EndpointQueue, now: int, reason: str) -> None:
        for p in list(q.items.values()):
            if p.stage is not logic.Stage.READY:
                continue
            record = logic.AttemptRecord(
                attempt_number=0, started_at_ms=now, finished_at_ms=now, http_status=None, outcome="failed",
                error_class=None, detail=reason, manual=False, delivery_status="failed",
                next_attempt_at_ms=None, auto_retry_active=False)
            self._save(q, replace(p, stage=logic.Stage.RECORDING, owner="", auto_retry_active=False,
                                  manual_requests=0, record=record))

    def _bucket_for(self, cfg: EndpointConfig | None, now: int) -> ratelimit.TokenBucket | None:
        if cfg is None or not cfg.rate_limit_per_s:
            return None
        bucket = self._bucket.value()
        if bucket is None or bucket.rate_per_s != cfg.rate_limit_per_s:
            bucket = ratelimit.new_bucket(cfg.rate_limit_per_s, now)
        return bucket

    def _live_keys(self, cfg: EndpointConfig, now: int) -> list[tuple[int, bytes]]:
        live = sorted((k for k in cfg.signing_keys if k.not_after_ms is None or k.not_after_ms > now),
                      key=lambda k: -k.version)
        out = []
        for k in live:
            cache_key = (cfg.endpoint_id, k.version)
            if cache_key not in self._keys:
                whsec = decrypt_secret(self._master_key, k.ciphertext_b64, tenant_id=cfg.tenant_id,
                                       endpoint_id=cfg.endpoint_id, key_version=k.version)
                self._keys[cache_key] = secret_bytes(whsec)
            out.append((k.version, self._keys[cache_key]))
        return out

    async def _send(self, p: logic.Pending, cfg: EndpointConfig, keys: list[tuple[int, bytes]]) -> logic.SendReport:
        e = p.delivery.event
        started = int(time.time() * 1000)
        headers = build_headers(
            p.delivery.delivery_id, started // 1000, e.payload, keys, event_type=e.event_type,
            event_id=e.event_id, occurred_at_ms=e.occurred_at_ms, schema_version=e.schema_version)
        headers["user-agent"] = self._settings.dispatch.user_agent
        r = await self._sender.send(cfg.url, e.payload, headers)
        finished = int(time.time() * 1000)
        error = ErrorClass(r.error) if r.error else None
        return logic.SendReport(
            result=HttpResult(status=r.status, error=error, retry_after=getattr(r, "retry_after", None),
                              detail=r.error_detail or ""),
            started_at_ms=started, finished_at_ms=finished, url=cfg.url,
            endpoint_config_version=cfg.config_version, latency_ms=r.latency_ms,
            response_sha256=r.response_sha256 or "", response_prefix=r.response_prefix or "",
            signing_key_versions=tuple(v for v, _ in keys))

    def _poll_interval_ms(self, io: IoMap, now: int) -> int:
        """How soon to look at this endpoint's I/O again. Young requests are checked every
        harvest interval; a request that has run for a while is checked at a quarter of its age
        (at most once a second), so a thousand hanging endpoints cost about a thousand timer
        calls per second instead of a hundred thousand, and a slow answer is noticed within
        ~25 % of its latency."""
        base = self._settings.dispatch.harvest_interval_ms
        youngest = max((self._started.get(did, now) for did in io), default=now)
        return max(base, min(1000, (now - youngest) // 4))

    def _schedule_wake(self, ctx: Any, endpoint_id: str, wake: int | None, now: int) -> None:
        """Register a timer unless an earlier one is already set. Which timers are set is known
        in memory only: after a restore Flink re-fires the checkpointed timers, and the worst case
        is one redundant timer, which just runs a pass that finds nothing to do."""
        if wake is None:
            return
        wake = max(wake, now + 1)
        current = self._wakes.get(endpoint_id)
        if current is not None and now < current <= wake:
            return  # an earlier timer is already set; it will re-plan
        ctx.timer_service().register_processing_time_timer(wake)
        self._wakes[endpoint_id] = wake


def _light(d: NewDelivery) -> NewDelivery:
    """The delivery without its payload: the bytes sit once in their own state entry, so the
    small record rewritten at every stage change stays small."""
    return replace(d, event=replace(d.event, payload=b""))


def _earliest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _internal_error_report(p: logic.Pending, exc: BaseException, now: int) -> logic.SendReport:
    return logic.SendReport(
        result=HttpResult(status=None, error=ErrorClass.INTERNAL, detail=redact(repr(exc))[:300]),
        started_at_ms=now, finished_at_ms=now, url="", endpoint_config_version=p.delivery.endpoint_config_version)
