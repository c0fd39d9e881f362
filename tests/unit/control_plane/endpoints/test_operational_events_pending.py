"""The events of a person's change (enable, disable, secret rotation) are never lost: recorded as
pending before the change's write, deleted once Kafka confirmed them, and published by the sweep
when the publish failed or the process died in between -- only if the change was written. In
memory, with an injected clock; a failing publisher stands for Kafka out of reach."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from control_plane import errors
from control_plane.domain import Endpoint
from control_plane.endpoints.operational_events import PENDING_GRACE_MS, OperationalEvents
from control_plane.endpoints.operational_store import InMemoryOperationalStore
from control_plane.publishing.publisher import PublishError
from core import operational_events as ops
from core.records import EndpointStatus, EventRecord
from tests.unit.control_plane.endpoints.test_control_plane_service import (  # noqa: F401 (fixture w)
    ALICE,
    RecordingPublisher,
    World,
    create,
    w,
)


class Crash(Exception):
    """The control plane's process dies here: nothing after this point of the request runs."""


class Replica:
    """One control plane's operational events over the shared stores (the cluster has several)."""

    def __init__(self, world: World, store: InMemoryOperationalStore, publisher: RecordingPublisher,
                 listen: bool = True) -> None:
        self.w, self.store, self.publisher = world, store, publisher
        self.events = OperationalEvents(store, world.store, publisher, world.clock,  # type: ignore[arg-type]
                                        history=world.store)  # type: ignore[arg-type]
        self.events.bind(world.endpoints.auto_disable, world.endpoints.disable_gone)
        if listen:
            world.endpoints.listen(self.events)

    def emitted(self) -> list[EventRecord]:
        return [e for e in self.publisher.events if ops.is_operational(e.event_type)]

    def sweep_after(self, ms: int) -> int:
        self.w.clock.now += ms
        return self.events.sweep()


@pytest.fixture
def r(w: World) -> Replica:  # noqa: F811
    return Replica(w, InMemoryOperationalStore(), w.publisher)


CHANGES: dict[str, tuple[str, Callable[[World, str], Any]]] = {
    "disable": (ops.ENDPOINT_DISABLED, lambda world, ep: world.endpoints.set_enabled(ALICE, ep, False)),
    "enable": (ops.ENDPOINT_ENABLED, lambda world, ep: (world.endpoints.set_enabled(ALICE, ep, False),
                                                        world.endpoints.set_enabled(ALICE, ep, True))),
    "rotate": (ops.SECRET_ROTATED, lambda world, ep: world.endpoints.rotate_secret(ALICE, ep, revoke_immediately=False,
                                                                                  overlap_s=0)),
}


def test_a_published_event_leaves_no_pending_row(r: Replica) -> None:
    ep = create(r.w).endpoint_id
    r.w.endpoints.set_enabled(ALICE, ep, False)
    (event,) = r.emitted()
    assert event.event_type == ops.ENDPOINT_DISABLED
    assert list(r.store.iter_pending()) == []
    assert r.sweep_after(PENDING_GRACE_MS + 1) == 0
    assert len(r.emitted()) == 1  # nothing owed: the sweep publishes nothing more


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_failed_publish_keeps_the_row_and_the_sweep_publishes_it_once_kafka_is_back(r: Replica,
                                                                                       change: str) -> None:
    type_name, make = CHANGES[change]
    ep = create(r.w).endpoint_id
    r.publisher.failing = True
    make(r.w, ep)  # the change succeeds: it is committed, its event owed
    endpoint = r.w.store.get_endpoint(ALICE.tenant_id, ep)
    assert endpoint is not None
    pending = [p for p in r.store.iter_pending() if p.event.event_type == type_name]
    assert len(pending) == 1 and r.emitted() == []
    with pytest.raises(PublishError):
        r.sweep_after(PENDING_GRACE_MS + 1)  # Kafka still out of reach: the pass fails, the row stays
    assert [p.event.event_id for p in r.store.iter_pending() if p.event.event_type == type_name] == [
        pending[0].event.event_id]

    r.publisher.failing = False
    r.sweep_after(5_000)
    (event,) = [e for e in r.emitted() if e.event_type == type_name]
    assert event.to_json() == pending[0].event.to_json()  # what the request would have published
    body = json.loads(event.payload)
    assert body["endpoint_id"] == ep and body["data"]["config_version"] == endpoint.config_version
    assert list(r.store.iter_pending()) == []
    r.sweep_after(5_000)
    assert len([e for e in r.emitted() if e.event_type == type_name]) == 1


def test_an_operator_s_disable_published_by_the_sweep_says_operator(r: Replica) -> None:
    ep = create(r.w).endpoint_id
    r.publisher.failing = True
    r.w.endpoints.set_enabled(ALICE, ep, False)
    r.publisher.failing = False
    r.sweep_after(PENDING_GRACE_MS + 1)
    (event,) = r.emitted()
    assert event.event_id == ops.event_id(ep, "disabled", "2")
    assert json.loads(event.payload)["data"] == {"reason": ops.OPERATOR, "detail": "disabled by key_a",
                                                 "config_version": 2}


def test_a_young_row_is_left_to_its_request(r: Replica) -> None:
    ep = create(r.w).endpoint_id
    r.publisher.failing = True
    r.w.endpoints.set_enabled(ALICE, ep, False)
    r.publisher.failing = False
    assert r.sweep_after(1_000) == 0  # its request may still be publishing it: no duplicate for most changes
    assert r.emitted() == [] and len(list(r.store.iter_pending())) == 1


def test_a_crash_after_the_commit_before_the_publish_is_published_by_the_sweep(r: Replica) -> None:
    ep = create(r.w).endpoint_id

    def die(*_: object) -> int:
        raise Crash

    r.w.publication.try_publish = die  # type: ignore[method-assign]  # dies right after the write
    with pytest.raises(Crash):
        r.w.endpoints.set_enabled(ALICE, ep, False)
    endpoint = r.w.store.get_endpoint(ALICE.tenant_id, ep)
    assert endpoint is not None and endpoint.status is EndpointStatus.DISABLED  # committed
    assert r.emitted() == []

    restarted = Replica(r.w, r.store, r.publisher, listen=False)  # the process started again
    restarted.sweep_after(PENDING_GRACE_MS + 1)
    (event,) = restarted.emitted()
    assert (event.event_type, event.event_id) == (ops.ENDPOINT_DISABLED, ops.event_id(ep, "disabled", "2"))
    assert list(r.store.iter_pending()) == []


def test_a_crash_before_the_write_announces_nothing(r: Replica) -> None:
    ep = create(r.w).endpoint_id

    def die(*_: object) -> bool:
        raise Crash

    real_replace = r.w.store.replace_endpoint
    r.w.store.replace_endpoint = die  # type: ignore[method-assign]  # recorded as pending, never written
    with pytest.raises(Crash):
        r.w.endpoints.set_enabled(ALICE, ep, False)
    r.w.store.replace_endpoint = real_replace  # type: ignore[method-assign]
    assert len(list(r.store.iter_pending())) == 1

    r.sweep_after(PENDING_GRACE_MS + 1)
    assert r.emitted() == [] and len(list(r.store.iter_pending())) == 1  # version 2 not written: it waits
    # Someone else's change takes version 2: the announced write never happened, the row goes.
    r.w.endpoints.rotate_secret(ALICE, ep, revoke_immediately=False, overlap_s=0)
    r.sweep_after(PENDING_GRACE_MS + 1)
    assert [e.event_type for e in r.emitted()] == [ops.SECRET_ROTATED]
    assert list(r.store.iter_pending()) == []


def test_a_write_whose_outcome_is_unknown_is_published_once_it_shows_applied(r: Replica) -> None:
    ep = create(r.w).endpoint_id
    real_replace = r.w.store.replace_endpoint

    def applied_then_timed_out(endpoint: Endpoint, expected: int) -> bool:
        real_replace(endpoint, expected)
        raise errors.Unavailable("storage unavailable (LWT result unknown); retry")

    r.w.store.replace_endpoint = applied_then_timed_out  # type: ignore[method-assign]
    with pytest.raises(errors.Unavailable):
        r.w.endpoints.set_enabled(ALICE, ep, False)
    r.w.store.replace_endpoint = real_replace  # type: ignore[method-assign]
    assert r.emitted() == []  # the caller was told UNAVAILABLE; the write applied all the same
    r.sweep_after(PENDING_GRACE_MS + 1)
    assert [e.event_id for e in r.emitted()] == [ops.event_id(ep, "disabled", "2")]


def test_a_lost_race_leaves_no_row_and_announces_only_the_version_written(r: Replica) -> None:
    ep = create(r.w).endpoint_id
    real_replace = r.w.store.replace_endpoint
    raced = [False]

    def concurrent_update_first(endpoint: Endpoint, expected: int) -> bool:
        if not raced[0]:
            raced[0] = True  # another request writes the same version first
            current = r.w.store.get_endpoint(ALICE.tenant_id, ep)
            assert current is not None
            real_replace(replace(current, config_version=expected + 1, changed_by="key_b",
                                 change="update description"), expected)
        return real_replace(endpoint, expected)

    r.w.store.replace_endpoint = concurrent_update_first  # type: ignore[method-assign]
    after = r.w.endpoints.set_enabled(ALICE, ep, False)  # lost once, applied again on fresh data
    assert after.config_version == 3
    assert [e.event_id for e in r.emitted()] == [ops.event_id(ep, "disabled", "3")]
    assert list(r.store.iter_pending()) == []
    r.sweep_after(PENDING_GRACE_MS + 1)
    assert len(r.emitted()) == 1


def test_two_replicas_sweeping_at_once_publish_the_same_id(w: World) -> None:  # noqa: F811
    store = InMemoryOperationalStore()
    a = Replica(w, store, RecordingPublisher())
    b = Replica(w, store, RecordingPublisher(), listen=False)
    ep = create(w).endpoint_id
    a.publisher.failing = True
    w.endpoints.set_enabled(ALICE, ep, False)
    a.publisher.failing = False

    publish_a = a.publisher.publish_event

    def while_b_sweeps(event: EventRecord) -> None:
        b.events.sweep()  # b reads the row before a, publishing it, deletes it
        publish_a(event)

    a.publisher.publish_event = while_b_sweeps  # type: ignore[method-assign]
    w.clock.now += PENDING_GRACE_MS + 1
    a.events.sweep()
    (from_a,), (from_b,) = a.emitted(), b.emitted()
    # Harmless: one event id (fan-out keeps the first; the delivery id follows from it).
    assert from_a.event_id == from_b.event_id and from_a.to_json() == from_b.to_json()
    assert list(store.iter_pending()) == []


def test_a_change_is_refused_when_its_event_cannot_be_recorded(r: Replica) -> None:
    ep = create(r.w).endpoint_id

    def down(*_: object) -> None:
        raise errors.Unavailable("Cassandra down")

    r.store.put_pending = down  # type: ignore[method-assign]
    with pytest.raises(errors.Unavailable):
        r.w.endpoints.set_enabled(ALICE, ep, False)
    endpoint = r.w.store.get_endpoint(ALICE.tenant_id, ep)
    assert endpoint is not None and endpoint.status is EndpointStatus.ACTIVE  # nothing changed, nothing owed


def test_a_sweep_whose_publish_fails_still_runs_the_auto_disable_pass(r: Replica) -> None:
    quiet = create(r.w, event_types=("webhooks.*",)).endpoint_id  # an operations endpoint: disabled silently
    other = create(r.w).endpoint_id
    r.store.set_policy(ALICE.tenant_id, ops.AutoDisablePolicy(window_s=100, warn_at=(0.5,)), "key_a", 0)
    r.events.on_signal(_failing(quiet, r.w.clock.now))
    r.publisher.failing = True
    r.w.endpoints.set_enabled(ALICE, other, False)  # owed
    with pytest.raises(PublishError):
        r.sweep_after(200_000)
    endpoint = r.w.store.get_endpoint(ALICE.tenant_id, quiet)
    assert endpoint is not None and endpoint.status is EndpointStatus.DISABLED
    assert len(list(r.store.iter_pending())) == 1


def _failing(endpoint_id: str, at_ms: int) -> Any:
    from core.records import EndpointSignal

    return EndpointSignal(endpoint_id=endpoint_id, tenant_id=ALICE.tenant_id, config_version=1,
                          signal=ops.SIGNAL_FAILING, detail="x", at_ms=at_ms, event_type=ops.DELIVERY_EXHAUSTED,
                          sequence=1)


# -- the store ------------------------------------------------------------------------------------

def test_both_stores_implement_the_protocol_whole() -> None:
    from control_plane.endpoints.operational_store import CassandraOperationalStore, OperationalStore

    methods = [name for name in vars(OperationalStore) if not name.startswith("_")]
    assert {"put_pending", "delete_pending", "iter_pending"} <= set(methods)
    for store in (InMemoryOperationalStore, CassandraOperationalStore):
        assert [m for m in methods if not callable(getattr(store, m, None))] == []


def test_the_pending_table_has_every_column_the_store_names() -> None:
    import re

    from control_plane.endpoints import operational_store
    from core.settings import REPO_ROOT

    cql = (REPO_ROOT / "cassandra" / "schema" / "023_pending_operational_events.cql").read_text()
    table = re.search(r"CREATE TABLE IF NOT EXISTS pending_operational_events \((.*?)PRIMARY KEY", cql, re.S)
    assert table is not None
    columns = {line.split()[0] for line in table.group(1).strip().splitlines() if line.strip()}
    named = {c.strip() for c in operational_store._PENDING_COLUMNS.split(",")}
    assert named == columns


def test_a_stored_row_reads_back_as_the_event_recorded(r: Replica) -> None:
    from datetime import UTC, datetime

    from control_plane.endpoints.operational_store import pending_from_row

    ep = create(r.w).endpoint_id
    r.publisher.failing = True
    r.w.endpoints.set_enabled(ALICE, ep, False)
    (p,) = r.store.iter_pending()
    m = p.mark
    since = datetime.fromtimestamp(p.since_ms / 1000, tz=UTC).replace(tzinfo=None)  # the driver's naive UTC
    row = {"bucket": 0, "tenant_id": p.tenant_id, "event_id": p.event.event_id, "attempt": p.attempt,
           "endpoint_id": p.endpoint_id, "config_version": m.config_version, "changed_by": m.changed_by,
           "change": m.change, "since": since, "record": p.event.to_json()}
    assert pending_from_row(row) == p
    assert pending_from_row({**row, "record": b"not json"}) is None  # left to its TTL, not a failing pass
