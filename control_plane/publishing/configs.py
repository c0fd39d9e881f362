"""Getting stored endpoint configs onto webhooks.endpoints, and the leased config clock after them.

Writing Cassandra and then Kafka is a dual write: the process can die, or Kafka can refuse,
between the two. The endpoint row is the source of truth and carries ``published_version``;
:meth:`ConfigPublication.publish_latest` publishes whatever the row holds *now* and then raises
``published_version``, and the server's republisher loop calls it for every row left behind.

The leased clock. A tick carries T, this process's time when it decided the tick, and the lease L
(``control_plane.config_lease_ms``), and promises: every config change that is not on the topic
before the tick is acknowledged by the API no earlier than T + L. Fan-out, having read the tick,
fans out at once every event that arrived before T + L (:mod:`core.fanout`), so with ticks every
L/4 no event waits and none is held. What keeps the promise here:

* Acknowledgement after a confirmed publish: :meth:`ConfigPublication.try_publish` answers L after
  Kafka confirmed the config (after it found the row already confirmed, for a retried request). A
  tick that precedes the config on the (single-partition) topic was decided before that
  confirmation, so its T is at most the confirmation time, and T + L at most the answer.
* Acknowledgement of a change whose publish failed (the row is stored; the answer says
  ``published_version`` 0 and the republisher publishes it later): the change *holds* the clock
  from just before its Cassandra write until Kafka confirms its config, so no tick this process
  decides meanwhile carries T past the hold, and the answer waits L plus
  ``hold_scan_interval_ms`` after the failure. A publish that fails writes a durable hold row
  (``config_holds``) that every replica reads at most that interval later (not on every tick:
  that cost Cassandra CPU at idle, docs/performance-log.md, the config path); a replica's ticks
  decided before its read carry T no later than the failure plus the interval, which the answer
  waited out. Ticks decided once the hold is read do not advance until some replica publishes the
  config; after that, ticks come after the config on the topic. Held ticks stop, so fan-out holds
  the events past the last horizon until the config and a tick arrive, or until its degraded
  release (``config_clock_stale_after_ms``), as before leases.
* Holds are durable because the endpoint row is: every row the republisher finds behind
  (``published_version < config_version``) is held from its ``updated_at`` until it is published,
  and a starting process publishes no tick before one full pass has read them all -- so a crash
  between the Cassandra write and the publish (or a change made by another replica) never lets the
  clock pass a stored config, and a client's retry of the unanswered request is answered L after
  the row is found confirmed.
* Clocks: T is this process's time, the events' arrival is Kafka's, and another replica's ticks
  carry its own time; fan-out takes ``config_clock_skew_ms`` off every horizon for that.
* No durable hold. If Cassandra fails after the change's row is written and before a durable
  hold is (the audit row, written before the publish; or the hold row, after a failed publish),
  only this replica's clock is held, in memory. Another replica learns of the change when a
  republisher pass of its own finds the row behind and holds it from then on, so its ticks that
  precede the config on the topic carry T < write + ``republish_interval_s`` + two passes'
  durations (a pass that just missed the row, then the next, which reaches it). The answer comes
  at the failure + L + ``hold_scan_interval_ms``, so fan-out may match an event committed up to
  ``republish_interval_s`` - ``hold_scan_interval_ms`` (+ two passes - ``config_clock_skew_ms``)
  after the acknowledgement without the change: 4 s with the defaults
  (tests/unit/control_plane/endpoints/test_config_lease.py). A replica that cannot read Cassandra at all stops ticking
  within ``hold_scan_interval_ms`` (its hold scan fails), so with Cassandra down none ticks.

So a change is acknowledged after at most one lease (one lease plus the scan interval after a
failed publish), and every event committed after its acknowledgement is matched against it --
except, for the bounded time above, when Cassandra failed before its durable hold was written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from control_plane.domain import Endpoint, EndpointVersion
from control_plane.errors import Unavailable
from control_plane.publishing.publisher import Publisher, PublishError
from control_plane.store import EndpointStore
from core.records import ConfigClock

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)  # identity equality: two holds on one version are distinct
class Hold:
    tenant_id: str
    endpoint_id: str
    version: int
    since_ms: int


@dataclass
class PublishWatermark:
    """The oldest change not yet confirmed by Kafka; the clock's value may not pass it."""

    _holds: set[Hold] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, tenant_id: str, endpoint_id: str, version: int, now_ms: int) -> Hold:
        h = Hold(tenant_id, endpoint_id, version, now_ms)
        with self._lock:
            self._holds.add(h)
        return h

    def release(self, hold: Hold) -> None:
        """The change was never stored (refused, lost a race, storage failed)."""
        with self._lock:
            self._holds.discard(hold)

    def published(self, endpoint_id: str, version: int) -> None:
        """Kafka confirmed ``version``: every hold on it or an older version is satisfied."""
        with self._lock:
            self._holds = {
                h for h in self._holds if not (h.endpoint_id == endpoint_id and h.version <= version)
            }

    def held_before(self, since_ms: int) -> set[tuple[str, str]]:
        """(tenant_id, endpoint_id) of the holds taken before ``since_ms``."""
        with self._lock:
            return {(h.tenant_id, h.endpoint_id) for h in self._holds if h.since_ms < since_ms}

    def clock_value(self, now_ms: int) -> int:
        with self._lock:
            oldest = min((h.since_ms for h in self._holds), default=None)
        return now_ms if oldest is None else min(now_ms, oldest - 1)


class ConfigPublication:
    def __init__(
        self,
        store: EndpointStore,
        publisher: Publisher,
        now_ms: Callable[[], int],
        *,
        lease_ms: int,
        sleep_ms: Callable[[int], None] = lambda ms: time.sleep(ms / 1000),
        watermark: PublishWatermark | None = None,
        hold_scan_interval_ms: int = 1000,
    ) -> None:
        self._store = store
        self._lease_ms = lease_ms
        self._sleep_ms = sleep_ms
        self._hold_scan_interval_ms = hold_scan_interval_ms
        # (when read, oldest durable hold then); None: read it at the next tick.
        self._durable: tuple[int, int | None] | None = None
        self._publisher = publisher
        self._now_ms = now_ms
        self.watermark = watermark or PublishWatermark()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._last_clock_ms = 0
        # No tick before one complete pass over the rows: a config stored by a process that died
        # before publishing it must be held (or published) before the clock can pass it.
        self._recovered = threading.Event()

    def _lock_for(self, endpoint_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(endpoint_id, threading.Lock())

    def publish_latest(self, tenant_id: str, endpoint_id: str) -> Endpoint | None:
        """Publish the stored config if Kafka has not confirmed it; return the row as marked.

        Serialised per endpoint and always publishing the row as read under the lock, so an
        older version can never land on the compacted topic after a newer one from this process.
        Raises PublishError or Unavailable; the row then stays unpublished for the republisher.
        """
        with self._lock_for(endpoint_id):
            endpoint = self._store.get_endpoint(tenant_id, endpoint_id)
            if endpoint is None:
                return None
            if endpoint.published_version >= endpoint.config_version:
                self.watermark.published(endpoint_id, endpoint.published_version)
                return endpoint
            # Found behind (a failed publish, a process that died, another replica): hold the
            # clock at its write until Kafka confirms it. Released by published() below.
            since = min(endpoint.updated_at_ms, self._now_ms())
            self.watermark.hold(tenant_id, endpoint_id, endpoint.config_version, since)
            # The audit row goes first: no config reaches the job without its version audited.
            self._store.put_version(EndpointVersion.of(endpoint))
            try:
                self._publisher.publish_config(endpoint.to_config(self._now_ms()))
            except PublishError:
                # Stored (and about to be acknowledged) but not on the topic: hold every
                # replica's clock at it, durably, until some replica's publish succeeds.
                self._store.put_clock_hold(tenant_id, endpoint_id, endpoint.config_version, since)
                self._durable = None
                raise
            # Before the mark: a row marked published never leaves a durable hold behind.
            self._store.clear_clock_holds(tenant_id, endpoint_id, endpoint.config_version)
            self._durable = None
            self._store.mark_published(tenant_id, endpoint_id, endpoint.config_version)
            self.watermark.published(endpoint_id, endpoint.config_version)
            return endpoint

    def try_publish(self, tenant_id: str, endpoint_id: str) -> int:
        """Publish after a change, then wait out the lease (see the module doc): the caller
        acknowledges the change when this returns. On failure leave it to the republisher.
        Returns the version Kafka has confirmed (0 if none yet), for the response."""
        try:
            endpoint = self.publish_latest(tenant_id, endpoint_id)
        except (PublishError, Unavailable) as exc:
            log.warning("config of %s not published yet, republisher will retry: %s", endpoint_id, exc)
            # Other replicas may tick past the change until they read its durable hold.
            self._sleep_ms(self._lease_ms + self._hold_scan_interval_ms)
            return 0
        self._sleep_ms(self._lease_ms)
        return 0 if endpoint is None else endpoint.config_version

    def republish_pending(self) -> int:
        """One reconciliation pass; returns how many lagging rows it brought up to date. Raises
        Unavailable if the rows cannot be read (then nothing is settled)."""
        published = 0
        started = self._now_ms()
        tried: set[tuple[str, str]] = set()
        for tenant_id, endpoint_id in self._store.iter_unpublished():
            tried.add((tenant_id, endpoint_id))
            try:
                if self.publish_latest(tenant_id, endpoint_id) is not None:
                    published += 1
            except (PublishError, Unavailable) as exc:  # still held: a later pass publishes it
                log.warning("republish of %s failed, next pass retries: %s", endpoint_id, exc)
        # Holds older than this pass whose rows it did not find behind were published by someone
        # else (another replica, a retried request): reading each row again releases them.
        # Younger holds belong to requests in flight, which release their own.
        for tenant_id, endpoint_id in self.watermark.held_before(started) - tried:
            try:
                self.publish_latest(tenant_id, endpoint_id)
            except (PublishError, Unavailable) as exc:
                log.warning("republish of %s failed, next pass retries: %s", endpoint_id, exc)
        self._recovered.set()
        return published

    def _durable_hold(self, now_ms: int) -> int | None:
        cached = self._durable
        if cached is None or now_ms - cached[0] >= self._hold_scan_interval_ms:
            cached = self._durable = (now_ms, self._store.oldest_clock_hold_ms())
        return cached[1]

    @property
    def recovered(self) -> bool:
        return self._recovered.is_set()

    def publish_clock(self) -> bool:
        """Publish the clock if it moved; False while a change holds it at the same value, and
        before the first complete republisher pass of this process."""
        if not self._recovered.is_set():
            return False
        now = self._now_ms()
        value = self.watermark.clock_value(now)
        durable = self._durable_hold(now)  # any replica's failed publishes
        if durable is not None:
            value = min(value, durable - 1)
        if value <= self._last_clock_ms:
            return False
        self._publisher.publish_clock(ConfigClock(published_at_ms=value, lease_ms=self._lease_ms))
        self._last_clock_ms = value
        return True
