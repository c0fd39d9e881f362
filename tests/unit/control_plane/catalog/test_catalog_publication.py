"""The catalog's records on the compacted endpoints topic against what Cassandra holds
(control_plane.catalog.service, schema_pins), on in-memory fakes: a retried call, or a second replica,
racing a change must not leave a stale record last on the topic -- a job rebuilt from the
compacted topic reads only the last record of each key."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from control_plane import errors
from control_plane.catalog.service import (
    Caller,
    CatalogDeps,
    CatalogService,
    EventTypeEntry,
    ReplayRuleEntry,
    stored_records,
)
from control_plane.cursor import Cursors
from control_plane.domain import Tenant
from control_plane.endpoints.schema_pins import SchemaPins
from control_plane.publishing.catalog import CatalogPublication, Unpublished
from core.records import CatalogRecord, CatalogTypeRecord, ConfigClock
from core.schema_check import CatalogIndex
from operators.fanout import FanOut
from tests.unit.operators.test_fanout_schemas import BroadcastState, Ctx, RuntimeContext, send

T0 = 1_767_225_600_000
# Closed objects: adding a typed optional property is additive only where nothing else could have
# carried that name before (core/event_schemas.py).
SCHEMA_1_0 = '{"type": "object", "properties": {"amount": {"type": "integer"}}, "additionalProperties": false}'
SCHEMA_1_1 = ('{"type": "object", "properties": {"amount": {"type": "integer"}, "note": {"type": "string"}}, '
              '"additionalProperties": false}')
ADMIN = Caller("acme", "admin", may_write=True)


@dataclass
class Clock:
    now: int = T0

    def __call__(self) -> int:
        return self.now

    def sleep_ms(self, ms: int) -> None:
        self.now += ms


@dataclass
class MemoryCatalog:
    """event_types, event_catalog_settings, endpoint_schema_pins and replay_rules in memory. Plain rows are
    last-write-wins by write time, as in Cassandra: ``writes`` stands in for the write clock."""

    types: dict[tuple[str, str], EventTypeEntry] = field(default_factory=dict)
    settings: dict[str, tuple[str, int]] = field(default_factory=dict)
    pins: dict[tuple[str, str], tuple[tuple[int, ...], int]] = field(default_factory=dict)
    replay_rules: dict[tuple[str, str], ReplayRuleEntry] = field(default_factory=dict)
    occurred: dict[str, int] = field(default_factory=dict)
    unpublished: list[Unpublished] = field(default_factory=list)
    writes: int = 0
    failing: bool = False

    def _write_time(self) -> int:
        if self.failing:
            raise errors.Unavailable("storage unavailable")
        self.writes += 1
        return self.writes

    def get_type(self, tenant_id: str, name: str) -> EventTypeEntry | None:
        return self.types.get((tenant_id, name))

    def list_types(self, tenant_id: str, after_name: str, limit: int | None) -> list[EventTypeEntry]:
        rows = sorted((e for (t, n), e in self.types.items() if t == tenant_id and n > after_name),
                      key=lambda e: e.name)
        return rows if limit is None else rows[:limit]

    def insert_type(self, entry: EventTypeEntry) -> bool:
        self._write_time()
        return self.types.setdefault((entry.tenant_id, entry.name), entry) is entry

    def replace_type(self, entry: EventTypeEntry, expected_revision: int) -> bool:
        self._write_time()
        current = self.types.get((entry.tenant_id, entry.name))
        if current is None or current.revision != expected_revision:
            return False
        self.types[(entry.tenant_id, entry.name)] = entry
        return True

    def read_unknown_types(self, tenant_id: str) -> tuple[str, int] | None:
        return self.settings.get(tenant_id)

    def put_unknown_types(self, tenant_id: str, policy: str, at_ms: int, by: str) -> None:
        self.settings[tenant_id] = (policy, self._write_time())

    def introduced_at_ms(self) -> int | None:
        return 0

    def is_writer(self, tenant_id: str, key_id: str) -> bool:
        return True

    def set_writer(self, tenant_id: str, key_id: str, allowed: bool, at_ms: int) -> None:
        pass

    def schema_versions_of(self, event_ids: Sequence[str]) -> dict[str, str]:
        return {}

    def put_schema_pins(self, tenant_id: str, endpoint_id: str, majors: tuple[int, ...], at_ms: int,
                        by: str) -> None:
        self.pins[(tenant_id, endpoint_id)] = (majors, self._write_time())

    def get_schema_pins(self, tenant_id: str, endpoint_ids: Sequence[str]) -> dict[str, tuple[int, ...]]:
        return {e: self.pins[(tenant_id, e)][0] for e in endpoint_ids if (tenant_id, e) in self.pins}

    def read_schema_pins(self, tenant_id: str, endpoint_id: str) -> tuple[tuple[int, ...], int] | None:
        return self.pins.get((tenant_id, endpoint_id))

    def list_replay_rules(self, tenant_id: str) -> list[ReplayRuleEntry]:
        return [r for (t, _), r in sorted(self.replay_rules.items()) if t == tenant_id]

    def put_replay_rule(self, tenant_id: str, rule: ReplayRuleEntry) -> None:
        self._write_time()
        self.replay_rules[(tenant_id, rule.pattern)] = rule

    def delete_replay_rule(self, tenant_id: str, pattern: str) -> None:
        self._write_time()
        self.replay_rules.pop((tenant_id, pattern), None)

    def occurred_at_of(self, event_ids: Sequence[str]) -> dict[str, int]:
        return {e: self.occurred[e] for e in event_ids if e in self.occurred}

    def put_unpublished(self, item: Unpublished) -> None:
        self._write_time()
        self.unpublished.append(item)

    def clear_unpublished(self, item: Unpublished) -> None:
        self._write_time()
        self.unpublished.remove(item)

    def list_unpublished(self) -> list[Unpublished]:
        return list(self.unpublished)


@dataclass
class Tenants:
    def get_tenant(self, tenant_id: str) -> Tenant | None:
        return Tenant(tenant_id, tenant_id, T0)

    def get_endpoint(self, tenant_id: str, endpoint_id: str) -> None:
        return None

    def list_endpoints(self, tenant_id: str, after_id: str, limit: int) -> list[object]:
        return []


@dataclass
class Topic:
    """The endpoints topic in the order Kafka took the records. ``before_next`` runs just before
    the next publish lands: another call whose records Kafka takes first."""

    records: list[CatalogRecord] = field(default_factory=list)
    failing: bool = False
    before_next: list[Callable[[], object]] = field(default_factory=list)

    def publish(self, records: Sequence[CatalogRecord]) -> None:
        while self.before_next:
            self.before_next.pop(0)()
        if self.failing:
            raise errors.Unavailable("the change is stored but not yet sent to the delivery job; retry the call")
        self.records.extend(records)

    def compacted(self) -> list[CatalogRecord]:
        """What a job rebuilt from the compacted topic reads: the last record of each key."""
        last: dict[str, CatalogRecord] = {}
        for r in self.records:
            last.pop(r.key, None)
            last[r.key] = r
        return list(last.values())


@dataclass
class World:
    store: MemoryCatalog
    topic: Topic
    clock: Clock
    publications: list[CatalogPublication]
    services: list[CatalogService]
    pins: SchemaPins

    @property
    def service(self) -> CatalogService:
        return self.services[0]


IN_FLIGHT_MS = 30_000
REPUBLISH_INTERVAL_MS = 5_000


def world(replicas: int = 1) -> World:
    store, topic, clock = MemoryCatalog(), Topic(), Clock()
    publications = [CatalogPublication(store, stored_records(store, Tenants(), clock),  # type: ignore[arg-type]
                                       topic.publish, clock, in_flight_ms=IN_FLIGHT_MS)
                    for _ in range(replicas)]
    services = [CatalogService(CatalogDeps(catalog=store, tenants=Tenants(), history=None,  # type: ignore[arg-type]
                                           cursors=Cursors(b"k"), now_ms=clock, publication=p))
                for p in publications]
    return World(store, topic, clock, publications, services, SchemaPins(store, publications[0], clock))


def add(service: CatalogService, version: str, schema: str) -> EventTypeEntry:
    return service.add_version(ADMIN, "invoice.paid", version, schema, ['{"amount": 1}'])


def job(records: Sequence[CatalogRecord]) -> CatalogIndex:
    index = CatalogIndex()
    for r in records:
        index.add(r)
    return index


def held_type(index: CatalogIndex) -> CatalogTypeRecord:
    acme = index.tenant("acme")
    assert acme is not None
    return acme.types["invoice.paid"]


def assert_job_holds_the_store(w: World) -> None:
    """A job that read the whole topic, and one rebuilt from the compacted topic, hold what
    Cassandra holds."""
    stored = w.store.get_type("acme", "invoice.paid")
    assert stored is not None
    for index in (job(w.topic.records), job(w.topic.compacted())):
        kind = held_type(index)
        assert (kind.revision, sorted(kind.versions)) == (stored.revision, sorted(str(v.version)
                                                                                  for v in stored.versions))


def created(w: World) -> None:
    w.service.create_type(ADMIN, "invoice.paid", "", "", "")
    add(w.service, "1.0", SCHEMA_1_0)


# Each call publishes what it read before the racing change landed on the topic.
STALE_PUBLISHERS: dict[str, Callable[[World], object]] = {
    "a retried create": lambda w: w.service.create_type(ADMIN, "invoice.paid", "", "", ""),
    "a retried add_version (no change: republishes current)": lambda w: add(w.service, "1.0", SCHEMA_1_0),
    "an update that changes nothing": lambda w: w.service.update_type(ADMIN, "invoice.paid", {"group": ""}),
}


@pytest.mark.parametrize("stale", STALE_PUBLISHERS.values(), ids=STALE_PUBLISHERS.keys())
def test_a_call_racing_an_add_version_never_leaves_a_stale_revision_last(stale: Callable[[World], object]) -> None:
    w = world()
    created(w)
    w.topic.before_next.append(lambda: add(w.service, "1.1", SCHEMA_1_1))
    stale(w)
    assert w.store.get_type("acme", "invoice.paid").revision == 3  # type: ignore[union-attr]
    assert_job_holds_the_store(w)
    # The case of the report: a valid 1.1 event is checked against a catalog that has 1.1.
    assert "1.1" in held_type(job(w.topic.compacted())).versions


def test_two_replicas_publishing_out_of_order_leave_the_newest_last() -> None:
    w = world(replicas=2)
    created(w)
    # Replica 0 adds 1.1 (revision 3); replica 1 deprecates (revision 4) and Kafka takes its
    # records before replica 0's.
    w.topic.before_next.append(lambda: w.services[1].deprecate(ADMIN, "invoice.paid", "1.0", T0 + 1))
    add(w.services[0], "1.1", SCHEMA_1_1)
    assert w.store.get_type("acme", "invoice.paid").revision == 4  # type: ignore[union-attr]
    assert_job_holds_the_store(w)


def test_pins_set_twice_concurrently_leave_the_stored_pins_last() -> None:
    w = world()
    w.topic.before_next.append(lambda: w.pins.set("acme", "ep_1", [2], "key_b"))
    w.pins.set("acme", "ep_1", [1], "key_a")  # stored first, published last
    assert w.store.pins[("acme", "ep_1")][0] == (2,)
    for index in (job(w.topic.records), job(w.topic.compacted())):
        assert index.pins("ep_1") == (2,)


def test_settings_set_twice_concurrently_leave_the_stored_settings_last() -> None:
    w = world()
    w.topic.before_next.append(lambda: w.service.set_unknown_types(ADMIN, "warn"))
    w.service.set_unknown_types(ADMIN, "reject")
    assert w.store.settings["acme"][0] == "warn"
    for index in (job(w.topic.records), job(w.topic.compacted())):
        acme = index.tenant("acme")
        assert acme is not None and acme.unknown_types == "warn"


def republish(w: World) -> int:
    """What the control plane's loops do on their own, with no client call: a republisher pass
    (of another replica: what it reads is the outbox in Cassandra, not the failed call's memory)."""
    return w.publications[-1].republish_pending()


def job_holds(w: World, kind: str) -> bool:
    index = job(w.topic.compacted())
    acme = index.tenant("acme")
    if kind == "type":
        stored = w.store.get_type("acme", "invoice.paid")
        return acme is not None and stored is not None and acme.types["invoice.paid"].revision == stored.revision
    if kind == "settings":
        return acme is not None and acme.unknown_types == w.store.settings["acme"][0]
    return index.pins("ep_1") == w.store.pins[("acme", "ep_1")][0]


CHANGES: dict[str, tuple[str, Callable[[World], object]]] = {
    "add_version": ("type", lambda w: add(w.services[0], "1.1", SCHEMA_1_1)),
    "set_unknown_types": ("settings", lambda w: w.services[0].set_unknown_types(ADMIN, "warn")),
    "pins": ("pins", lambda w: w.pins.set("acme", "ep_1", [2], "key_a")),
}


@pytest.mark.parametrize(("kind", "change"), CHANGES.values(), ids=CHANGES.keys())
def test_a_change_whose_publish_failed_reaches_the_topic_without_a_client_retry(
        kind: str, change: Callable[[World], object]) -> None:
    w = world(replicas=2)
    created(w)
    w.pins.set("acme", "ep_1", [1], "key_a")
    changed_at = w.clock.now
    w.topic.failing = True
    with pytest.raises(errors.Unavailable):
        change(w)  # stored, not sent: the client is told to retry, and does not
    assert not job_holds(w, kind)
    w.topic.failing = False
    # The republisher loop, every REPUBLISH_INTERVAL_MS: a row younger than IN_FLIGHT_MS may
    # belong to a request still publishing, and is left to it.
    while not job_holds(w, kind):
        w.clock.now += REPUBLISH_INTERVAL_MS
        republish(w)
    # The bound: the first pass once the row is IN_FLIGHT_MS old.
    assert changed_at + IN_FLIGHT_MS <= w.clock.now < changed_at + IN_FLIGHT_MS + REPUBLISH_INTERVAL_MS
    assert w.store.unpublished == [] and republish(w) == 0


def test_a_change_leaves_no_outbox_row_once_published_nor_when_refused() -> None:
    w = world()
    created(w)
    with pytest.raises(errors.FailedPrecondition):
        w.service.create_type(ADMIN, "invoice.paid", "other description", "", "")
    with pytest.raises(errors.NotFound):
        w.service.update_type(ADMIN, "invoice.gone", {"group": "g"})
    assert w.store.unpublished == [] and republish(w) == 0


def test_a_write_that_may_have_applied_leaves_its_row_for_the_republisher() -> None:
    w = world()
    created(w)
    real = w.store.replace_type

    def applied_then_timed_out(entry: EventTypeEntry, expected_revision: int) -> bool:
        real(entry, expected_revision)
        raise errors.Unavailable("storage unavailable (LWT result unknown); retry")

    w.store.replace_type = applied_then_timed_out  # type: ignore[method-assign]
    with pytest.raises(errors.Unavailable):
        add(w.service, "1.1", SCHEMA_1_1)
    w.clock.now += IN_FLIGHT_MS
    assert republish(w) == 1
    assert_job_holds_the_store(w)


def test_a_republisher_pass_that_cannot_publish_keeps_the_row() -> None:
    w = world()
    created(w)
    w.topic.failing = True
    with pytest.raises(errors.Unavailable):
        add(w.service, "1.1", SCHEMA_1_1)
    w.clock.now += IN_FLIGHT_MS
    assert republish(w) == 0 and len(w.store.unpublished) == 1  # Kafka still down
    w.topic.failing = False
    assert republish(w) == 1 and w.store.unpublished == []
    assert_job_holds_the_store(w)


def test_a_stale_settings_record_published_with_a_type_does_not_undo_a_settings_change() -> None:
    w = world()
    created(w)
    # A type change reads the settings (reject, the default) and Kafka takes the settings change
    # (warn) before the type change's records.
    w.topic.before_next.append(lambda: w.service.set_unknown_types(ADMIN, "warn"))
    add(w.service, "1.1", SCHEMA_1_1)
    for index in (job(w.topic.records), job(w.topic.compacted())):
        acme = index.tenant("acme")
        assert acme is not None and acme.unknown_types == "warn"


class Killed(BaseException):
    """The process dies (SIGKILL): nothing after this point of the call runs."""


def test_a_change_whose_process_died_before_its_publish_reaches_the_topic() -> None:
    w = world(replicas=2)
    created(w)

    def die() -> None:
        raise Killed

    w.topic.before_next.append(die)
    with pytest.raises(Killed):
        add(w.services[0], "1.1", SCHEMA_1_1)  # stored; the records never left
    assert w.store.get_type("acme", "invoice.paid").revision == 3  # type: ignore[union-attr]
    w.clock.now += IN_FLIGHT_MS
    assert republish(w) == 1  # the other replica
    assert_job_holds_the_store(w)


def test_a_pass_leaves_a_request_in_flight_alone() -> None:
    w = world(replicas=2)
    created(w)
    before = len(w.topic.records)
    w.topic.before_next.append(lambda: republish(w))  # a pass runs while the request publishes
    add(w.services[0], "1.1", SCHEMA_1_1)
    assert len(w.topic.records) == before + 2  # the type and its settings, once: no duplicate
    assert w.store.unpublished == []


def test_a_job_rebuilt_from_the_compacted_topic_sends_a_valid_event_of_the_newest_version() -> None:
    # The reproduction: a retried create races add_version 1.1; a fan-out that reads only the
    # compacted topic (a job rebuilt without state) must hold 1.1 and send a valid 1.1 event,
    # not dead-letter it schema_unknown.
    w = world()
    created(w)
    w.topic.before_next.append(lambda: add(w.service, "1.1", SCHEMA_1_1))
    w.service.create_type(ADMIN, "invoice.paid", "", "", "")
    fan = FanOut(3600, 60, 250, 100, 5000, "events")
    fan.open(RuntimeContext())  # type: ignore[arg-type]
    ctx = Ctx(BroadcastState())
    for record in (ConfigClock(time.time_ns() // 1_000_000, 600_000), *w.topic.compacted()):
        list(fan.process_broadcast_element(record, ctx) or ())
    out = send(fan, ctx, "evt_11", "invoice.paid", "1.1", {"amount": 1, "note": "x"})
    assert [o for o in out if isinstance(o, tuple)] == []  # no dead letter
