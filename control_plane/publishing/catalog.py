"""Getting the stored catalog onto webhooks.endpoints, never behind what Cassandra holds.

The endpoints topic is compacted by record key, so a job rebuilt from it reads only the last
record of each catalog key: a stale record last (a retried call that read the row before a
concurrent change, or two replicas whose publishes Kafka takes out of order) would stay in the
job until the key's next change, whatever fan-out does about order. Two rules keep the last
record of every key the stored one:

* Publish what is stored, read back. A change publishes the row as read after its write, and
  reads it again once Kafka confirmed the records: if the row moved on meanwhile, the newer one
  is published too. A change written after that read publishes after it, so once every publish
  has completed, no key ends on a stale record. (Fan-out keeps the highest revision per key as
  well, core.schema_check.supersedes, for the records read in between.)
* An outbox. Every change writes a row to ``catalog_unpublished``
  (cassandra/schema/017_catalog_unpublished.cql) before its Cassandra write, and deletes it once
  the stored record is on the topic. A publish that fails, or a process that dies between the
  write and the publish, leaves the row, and the republisher loop (:meth:`republish_pending`,
  every ``republish_interval_s``) publishes the key's stored records and deletes the row: the
  change reaches the job without the client retrying, at the first pass once the row is
  ``in_flight_ms`` old -- within ``in_flight_ms`` + ``republish_interval_s`` (+ one pass) of the
  change. Younger rows belong to requests that may still be between their write and their
  publish; taking them would put a duplicate on the topic for most changes. (A request stuck
  longer than ``in_flight_ms`` before a failing publish is left to the client's retry, which its
  UNAVAILABLE answer asks for.)

Revisions: a type's is its row's ``revision`` (one conditional write per change); settings and
pins are plain last-write-wins rows, and their revision is the row's write time, which is what
Cassandra orders their writes by -- the highest is the one it holds.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from control_plane.errors import ControlPlaneError, Unavailable
from core.records import CatalogRecord

log = logging.getLogger(__name__)

TYPE, SETTINGS, PINS = "type", "settings", "pins"  # what a key is: name is the type, "", the endpoint
# Longer than a request takes from its outbox row to its publish's answer: a few Cassandra
# round trips and Kafka's delivery timeout (10 s) plus the lease.
IN_FLIGHT_MS = 30_000
# Reads after a publish that found the row moved on again: each move is a change that publishes
# after its own write, so stopping early leaves nothing stale; this only bounds one call's work.
MAX_CHASES = 5

T = TypeVar("T")


@dataclass(frozen=True)
class Unpublished:
    """A change's outbox row: (tenant, kind, name) may be stored but not yet on the topic."""

    tenant_id: str
    kind: str
    name: str
    attempt: str
    since_ms: int


class Outbox(Protocol):
    def put_unpublished(self, item: Unpublished) -> None: ...
    def clear_unpublished(self, item: Unpublished) -> None: ...
    def list_unpublished(self) -> list[Unpublished]: ...


# (tenant_id, kind, name) -> the key's records as stored now (none if nothing is stored).
Reader = Callable[[str, str, str], Sequence[CatalogRecord]]


class CatalogPublication:
    def __init__(self, outbox: Outbox, read: Reader, publish: Callable[[Sequence[CatalogRecord]], None],
                 now_ms: Callable[[], int], *, in_flight_ms: int = IN_FLIGHT_MS,
                 new_attempt: Callable[[], str] = lambda: uuid.uuid4().hex) -> None:
        self._outbox = outbox
        self._read = read
        self._publish = publish  # returns once Kafka confirmed them, raises Unavailable (catalog_publisher)
        self._now_ms = now_ms
        self._in_flight_ms = in_flight_ms
        self._new_attempt = new_attempt

    def change(self, tenant_id: str, kind: str, name: str, write: Callable[[], T]) -> T:
        """Run ``write`` (the Cassandra change of one key), then publish the key's stored records.
        Raises Unavailable if they could not be published: stored, and the republisher sends them."""
        item = Unpublished(tenant_id, kind, name, self._new_attempt(), self._now_ms())
        self._outbox.put_unpublished(item)  # first: a process dying after the write leaves it
        try:
            result = write()
        except Unavailable:
            raise  # the write may have applied: the row stays for the republisher
        except ControlPlaneError:
            self._clear(item)  # refused: nothing was written
            raise
        self.publish_stored(tenant_id, kind, name)
        self._clear(item)
        return result

    def publish_stored(self, tenant_id: str, kind: str, name: str) -> None:
        """Publish the key's records as stored; again while the rows move on under the publish.
        (A type's records include its tenant's settings, so a settings change is chased too.)"""
        published: list[tuple[str, int]] = []
        for _ in range(MAX_CHASES):
            records = self._read(tenant_id, kind, name)
            # Stored revisions never go down: different from what was published is newer.
            revisions = [(r.key, r.revision) for r in records]
            if not records or revisions == published:
                return
            self._publish(records)
            published = revisions

    def republish_pending(self) -> int:
        """One pass over the outbox rows at least ``in_flight_ms`` old; returns how many keys it
        published. Raises Unavailable if the outbox cannot be read."""
        left_before = self._now_ms() - self._in_flight_ms
        items = [i for i in self._outbox.list_unpublished() if i.since_ms <= left_before]
        published = 0
        for key in dict.fromkeys((i.tenant_id, i.kind, i.name) for i in items):
            try:
                self.publish_stored(*key)
            except Unavailable as exc:  # the rows stay: the next pass retries
                log.warning("republish of catalog %s failed, next pass retries: %s", "/".join(key), exc)
                continue
            published += 1
            for item in items:
                if (item.tenant_id, item.kind, item.name) == key:
                    self._clear(item)
        return published

    def _clear(self, item: Unpublished) -> None:
        # Left behind, the row only costs the republisher a duplicate publish of a stored record.
        with contextlib.suppress(Unavailable):
            self._outbox.clear_unpublished(item)
