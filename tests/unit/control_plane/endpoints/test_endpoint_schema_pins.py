"""Schema pins set through an endpoint's create and update (control_plane.endpoints.schema_pins via
EndpointService), with the service's in-memory fakes: the same rule and the same store/publish path
as EventCatalog.SetEndpointSchemaMajors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from control_plane import errors
from control_plane.catalog.service import stored_records
from control_plane.endpoints.schema_pins import SchemaPins, pinned_majors
from control_plane.endpoints.service import Deps, EndpointService
from control_plane.publishing.catalog import CatalogPublication, Unpublished
from control_plane.publishing.configs import ConfigPublication
from control_plane.validation import DestinationValidator
from core.egress import EgressPolicy
from core.records import CatalogRecord, SchemaPinsRecord
from core.secrets import Keyring
from tests.unit.control_plane.endpoints.test_control_plane_service import (
    ALICE,
    ALICE_RO,
    BOB,
    LEASE_MS,
    MASTER_KEY,
    Clock,
    MemoryStore,
    RecordingPublisher,
    counting_random,
    fake_resolver,
    spec,
)


@dataclass
class Pins:
    """endpoint_schema_pins and the endpoints topic, in memory; ``configs_seen`` is how many
    endpoint configs the delivery job had been sent when each pins record was published."""

    publisher: RecordingPublisher
    rows: dict[tuple[str, str], tuple[tuple[int, ...], str]] = field(default_factory=dict)
    published: list[SchemaPinsRecord] = field(default_factory=list)
    configs_seen: list[int] = field(default_factory=list)
    unpublished: list[Unpublished] = field(default_factory=list)
    writes: dict[tuple[str, str], int] = field(default_factory=dict)  # the rows' write times

    def put_schema_pins(self, tenant_id: str, endpoint_id: str, majors: tuple[int, ...], at_ms: int,
                        by: str) -> None:
        self.rows[(tenant_id, endpoint_id)] = (majors, by)
        self.writes[(tenant_id, endpoint_id)] = max(self.writes.values(), default=0) + 1

    def get_schema_pins(self, tenant_id: str, endpoint_ids: Sequence[str]) -> dict[str, tuple[int, ...]]:
        return {e: self.rows[(tenant_id, e)][0] for e in endpoint_ids if (tenant_id, e) in self.rows}

    def read_schema_pins(self, tenant_id: str, endpoint_id: str) -> tuple[tuple[int, ...], int] | None:
        key = (tenant_id, endpoint_id)
        return (self.rows[key][0], self.writes[key]) if key in self.rows else None

    def put_unpublished(self, item: Unpublished) -> None:
        self.unpublished.append(item)

    def clear_unpublished(self, item: Unpublished) -> None:
        self.unpublished.remove(item)

    def list_unpublished(self) -> list[Unpublished]:
        return list(self.unpublished)

    def publish(self, records: Sequence[CatalogRecord]) -> None:
        for r in records:
            assert isinstance(r, SchemaPinsRecord)
            self.published.append(r)
            self.configs_seen.append(sum(c.endpoint_id == r.endpoint_id for c in self.publisher.configs))


@dataclass
class World:
    store: MemoryStore
    publisher: RecordingPublisher
    pins: Pins
    endpoints: EndpointService


def world(with_pins: bool = True) -> World:
    store, publisher, clock = MemoryStore(), RecordingPublisher(), Clock()
    publication = ConfigPublication(store, publisher, clock, lease_ms=LEASE_MS, sleep_ms=clock.sleep_ms)
    publication.republish_pending()
    pins = Pins(publisher)
    endpoints = EndpointService(Deps(
        store=store, publication=publication, publisher=publisher,
        destination=DestinationValidator(EgressPolicy(), fake_resolver), master_key=Keyring.single(MASTER_KEY),
        now_ms=clock, random_bytes=counting_random(), default_overlap_s=3600,  # type: ignore[arg-type]
        schema_pins=SchemaPins(pins, CatalogPublication(pins, stored_records(pins, None, clock),  # type: ignore[arg-type]
                                                        pins.publish, clock), clock) if with_pins else None,
    ))
    return World(store, publisher, pins, endpoints)


@pytest.fixture
def w() -> World:
    return world()


@pytest.mark.parametrize(("majors", "pinned"), [
    ([], ()), ([2], (2,)), ([2, 2], (2,)), ([3, 1, 2], (1, 2, 3)), ([999_999], (999_999,)),
    (list(range(1, 11)), tuple(range(1, 11))),
])
def test_pins_are_stored_each_major_once_ascending(majors: list[int], pinned: tuple[int, ...]) -> None:
    assert pinned_majors(majors) == pinned


@pytest.mark.parametrize("majors", [[0], [-1], [1_000_000], list(range(1, 12))])
def test_pins_out_of_bounds_are_refused(majors: list[int]) -> None:
    with pytest.raises(errors.InvalidArgument, match="at most 10 majors from 1 to 999999"):
        pinned_majors(majors)


def test_create_pins_the_endpoint_before_the_delivery_job_hears_of_it(w: World) -> None:
    created = w.endpoints.create(ALICE, spec(), "", schema_majors=[3, 2, 2])
    endpoint_id = created.endpoint.endpoint_id
    assert w.pins.rows[(ALICE.tenant_id, endpoint_id)] == ((2, 3), ALICE.key_id)
    assert [(r.tenant_id, r.endpoint_id, r.schema_majors) for r in w.pins.published] \
        == [(ALICE.tenant_id, endpoint_id, (2, 3))]
    assert w.pins.configs_seen == [0]  # no event of another major can reach it unpinned
    assert [c.endpoint_id for c in w.publisher.configs] == [endpoint_id]
    assert w.endpoints.schema_majors([created.endpoint]) == {endpoint_id: (2, 3)}


def test_create_without_majors_pins_nothing(w: World) -> None:
    created = w.endpoints.create(ALICE, spec(), "")
    assert w.pins.rows == {} and w.pins.published == []
    assert w.endpoints.schema_majors([created.endpoint]) == {}


def test_create_with_majors_out_of_bounds_creates_nothing(w: World) -> None:
    with pytest.raises(errors.InvalidArgument, match="schema_majors"):
        w.endpoints.create(ALICE, spec(), "req-1", schema_majors=[0])
    assert w.store.list_endpoints(ALICE.tenant_id, "", 10) == [] and w.pins.published == []


def test_a_retried_create_keeps_its_pins_and_other_majors_are_another_request(w: World) -> None:
    first = w.endpoints.create(ALICE, spec(), "req-1", schema_majors=[2])
    again = w.endpoints.create(ALICE, spec(), "req-1", schema_majors=[2, 2])
    assert again.endpoint.endpoint_id == first.endpoint.endpoint_id and len(w.pins.published) == 1
    with pytest.raises(errors.AlreadyExists, match="different endpoint"):
        w.endpoints.create(ALICE, spec(), "req-1", schema_majors=[3])
    with pytest.raises(errors.AlreadyExists, match="different endpoint"):
        w.endpoints.create(ALICE, spec(), "req-1")


def test_update_sets_and_clears_pins_without_a_new_config_version(w: World) -> None:
    endpoint = w.endpoints.create(ALICE, spec(), "").endpoint
    key = (ALICE.tenant_id, endpoint.endpoint_id)
    pinned = w.endpoints.update(ALICE, endpoint.endpoint_id, spec(), ["schema_majors"], schema_majors=[2])
    assert pinned.config_version == endpoint.config_version and w.pins.rows[key] == ((2,), ALICE.key_id)
    both = w.endpoints.update(ALICE, endpoint.endpoint_id, spec(description="v2 only"),
                              ["description", "schema_majors"], schema_majors=[2, 3])
    assert (both.spec.description, w.pins.rows[key][0]) == ("v2 only", (2, 3))
    w.endpoints.update(ALICE, endpoint.endpoint_id, spec(), ["schema_majors"])  # empty: every major again
    assert w.pins.rows[key][0] == () and [r.schema_majors for r in w.pins.published] == [(2,), (2, 3), ()]


def test_update_without_the_path_leaves_pins_alone(w: World) -> None:
    endpoint = w.endpoints.create(ALICE, spec(), "", schema_majors=[2]).endpoint
    w.endpoints.update(ALICE, endpoint.endpoint_id, spec(description="x"), ["description"], schema_majors=[5])
    assert w.pins.rows[(ALICE.tenant_id, endpoint.endpoint_id)][0] == (2,) and len(w.pins.published) == 1


@pytest.mark.parametrize(("who", "error"), [(BOB, errors.NotFound), (ALICE_RO, errors.PermissionDenied)])
def test_only_the_tenants_read_write_key_changes_pins(w: World, who: object, error: type[Exception]) -> None:
    endpoint = w.endpoints.create(ALICE, spec(), "").endpoint
    with pytest.raises(error):
        w.endpoints.update(who, endpoint.endpoint_id, spec(), ["schema_majors"], schema_majors=[2])  # type: ignore[arg-type]
    assert w.pins.published == []


def test_a_deleted_endpoint_is_not_pinned(w: World) -> None:
    endpoint = w.endpoints.create(ALICE, spec(), "").endpoint
    w.endpoints.delete(ALICE, endpoint.endpoint_id)
    with pytest.raises(errors.NotFound):
        w.endpoints.update(ALICE, endpoint.endpoint_id, spec(), ["schema_majors"], schema_majors=[2])
    assert w.pins.published == []


def test_without_the_catalog_pins_are_refused_before_any_change() -> None:
    bare = world(with_pins=False)
    with pytest.raises(errors.FailedPrecondition, match="event-type catalog"):
        bare.endpoints.create(ALICE, spec(), "", schema_majors=[2])
    assert bare.store.list_endpoints(ALICE.tenant_id, "", 10) == []
    endpoint = bare.endpoints.create(ALICE, spec(), "").endpoint
    with pytest.raises(errors.FailedPrecondition, match="event-type catalog"):
        bare.endpoints.update(ALICE, endpoint.endpoint_id, spec(description="x"), ["description", "schema_majors"],
                              schema_majors=[2])
    assert bare.endpoints.get(ALICE, endpoint.endpoint_id).spec.description == "orders"
    assert bare.endpoints.schema_majors([endpoint]) == {}
