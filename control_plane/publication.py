"""Getting stored endpoint configs onto webhooks.endpoints, and the config clock after them.

Writing Cassandra and then Kafka is a dual write: the process can die, or Kafka can refuse,
between the two. The endpoint row is the source of truth and carries ``published_version``;
:meth:`ConfigPublication.publish_latest` publishes whatever the row holds *now* and then raises
``published_version``, and the server's republisher loop calls it for every row left behind.

The config clock tells the job "every config stored before T is on the topic". A change holds
the clock from just before its Cassandra write until Kafka confirms its config (by the request
or, after a failure, by the republisher), so the clock can never pass a stored-but-unpublished
config. This covers changes made by this process: with several replicas, one of them (elected) must run
the clock and republisher loops, and the others forward their holds or do not take writes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from control_plane.domain import Endpoint, EndpointVersion
from control_plane.errors import Unavailable
from control_plane.publisher import Publisher, PublishError
from control_plane.store import EndpointStore
from core.records import ConfigClock

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)  # identity equality: two holds on one version are distinct
class Hold:
    endpoint_id: str
    version: int
    since_ms: int


@dataclass
class PublishWatermark:
    """The oldest change not yet confirmed by Kafka; the clock may not pass it."""

    _holds: set[Hold] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, endpoint_id: str, version: int, now_ms: int) -> Hold:
        h = Hold(endpoint_id, version, now_ms)
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
        watermark: PublishWatermark | None = None,
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._now_ms = now_ms
        self.watermark = watermark or PublishWatermark()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._last_clock_ms = 0

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
            # The audit row goes first: no config reaches the job without its version audited.
            self._store.put_version(EndpointVersion.of(endpoint))
            self._publisher.publish_config(endpoint.to_config(self._now_ms()))
            self._store.mark_published(tenant_id, endpoint_id, endpoint.config_version)
            self.watermark.published(endpoint_id, endpoint.config_version)
            return endpoint

    def try_publish(self, tenant_id: str, endpoint_id: str) -> int:
        """Publish after a change; on failure leave it to the republisher. Returns the version
        Kafka has confirmed (0 if none yet), for the response."""
        try:
            endpoint = self.publish_latest(tenant_id, endpoint_id)
        except (PublishError, Unavailable) as exc:
            log.warning("config of %s not published yet, republisher will retry: %s", endpoint_id, exc)
            return 0
        return 0 if endpoint is None else endpoint.config_version

    def republish_pending(self) -> int:
        """One reconciliation pass; returns how many lagging rows it brought up to date."""
        published = 0
        for tenant_id, endpoint_id in self._store.iter_unpublished():
            try:
                if self.publish_latest(tenant_id, endpoint_id) is not None:
                    published += 1
            except (PublishError, Unavailable) as exc:
                log.warning("republish of %s failed, next pass retries: %s", endpoint_id, exc)
        return published

    def publish_clock(self) -> bool:
        """Publish the clock if it moved; False while a change holds it at the same value."""
        value = self.watermark.clock_value(self._now_ms())
        if value <= self._last_clock_ms:
            return False
        self._publisher.publish_clock(ConfigClock(published_at_ms=value))
        self._last_clock_ms = value
        return True
