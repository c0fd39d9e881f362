"""The control-plane service logic with in-memory fakes: no gRPC, Kafka or Cassandra."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import pytest

from control_plane import errors
from control_plane.admin import AdminService
from control_plane.auth import Authenticator, bearer_token, hash_api_key
from control_plane.cursor import Cursors
from control_plane.domain import (
    HISTORY_WINDOW_MS,
    ApiKey,
    Attempt,
    BlockedKey,
    DeliveryDetail,
    DeliveryStatus,
    DeliverySummary,
    Endpoint,
    EndpointSpec,
    EndpointVersion,
    IdempotencyRecord,
    KeyPosition,
    Principal,
    ReplayAudit,
    Tenant,
)
from control_plane.endpoints.service import PING_EVENT_TYPE, Deps, EndpointService
from control_plane.history.deliveries import DeliveryDeps, DeliveryService
from control_plane.history.ordering import OrderingDeps, OrderingService
from control_plane.publishing.configs import ConfigPublication
from control_plane.publishing.publisher import PublishError
from control_plane.store import HistoryPosition
from control_plane.validation import DestinationValidator
from core.egress import EgressPolicy
from core.history_buckets import bucket_of
from core.records import (
    SKIP,
    ConfigClock,
    EndpointConfig,
    EndpointStatus,
    EventRecord,
    ReplayRequest,
    delivery_id_for,
)
from core.secrets import Keyring, decrypt_secret

MASTER_KEY = bytes(range(32))
T0 = 1_790_000_000_000
LEASE_MS = 1_000  # the config clock lease: every acknowledged change waits it out on the fake clock
DAY_MS = 24 * 3600 * 1000

# Fake DNS: names map to fixed answers; no resolver or network is touched.
DNS = {
    "hooks.example.com": ["93.184.215.14"],
    "other.example.com": ["93.184.215.15"],
    "rebind.example.com": ["93.184.215.16", "127.0.0.1"],
    "metadata.example.com": ["169.254.169.254"],
}


def fake_resolver(host: str, port: int) -> list[str]:
    if host not in DNS:
        raise OSError("name does not resolve")
    return DNS[host]


# -- fakes -----------------------------------------------------------------------------------


@dataclass
class MemoryStore:
    tenants: dict[str, Tenant] = field(default_factory=dict)
    keys: dict[str, ApiKey] = field(default_factory=dict)
    endpoints: dict[tuple[str, str], Endpoint] = field(default_factory=dict)
    versions: dict[tuple[str, str, int], EndpointVersion] = field(default_factory=dict)
    requests: dict[tuple[str, str], IdempotencyRecord] = field(default_factory=dict)
    replay_audit: dict[tuple[str, str], ReplayAudit] = field(default_factory=dict)
    clock_holds: dict[tuple[str, str, int], int] = field(default_factory=dict)
    deliveries: dict[str, DeliveryDetail] = field(default_factory=dict)
    blocked: dict[tuple[str, str, str], BlockedKey] = field(default_factory=dict)
    fail_mark: bool = False

    def create_tenant(self, tenant: Tenant) -> bool:
        return self.tenants.setdefault(tenant.tenant_id, tenant) is tenant

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        return self.tenants.get(tenant_id)

    def iter_tenant_ids(self) -> Iterator[str]:
        return iter(sorted(self.tenants))

    def set_allowed_event_types(self, tenant_id: str, types: tuple[str, ...] | None) -> bool:
        if tenant_id not in self.tenants:
            return False
        self.tenants[tenant_id] = replace(self.tenants[tenant_id], allowed_event_types=types)
        return True

    def put_api_key(self, key: ApiKey) -> None:
        self.keys[key.key_hash] = key

    def get_api_key(self, key_hash: str) -> ApiKey | None:
        return self.keys.get(key_hash)

    def get_api_key_by_id(self, tenant_id: str, key_id: str) -> ApiKey | None:
        return next(
            (k for k in self.keys.values() if k.tenant_id == tenant_id and k.key_id == key_id), None
        )

    def revoke_api_key(self, key: ApiKey, at_ms: int) -> None:
        self.keys[key.key_hash] = replace(key, revoked_at_ms=at_ms)

    def insert_endpoint(self, endpoint: Endpoint) -> bool:
        key = (endpoint.tenant_id, endpoint.endpoint_id)
        return self.endpoints.setdefault(key, endpoint) is endpoint

    def replace_endpoint(self, endpoint: Endpoint, expected_version: int) -> bool:
        key = (endpoint.tenant_id, endpoint.endpoint_id)
        current = self.endpoints.get(key)
        if current is None or current.config_version != expected_version:
            return False
        self.endpoints[key] = replace(endpoint, published_version=current.published_version)
        return True

    def mark_published(self, tenant_id: str, endpoint_id: str, version: int) -> None:
        if self.fail_mark:
            raise errors.Unavailable("storage unavailable")
        current = self.endpoints[(tenant_id, endpoint_id)]
        if current.published_version < version:
            self.endpoints[(tenant_id, endpoint_id)] = replace(current, published_version=version)

    def get_endpoint(self, tenant_id: str, endpoint_id: str) -> Endpoint | None:
        return self.endpoints.get((tenant_id, endpoint_id))

    def put_clock_hold(self, tenant_id: str, endpoint_id: str, version: int, since_ms: int) -> None:
        self.clock_holds[(tenant_id, endpoint_id, version)] = since_ms

    def clear_clock_holds(self, tenant_id: str, endpoint_id: str, up_to_version: int) -> None:
        for key in [k for k in self.clock_holds if k[:2] == (tenant_id, endpoint_id) and k[2] <= up_to_version]:
            del self.clock_holds[key]

    def oldest_clock_hold_ms(self) -> int | None:
        return min(self.clock_holds.values(), default=None)

    def list_endpoints(self, tenant_id: str, after_id: str, limit: int) -> list[Endpoint]:
        rows = sorted(
            (e for (t, i), e in self.endpoints.items() if t == tenant_id and i > after_id),
            key=lambda e: e.endpoint_id,
        )
        return rows[:limit]

    def iter_unpublished(self) -> Iterator[tuple[str, str]]:
        return iter(
            [k for k, e in self.endpoints.items() if e.published_version < e.config_version]
        )

    def put_version(self, version: EndpointVersion) -> None:
        self.versions[(version.tenant_id, version.endpoint_id, version.config_version)] = version

    def list_versions(self, tenant_id: str, endpoint_id: str) -> list[EndpointVersion]:
        return sorted(
            (v for (t, e, _), v in self.versions.items() if (t, e) == (tenant_id, endpoint_id)),
            key=lambda v: -v.config_version,
        )

    def claim_request(self, record: IdempotencyRecord) -> IdempotencyRecord:
        return self.requests.setdefault((record.tenant_id, record.request_id), record)

    def get_delivery(self, delivery_id: str) -> DeliveryDetail | None:
        detail = self.deliveries.get(delivery_id)
        if detail is None:
            return None
        audits = sorted((a for (did, _), a in self.replay_audit.items() if did == delivery_id),
                        key=lambda a: (a.requested_at_ms, a.request_id))
        return replace(detail, replays=tuple(audits))

    def record_replay(self, audit: ReplayAudit, if_new: bool) -> bool:
        key = (audit.delivery_id, audit.request_id)
        if if_new and key in self.replay_audit:
            return False
        self.replay_audit[key] = audit
        return True

    def iter_endpoint_deliveries(
        self, tenant_id: str, endpoint_id: str, start_ms: int, end_ms: int,
        after: HistoryPosition | None,
    ) -> Iterator[DeliverySummary]:
        rows = sorted(
            (d.summary for d in self.deliveries.values()
             if d.summary.tenant_id == tenant_id and d.summary.endpoint_id == endpoint_id
             and start_ms <= d.summary.created_at_ms < end_ms),
            key=lambda s: (-s.created_at_ms, s.delivery_id),
        )
        for s in rows:
            if after is None or (-s.created_at_ms, s.delivery_id) > (-after[0], after[1]):
                yield s

    def iter_blocked_keys(self, tenant_id: str, endpoint_id: str, after: KeyPosition | None) -> Iterator[BlockedKey]:
        rows = sorted((k for (t, e, _), k in self.blocked.items() if (t, e) == (tenant_id, endpoint_id)),
                      key=lambda k: k.position)
        return iter([k for k in rows if after is None or k.position > after])

    def get_blocked_key(self, tenant_id: str, endpoint_id: str, ordering_key: str) -> BlockedKey | None:
        return self.blocked.get((tenant_id, endpoint_id, ordering_key))

    def delivery_statuses(self, delivery_ids: Sequence[str]) -> dict[str, DeliveryStatus]:
        return {did: self.deliveries[did].summary.status for did in delivery_ids if did in self.deliveries}


@dataclass
class RecordingPublisher:
    configs: list[EndpointConfig] = field(default_factory=list)
    clocks: list[ConfigClock] = field(default_factory=list)
    replays: list[ReplayRequest] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    failing: bool = False

    def _check(self) -> None:
        if self.failing:
            raise PublishError("broker down")

    def publish_config(self, config: EndpointConfig) -> None:
        self._check()
        self.configs.append(config)

    def publish_clock(self, clock: ConfigClock) -> None:
        self._check()
        self.clocks.append(clock)

    def publish_replay(self, request: ReplayRequest) -> None:
        self._check()
        self.replays.append(request)

    def publish_event(self, event: EventRecord) -> None:
        self._check()
        self.events.append(event)

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = T0
        self.slept: list[int] = []

    def __call__(self) -> int:
        return self.now

    def sleep_ms(self, ms: int) -> None:
        self.slept.append(ms)
        self.now += ms


def counting_random() -> object:
    counter = itertools.count(1)

    def random_bytes(n: int) -> bytes:
        return next(counter).to_bytes(8, "big").rjust(n, b"\x07")[:n]

    return random_bytes


@dataclass
class World:
    store: MemoryStore
    publisher: RecordingPublisher
    clock: Clock
    publication: ConfigPublication
    endpoints: EndpointService
    deliveries: DeliveryService
    admin: AdminService
    auth: Authenticator
    ordering: OrderingService


@pytest.fixture
def w() -> World:
    store, publisher, clock = MemoryStore(), RecordingPublisher(), Clock()
    rng = counting_random()
    publication = ConfigPublication(store, publisher, clock, lease_ms=LEASE_MS, sleep_ms=clock.sleep_ms)
    publication.republish_pending()  # as the server does first: the clock ticks after one pass
    endpoints = EndpointService(
        Deps(
            store=store,
            publication=publication,
            publisher=publisher,
            destination=DestinationValidator(EgressPolicy(), fake_resolver),
            master_key=Keyring.single(MASTER_KEY),
            now_ms=clock,
            random_bytes=rng,  # type: ignore[arg-type]
            default_overlap_s=24 * 3600,
            history=store,
            challenge_ttl_s=600,
        )
    )
    deliveries = DeliveryService(
        DeliveryDeps(endpoints=store, history=store, publisher=publisher, now_ms=clock,
                     random_bytes=rng, cursors=Cursors(b"cursor-key"), progress_every=2)  # type: ignore[arg-type]
    )
    admin = AdminService(store, clock, rng)  # type: ignore[arg-type]
    ordering = OrderingService(
        OrderingDeps(endpoints=store, history=store, keys=store, publisher=publisher, now_ms=clock,
                     random_bytes=rng, cursors=Cursors(b"cursor-key"))  # type: ignore[arg-type]
    )
    return World(store, publisher, clock, publication, endpoints, deliveries, admin,
                 Authenticator(store, "admin-secret"), ordering)


ALICE = Principal("tenant-a", "key_a", read_only=False)
BOB = Principal("tenant-b", "key_b", read_only=False)
ALICE_RO = Principal("tenant-a", "key_ro", read_only=True)


def spec(**overrides: object) -> EndpointSpec:
    base = EndpointSpec(
        url="https://hooks.example.com/in",
        description="orders",
        event_types=("invoice.*", "order.shipped"),
        rate_limit_per_s=None,
        max_in_flight=None,
        metadata={"team": "billing"},
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def create(w: World, who: Principal = ALICE, request_id: str = "", **overrides: object) -> Endpoint:
    return w.endpoints.create(who, spec(**overrides), request_id).endpoint


# -- create / get / list ------------------------------------------------------------------------


def test_create_returns_secret_once_stores_only_ciphertext_and_publishes(w: World) -> None:
    created = w.endpoints.create(ALICE, spec(), "")
    e = created.endpoint
    assert created.signing_secret.startswith("whsec_")
    assert e.config_version == 1 and e.published_version == 1
    assert e.spec.url == "https://hooks.example.com:443/in"  # canonical form the dispatcher uses
    assert e.spec.event_types == ("invoice.*", "order.shipped")
    stored = w.store.endpoints[("tenant-a", e.endpoint_id)]
    key = stored.signing_keys[0]
    assert created.signing_secret not in repr(stored)
    assert decrypt_secret(Keyring.single(MASTER_KEY), key.ciphertext_b64, tenant_id="tenant-a",
                          endpoint_id=e.endpoint_id, key_version=1) == created.signing_secret
    [config] = w.publisher.configs
    assert config.endpoint_id == e.endpoint_id and config.status is EndpointStatus.ACTIVE
    assert created.signing_secret.encode() not in config.to_json()
    assert w.store.versions[("tenant-a", e.endpoint_id, 1)].change == "create"
    assert w.endpoints.get(ALICE, e.endpoint_id) == stored


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"url": "http://hooks.example.com/"}, "scheme"),
        ({"url": "https://10.0.0.1/"}, "private"),
        ({"url": "https://rebind.example.com/"}, "loopback"),
        ({"url": "https://metadata.example.com/"}, "cloud_metadata"),
        ({"url": "https://nowhere.example.com/"}, "does not resolve"),
        ({"url": "https://user:pw@hooks.example.com/"}, "userinfo"),
        ({"url": "https://hooks.example.com:8443/"}, "port"),
        ({"url": ""}, "url is required"),
        ({"event_types": ()}, "at least one"),
        ({"event_types": ("Invoice Paid",)}, "not an event type"),
        ({"rate_limit_per_s": 0.0}, "rate_limit_per_s"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"description": "x" * 600}, "description"),
        ({"metadata": {"": "v"}}, "metadata keys"),
    ],
)
def test_create_refuses_bad_input_without_writing(w: World, overrides: dict, message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        create(w, **overrides)
    assert not w.store.endpoints and not w.publisher.configs


def test_dev_allowed_loopback_is_accepted_when_policy_allows_it(w: World) -> None:
    import ipaddress

    policy = EgressPolicy(allowed_ports=frozenset({443, 8443}),
                          dev_allow_cidrs=(ipaddress.ip_network("127.0.0.0/8"),))
    assert DestinationValidator(policy, fake_resolver)("https://127.0.0.1:8443/x") == (
        "https://127.0.0.1:8443/x"
    )


def test_idempotent_create_returns_the_same_endpoint_and_never_the_secret_again(w: World) -> None:
    """The secret is shown once. A retry under the same request_id (a client
    whose first answer was lost, or whoever replays its request) gets the endpoint and no secret;
    rotating the secret is how to get a usable one."""
    first = w.endpoints.create(ALICE, spec(), "req-1")
    assert first.signing_secret.startswith("whsec_")
    again = w.endpoints.create(ALICE, spec(), "req-1")
    assert again.endpoint.endpoint_id == first.endpoint.endpoint_id
    assert again.signing_secret == ""
    assert len(w.store.endpoints) == 1
    with pytest.raises(errors.AlreadyExists, match="different endpoint"):
        w.endpoints.create(ALICE, spec(description="other"), "req-1")
    # Request ids are per tenant.
    assert create(w, BOB, "req-1").endpoint_id != first.endpoint.endpoint_id
    with pytest.raises(errors.InvalidArgument, match="request_id"):
        w.endpoints.create(ALICE, spec(), "bad id!")


def test_list_pages_with_cursor_and_hides_deleted_and_other_tenants(w: World) -> None:
    ids = [create(w).endpoint_id for _ in range(5)]
    create(w, BOB)
    w.endpoints.delete(ALICE, ids[2])
    page1 = w.endpoints.list(ALICE, 2, "")
    page2 = w.endpoints.list(ALICE, 2, page1.next_cursor)
    assert page2.next_cursor == ""
    seen = [e.endpoint_id for e in page1.items + page2.items]
    assert seen == sorted(set(ids) - {ids[2]})
    with pytest.raises(errors.InvalidArgument, match="cursor"):
        w.endpoints.list(ALICE, 2, "garbage!")
    with pytest.raises(errors.InvalidArgument, match="page_size"):
        w.endpoints.list(ALICE, 1000, "")


# -- update / versions -------------------------------------------------------------------------


def test_update_with_field_mask_creates_versions_and_audits_each(w: World) -> None:
    e = create(w)
    w.clock.now += 1000
    u = w.endpoints.update(ALICE, e.endpoint_id, spec(url="https://other.example.com/new",
                                                       description="ignored"), ["url"])
    assert u.config_version == 2 and u.spec.url == "https://other.example.com:443/new"
    assert u.spec.description == "orders"  # not in the mask
    u = w.endpoints.update(ALICE, e.endpoint_id, spec(rate_limit_per_s=5.0, max_in_flight=3),
                           ["rate_limit_per_s", "max_in_flight"])
    assert (u.config_version, u.spec.rate_limit_per_s, u.spec.max_in_flight) == (3, 5.0, 3)
    # A named optional field left unset clears it.
    u = w.endpoints.update(ALICE, e.endpoint_id, spec(), ["rate_limit_per_s"])
    assert (u.config_version, u.spec.rate_limit_per_s) == (4, None)
    # No actual change: no new version.
    same = w.endpoints.update(ALICE, e.endpoint_id, spec(), ["description"])
    assert same.config_version == 4
    versions = w.endpoints.versions(ALICE, e.endpoint_id)
    assert [v.config_version for v in versions] == [4, 3, 2, 1]
    assert versions[2].change == "update url" and versions[2].spec.url.startswith("https://other")
    assert versions[3].spec.url == "https://hooks.example.com:443/in"  # history is not rewritten
    assert [c.config_version for c in w.publisher.configs] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("mask", "message"),
    [([], "update_mask is empty"), (["status"], "unknown or read-only"), (["url"], "scheme")],
)
def test_update_refuses_bad_masks_and_values(w: World, mask: list[str], message: str) -> None:
    e = create(w)
    with pytest.raises(errors.InvalidArgument, match=message):
        w.endpoints.update(ALICE, e.endpoint_id, spec(url="http://x.example.com/"), mask)
    assert w.store.endpoints[("tenant-a", e.endpoint_id)].config_version == 1


def test_update_retries_on_a_concurrent_change(w: World) -> None:
    e = create(w)
    real_replace = w.store.replace_endpoint
    raced = []

    def racing_replace(endpoint: Endpoint, expected: int) -> bool:
        if not raced:  # someone else commits version 2 between our read and our write
            raced.append(True)
            theirs = replace(endpoint.spec, description="theirs", metadata={"by": "them"})
            real_replace(replace(endpoint, spec=theirs, change="concurrent"), expected)
            return False
        return real_replace(endpoint, expected)

    w.store.replace_endpoint = racing_replace  # type: ignore[method-assign]
    u = w.endpoints.update(ALICE, e.endpoint_id, spec(description="mine"), ["description"])
    # Re-applied on the concurrent version: our field wins, theirs is kept, nothing is lost.
    assert (u.config_version, u.spec.description, u.spec.metadata) == (3, "mine", {"by": "them"})


def test_an_update_naming_a_stale_version_is_refused_and_changes_nothing(w: World) -> None:
    e = create(w)
    w.endpoints.update(ALICE, e.endpoint_id, spec(description="first"), ["description"])  # now v2
    with pytest.raises(errors.StaleVersion, match="config_version 2, not 1"):
        w.endpoints.update(ALICE, e.endpoint_id, spec(description="lost"), ["description"], expected_version=1)
    current = w.endpoints.get(ALICE, e.endpoint_id)
    assert (current.config_version, current.spec.description) == (2, "first")
    done = w.endpoints.update(ALICE, e.endpoint_id, spec(description="second"), ["description"], expected_version=2)
    assert (done.config_version, done.spec.description) == (3, "second")


def test_an_expected_version_is_checked_against_the_row_the_write_replaces(w: World) -> None:
    e = create(w)
    real_replace = w.store.replace_endpoint
    raced = []

    def racing_replace(endpoint: Endpoint, expected: int) -> bool:
        if not raced:  # another writer commits version 2 between our read of v1 and our write
            raced.append(True)
            real_replace(replace(endpoint, spec=replace(endpoint.spec, description="theirs")), expected)
            return False
        return real_replace(endpoint, expected)

    w.store.replace_endpoint = racing_replace  # type: ignore[method-assign]
    with pytest.raises(errors.StaleVersion):
        w.endpoints.update(ALICE, e.endpoint_id, spec(description="mine"), ["description"], expected_version=1)
    assert w.endpoints.get(ALICE, e.endpoint_id).spec.description == "theirs"  # their update is not lost


def test_disable_enable_delete(w: World) -> None:
    e = create(w)
    d = w.endpoints.set_enabled(ALICE, e.endpoint_id, enabled=False)
    assert (d.status, d.config_version) == (EndpointStatus.DISABLED, 2)
    assert w.endpoints.set_enabled(ALICE, e.endpoint_id, enabled=False).config_version == 2
    assert w.endpoints.set_enabled(ALICE, e.endpoint_id, enabled=True).status is EndpointStatus.ACTIVE
    gone = w.endpoints.delete(ALICE, e.endpoint_id)
    assert gone.config_version == 4
    assert w.publisher.configs[-1].status is EndpointStatus.DELETED
    with pytest.raises(errors.NotFound):
        w.endpoints.get(ALICE, e.endpoint_id)
    with pytest.raises(errors.NotFound):
        w.endpoints.delete(ALICE, e.endpoint_id)
    assert w.endpoints.versions(ALICE, e.endpoint_id)[0].status is EndpointStatus.DELETED


# -- secrets ------------------------------------------------------------------------------------


def test_rotation_with_overlap_keeps_both_keys_until_the_overlap_ends(w: World) -> None:
    created = w.endpoints.create(ALICE, spec(), "")
    e = created.endpoint
    rotated_at = w.clock.now  # the create's acknowledgement waited out the config clock's lease
    rotated = w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=False, overlap_s=0)
    assert rotated.new_key_version == 2 and rotated.signing_secret != created.signing_secret
    assert [(k.version, k.not_after_ms) for k in rotated.live_keys] == [(2, None), (1, rotated_at + DAY_MS)]
    config = w.publisher.configs[-1]
    assert [(k.version, k.not_after_ms) for k in config.signing_keys] == [(2, None), (1, rotated_at + DAY_MS)]
    w.clock.now = rotated_at + DAY_MS + 1
    assert [k.version for k in w.endpoints.get(ALICE, e.endpoint_id).live_keys(w.clock.now)] == [2]
    # A custom overlap, and a second rotation never extends an earlier key's end.
    w.clock.now = T0 + 10
    again = w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=False, overlap_s=60)
    assert [(k.version, k.not_after_ms) for k in again.live_keys] == [
        (3, None), (2, T0 + 10 + 60_000), (1, T0 + 10 + 60_000)
    ]


def test_rotation_with_immediate_revocation_leaves_only_the_new_key(w: World) -> None:
    e = create(w)
    rotated = w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=True, overlap_s=0)
    assert [k.version for k in rotated.live_keys] == [2]
    assert [k.version for k in w.publisher.configs[-1].signing_keys] == [2]
    assert "revoked" in w.endpoints.versions(ALICE, e.endpoint_id)[0].change


def test_rotation_limits(w: World) -> None:
    e = create(w)
    with pytest.raises(errors.InvalidArgument, match="overlap_seconds"):
        w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=False, overlap_s=-1)
    with pytest.raises(errors.InvalidArgument, match="immediate"):
        w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=True, overlap_s=5)
    for _ in range(3):
        w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=False, overlap_s=0)
    with pytest.raises(errors.FailedPrecondition, match="still live"):
        w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=False, overlap_s=0)


# -- publication, republisher, clock ------------------------------------------------------------


def test_publish_failure_is_caught_up_by_the_republisher_and_holds_the_clock(w: World) -> None:
    w.publication.publish_clock()
    w.publisher.failing = True
    w.clock.now += 100
    e = create(w)
    assert e.published_version == 0  # stored, not yet on Kafka: the response says so
    w.clock.now += 100
    with pytest.raises(PublishError):
        w.publication.publish_clock()
    w.publisher.failing = False
    w.clock.now += 100
    # The clock may not pass the unpublished change.
    assert w.publication.publish_clock() is True
    assert w.publisher.clocks[-1].published_at_ms == T0 + 99
    assert w.publication.republish_pending() == 1
    assert w.store.endpoints[("tenant-a", e.endpoint_id)].published_version == 1
    assert w.publisher.configs[-1].config_version == 1
    assert ("tenant-a", e.endpoint_id, 1) in w.store.versions
    w.publication.publish_clock()
    assert w.publisher.clocks[-1].published_at_ms == w.clock.now


def restarted(w: World) -> ConfigPublication:
    """The same rows and topic, a new process: no holds in memory, no pass made yet."""
    return ConfigPublication(w.store, w.publisher, w.clock, lease_ms=LEASE_MS, sleep_ms=w.clock.sleep_ms)


def test_a_config_stored_by_a_process_that_died_before_publishing_holds_the_next_processs_clock(
    w: World,
) -> None:
    w.publisher.failing = True
    w.clock.now += 100
    e = create(w)  # stored at T0+100; the process dies before any republish
    publication = restarted(w)
    w.clock.now += 1_000
    assert publication.publish_clock() is False  # no tick before a pass has read the rows
    assert publication.republish_pending() == 0  # Kafka still refuses: the row stays held
    w.publisher.failing = False
    assert publication.publish_clock() is True
    assert w.publisher.clocks[-1].published_at_ms == T0 + 99  # never past the stored config
    assert publication.republish_pending() == 1
    assert w.publisher.configs[-1].endpoint_id == e.endpoint_id
    w.clock.now += 10
    publication.publish_clock()
    assert w.publisher.clocks[-1].published_at_ms == w.clock.now


def test_a_change_one_replica_could_not_publish_holds_every_replicas_clock(w: World) -> None:
    other = restarted(w)  # a second replica on the same rows and topic
    other.republish_pending()
    w.clock.now += 100
    w.publisher.failing = True
    e = create(w)  # acknowledged with published_version 0 by this replica
    assert e.published_version == 0
    w.publisher.failing = False
    w.clock.now += 1_000
    assert other.publish_clock() is True
    assert w.publisher.clocks[-1].published_at_ms == T0 + 99  # the other replica is held too
    other.republish_pending()  # whichever replica publishes it releases everyone
    assert w.store.clock_holds == {}
    assert other.publish_clock() is True and w.publisher.clocks[-1].published_at_ms == w.clock.now


def test_other_replicas_holds_are_read_once_per_interval_not_on_every_tick(w: World) -> None:
    reads = 0
    scan = w.store.oldest_clock_hold_ms

    def counted() -> int | None:
        nonlocal reads
        reads += 1
        return scan()

    w.store.oldest_clock_hold_ms = counted  # type: ignore[method-assign]
    for _ in range(40):  # 2 s of ticks every 50 ms
        w.clock.now += 50
        w.publication.publish_clock()
    assert reads == 2  # one per 1,000 ms interval, not 40
    # Another replica stored a change it could not publish: its durable hold row stops this
    # replica's clock at the next read, within the interval.
    held_since = w.clock.now + 10
    w.store.put_clock_hold("tenant-a", "ep_elsewhere", 1, held_since)
    w.clock.now += 1_000
    w.publication.publish_clock()  # read again: up to just before the change, no further
    assert w.publisher.clocks[-1].published_at_ms == held_since - 1
    w.clock.now += 50
    assert w.publication.publish_clock() is False
    assert reads == 3


def test_a_hold_satisfied_elsewhere_is_settled_by_the_next_full_pass(w: World) -> None:
    w.publisher.failing = True
    e = create(w)
    w.publisher.failing = False
    restarted(w).republish_pending()  # another replica publishes the row
    assert w.publication.watermark.clock_value(w.clock.now + 10) < w.clock.now  # still held here
    w.clock.now += 10
    w.publication.republish_pending()  # nothing lagging any more: the old hold goes
    assert w.publication.watermark.clock_value(w.clock.now) == w.clock.now
    assert w.store.endpoints[("tenant-a", e.endpoint_id)].published_version == 1


def test_a_retried_create_publishes_a_config_its_first_attempt_left_unpublished(w: World) -> None:
    w.publisher.failing = True
    first = create(w, request_id="req-1")
    assert first.published_version == 0 and w.publisher.configs == []
    w.publisher.failing = False
    again = create(w, request_id="req-1")  # the client retries: success means "on the topic"
    assert again.endpoint_id == first.endpoint_id and again.published_version == 1
    assert [c.endpoint_id for c in w.publisher.configs] == [first.endpoint_id]


def test_failed_mark_is_republished_and_refused_change_releases_the_clock(w: World) -> None:
    w.store.fail_mark = True
    e = create(w)
    assert e.published_version == 0
    w.store.fail_mark = False
    assert w.publication.republish_pending() == 1
    assert [c.config_version for c in w.publisher.configs] == [1, 1]  # duplicate is harmless
    with pytest.raises(errors.InvalidArgument):
        w.endpoints.update(ALICE, e.endpoint_id, spec(), ["bogus"])
    assert w.publication.watermark.clock_value(w.clock.now) == w.clock.now


def test_unpublished_version_is_audited_before_it_is_replaced(w: World) -> None:
    w.publisher.failing = True
    e = create(w)
    w.store.versions.clear()  # as if the process died before any audit write
    w.endpoints.update(ALICE, e.endpoint_id, spec(description="v2"), ["description"])
    assert ("tenant-a", e.endpoint_id, 1) in w.store.versions


# -- ping ------------------------------------------------------------------------------------------


def test_send_test_event_targets_only_that_endpoint(w: World) -> None:
    e = create(w)
    sent = w.endpoints.send_test_event(ALICE, e.endpoint_id)
    [event] = w.publisher.events
    assert event.event_type == PING_EVENT_TYPE and event.tenant_id == "tenant-a"
    assert event.target_endpoint_id == e.endpoint_id and event.event_id == sent.event_id
    assert sent.delivery_id == delivery_id_for(sent.event_id, e.endpoint_id)
    w.endpoints.set_enabled(ALICE, e.endpoint_id, enabled=False)
    with pytest.raises(errors.FailedPrecondition, match="disabled"):
        w.endpoints.send_test_event(ALICE, e.endpoint_id)
    w.endpoints.set_enabled(ALICE, e.endpoint_id, enabled=True)
    w.publisher.failing = True
    with pytest.raises(errors.Unavailable):
        w.endpoints.send_test_event(ALICE, e.endpoint_id)


# -- deliveries ---------------------------------------------------------------------------------


def add_delivery(w: World, e: Endpoint, n: int, status: DeliveryStatus, age_ms: int = 0,
                 tenant: str = "tenant-a") -> str:
    event_id = f"evt_{n}"
    did = delivery_id_for(event_id, e.endpoint_id)
    summary = DeliverySummary(did, event_id, tenant, e.endpoint_id, "invoice.paid", status, 2,
                              500, w.clock.now - age_ms - n, None)
    attempt = Attempt(1, "att1", summary.created_at_ms, summary.created_at_ms + 5, 500, 5,
                      "retry", "http_5xx", False, 1, e.spec.url, (1,), "", "")
    w.store.deliveries[did] = DeliveryDetail(summary, 1, status is DeliveryStatus.PENDING,
                                             None, None, "http_5xx", (attempt,))
    return did


def test_list_deliveries_filters_by_status_and_time_and_pages(w: World) -> None:
    e = create(w)
    failed = [add_delivery(w, e, n, DeliveryStatus.FAILED) for n in range(1, 6)]
    add_delivery(w, e, 10, DeliveryStatus.SUCCEEDED)
    add_delivery(w, e, 11, DeliveryStatus.FAILED, age_ms=2 * DAY_MS)
    page = w.deliveries.list(ALICE, e.endpoint_id, [DeliveryStatus.FAILED],
                             w.clock.now - DAY_MS, None, 3, "")
    page2 = w.deliveries.list(ALICE, e.endpoint_id, [DeliveryStatus.FAILED],
                              w.clock.now - DAY_MS, None, 3, page.next_cursor)
    assert [d.delivery_id for d in page.items + page2.items] == failed  # newest first
    assert page2.next_cursor == ""
    everything = w.deliveries.list(ALICE, e.endpoint_id, [], None, None, 50, "")
    assert len(everything.items) == 7
    with pytest.raises(errors.InvalidArgument, match="different"):
        w.deliveries.list(ALICE, e.endpoint_id, [], None, None, 3, page.next_cursor)
    with pytest.raises(errors.InvalidArgument, match="before"):
        w.deliveries.list(ALICE, e.endpoint_id, [], w.clock.now, w.clock.now - 1, 3, "")
    with pytest.raises(errors.InvalidArgument, match="30 days"):
        w.deliveries.list(ALICE, e.endpoint_id, [], w.clock.now - 40 * DAY_MS, w.clock.now, 3, "")


def test_get_delivery_shows_attempts_config_version_and_retry_state(w: World) -> None:
    e = create(w)
    did = add_delivery(w, e, 1, DeliveryStatus.PENDING)
    detail = w.deliveries.get(ALICE, did)
    assert detail.endpoint_config_version == 1 and detail.auto_retry_active
    assert [a.attempt_number for a in detail.attempts] == [1]
    with pytest.raises(errors.NotFound):
        w.deliveries.get(ALICE, "dlv_unknown")


def test_replay_publishes_a_manual_request_for_the_same_delivery(w: World) -> None:
    e = create(w)
    did = add_delivery(w, e, 1, DeliveryStatus.FAILED)
    replayed = w.deliveries.replay(ALICE, did, "")
    [req] = w.publisher.replays
    assert (req.delivery_id, req.tenant_id, req.endpoint_id, req.requested_by) == (
        did, "tenant-a", e.endpoint_id, "key_a")
    assert req.request_id == replayed.request_id and req.request_id.startswith("rpl_")
    assert w.deliveries.replay(ALICE, did, "my-req").request_id == "my-req"
    assert not w.publisher.events  # never a new event


def test_replay_preconditions(w: World) -> None:
    e = create(w)
    did = add_delivery(w, e, 1, DeliveryStatus.FAILED)
    old = add_delivery(w, e, 2, DeliveryStatus.FAILED, age_ms=HISTORY_WINDOW_MS + 1)
    with pytest.raises(errors.FailedPrecondition, match="30-day"):
        w.deliveries.replay(ALICE, old, "")
    with pytest.raises(errors.PermissionDenied, match="read-only"):
        w.deliveries.replay(ALICE_RO, did, "")
    skipped = add_delivery(w, e, 3, DeliveryStatus.SKIPPED)
    with pytest.raises(errors.FailedPrecondition, match="skipped.*never meant for this endpoint"):
        w.deliveries.replay(ALICE, skipped, "")
    w.endpoints.set_enabled(ALICE, e.endpoint_id, enabled=False)
    with pytest.raises(errors.FailedPrecondition, match="disabled"):
        w.deliveries.replay(ALICE, did, "")
    w.endpoints.delete(ALICE, e.endpoint_id)
    with pytest.raises(errors.FailedPrecondition, match="deleted"):
        w.deliveries.replay(ALICE, did, "")
    assert not w.publisher.replays


def test_bulk_recover_replays_failed_and_expired_with_progress(w: World) -> None:
    e = create(w)
    failed = [add_delivery(w, e, n, DeliveryStatus.FAILED) for n in range(1, 4)]
    failed.append(add_delivery(w, e, 4, DeliveryStatus.EXPIRED))
    add_delivery(w, e, 5, DeliveryStatus.SUCCEEDED)
    add_delivery(w, e, 6, DeliveryStatus.PENDING)
    add_delivery(w, e, 7, DeliveryStatus.SKIPPED)  # never sent: nothing to recover
    progress = list(w.deliveries.recover(ALICE, e.endpoint_id, w.clock.now - DAY_MS, w.clock.now + 1))
    assert [(p.total, p.replayed, p.done) for p in progress] == [
        (4, 0, False), (4, 2, False), (4, 4, False), (4, 4, True)
    ]
    assert sorted(r.delivery_id for r in w.publisher.replays) == sorted(failed)
    assert len({r.request_id for r in w.publisher.replays}) == 4


def test_replays_are_audited_who_when_why_once_per_request_id(w: World) -> None:
    """Who (API key id), when and why, shown with the delivery; a client retrying
    with the same request id is queued again (the job dedupes) but audited once."""
    e = create(w)
    did = add_delivery(w, e, 1, DeliveryStatus.FAILED)
    w.deliveries.replay(ALICE, did, "req-1", reason="  customer fixed their TLS certificate ")
    w.clock.now += 5_000
    w.deliveries.replay(ALICE, did, "req-1", reason="a retry of the same call")
    w.clock.now += 5_000
    generated = w.deliveries.replay(ALICE, did, "").request_id
    assert [r.request_id for r in w.publisher.replays] == ["req-1", "req-1", generated]
    audit = w.deliveries.get(ALICE, did).replays
    assert [(a.request_id, a.requested_by, a.requested_at_ms, a.reason) for a in audit] == [
        ("req-1", "key_a", w.clock.now - 10_000, "customer fixed their TLS certificate"),
        (generated, "key_a", w.clock.now, "")]
    assert all(a.tenant_id == "tenant-a" for a in audit)


@pytest.mark.parametrize(("reason", "error"), [("x" * 501, "at most 500"), ("two\nlines", "one line"),
                                                ("bell\x07", "one line")])
def test_a_bad_replay_reason_is_refused_before_anything_is_written(w: World, reason: str, error: str) -> None:
    e = create(w)
    did = add_delivery(w, e, 1, DeliveryStatus.FAILED)
    with pytest.raises(errors.InvalidArgument, match=error):
        w.deliveries.replay(ALICE, did, "", reason=reason)
    with pytest.raises(errors.InvalidArgument, match=error):
        list(w.deliveries.recover(ALICE, e.endpoint_id, w.clock.now - DAY_MS, w.clock.now + 1, reason=reason))
    assert not w.publisher.replays and not w.store.replay_audit


def test_a_bulk_recovery_audits_each_replay_with_its_reason(w: World) -> None:
    e = create(w)
    failed = [add_delivery(w, e, n, DeliveryStatus.FAILED) for n in range(1, 4)]
    list(w.deliveries.recover(ALICE, e.endpoint_id, w.clock.now - DAY_MS, w.clock.now + 1, reason="outage INC-42"))
    for did in failed:
        [a] = w.deliveries.get(ALICE, did).replays
        assert a.reason == "outage INC-42" and a.requested_by == "key_a"
        assert a.request_id in {r.request_id for r in w.publisher.replays}


def test_bulk_recover_validates_before_streaming(w: World) -> None:
    e = create(w)
    with pytest.raises(errors.InvalidArgument, match="required"):
        w.deliveries.recover(ALICE, e.endpoint_id, None, None)
    with pytest.raises(errors.FailedPrecondition, match="30-day"):
        w.deliveries.recover(ALICE, e.endpoint_id, w.clock.now - 31 * DAY_MS, w.clock.now - 2 * DAY_MS)
    with pytest.raises(errors.NotFound):
        w.deliveries.recover(BOB, e.endpoint_id, w.clock.now - DAY_MS, w.clock.now)
    empty = list(w.deliveries.recover(ALICE, e.endpoint_id, w.clock.now - DAY_MS, w.clock.now))
    assert [(p.total, p.done) for p in empty] == [(0, True)]
    add_delivery(w, e, 1, DeliveryStatus.FAILED)
    w.publisher.failing = True
    stream = w.deliveries.recover(ALICE, e.endpoint_id, w.clock.now - DAY_MS, w.clock.now + 1)
    assert next(stream).total == 1
    with pytest.raises(errors.Unavailable):
        next(stream)


# -- tenancy ------------------------------------------------------------------------------------


def test_other_tenants_ids_are_not_found_on_every_call(w: World) -> None:
    e = create(w)
    did = add_delivery(w, e, 1, DeliveryStatus.FAILED)
    calls = [
        lambda: w.endpoints.get(BOB, e.endpoint_id),
        lambda: w.endpoints.update(BOB, e.endpoint_id, spec(), ["description"]),
        lambda: w.endpoints.set_enabled(BOB, e.endpoint_id, enabled=False),
        lambda: w.endpoints.set_enabled(BOB, e.endpoint_id, enabled=True),
        lambda: w.endpoints.delete(BOB, e.endpoint_id),
        lambda: w.endpoints.versions(BOB, e.endpoint_id),
        lambda: w.endpoints.rotate_secret(BOB, e.endpoint_id, revoke_immediately=True, overlap_s=0),
        lambda: w.endpoints.send_test_event(BOB, e.endpoint_id),
        lambda: w.deliveries.list(BOB, e.endpoint_id, [], None, None, 10, ""),
        lambda: w.deliveries.get(BOB, did),
        lambda: w.deliveries.replay(BOB, did, ""),
        lambda: w.deliveries.recover(BOB, e.endpoint_id, w.clock.now - DAY_MS, w.clock.now),
    ]
    for call in calls:
        with pytest.raises(errors.NotFound):
            call()
    assert w.endpoints.list(BOB, 10, "").items == ()
    assert w.store.endpoints[("tenant-a", e.endpoint_id)].config_version == 1
    assert not w.publisher.replays and not w.publisher.events


def test_read_only_keys_can_read_but_not_change(w: World) -> None:
    e = create(w)
    assert w.endpoints.get(ALICE_RO, e.endpoint_id).endpoint_id == e.endpoint_id
    for call in (
        lambda: w.endpoints.create(ALICE_RO, spec(), ""),
        lambda: w.endpoints.update(ALICE_RO, e.endpoint_id, spec(), ["description"]),
        lambda: w.endpoints.delete(ALICE_RO, e.endpoint_id),
        lambda: w.endpoints.rotate_secret(ALICE_RO, e.endpoint_id, revoke_immediately=True, overlap_s=0),
        lambda: w.endpoints.send_test_event(ALICE_RO, e.endpoint_id),
    ):
        with pytest.raises(errors.PermissionDenied):
            call()


# -- admin and authentication -------------------------------------------------------------------


def test_admin_creates_tenants_and_keys_and_auth_checks_them(w: World) -> None:
    tenant = w.admin.create_tenant("acme", "Acme")
    with pytest.raises(errors.AlreadyExists):
        w.admin.create_tenant("acme", "Acme again")
    with pytest.raises(errors.InvalidArgument, match="tenant_id"):
        w.admin.create_tenant("A!", "")
    assert w.admin.create_tenant("", "generated").tenant_id.startswith("t_")
    issued = w.admin.create_api_key(tenant.tenant_id, "ci", read_only=True)
    assert issued.plaintext.startswith("whk_")
    assert issued.plaintext not in repr(w.store.keys) and hash_api_key(issued.plaintext) in w.store.keys
    md = [("authorization", f"Bearer {issued.plaintext}")]
    assert w.auth.tenant(md) == Principal("acme", issued.key.key_id, read_only=True)
    with pytest.raises(errors.PermissionDenied):
        w.auth.admin(md)
    with pytest.raises(errors.PermissionDenied):
        w.auth.tenant([("authorization", "Bearer admin-secret")])
    w.auth.admin([("authorization", "Bearer admin-secret")])
    with pytest.raises(errors.NotFound):
        w.admin.create_api_key("nobody", "", read_only=False)
    w.admin.revoke_api_key("acme", issued.key.key_id)
    with pytest.raises(errors.Unauthenticated):
        w.auth.tenant(md)
    with pytest.raises(errors.NotFound):
        w.admin.revoke_api_key("other", issued.key.key_id)


@pytest.mark.parametrize(
    "metadata",
    [[], [("authorization", "Basic abc")], [("authorization", "Bearer ")],
     [("authorization", "Bearer whk_unknown")], [("authorization", "Bearer nope")]],
)
def test_missing_or_unknown_credentials_are_unauthenticated(w: World, metadata: list) -> None:
    with pytest.raises(errors.Unauthenticated):
        w.auth.tenant(metadata)
    with pytest.raises(errors.Unauthenticated):
        w.auth.admin(metadata)


def test_bearer_token_accepts_bytes_and_case() -> None:
    assert bearer_token([("Authorization", b"bearer abc ")]) == "abc"



def _forge(real: str, **changes: object) -> str:
    """A cursor with fields changed, as an attacker who read one would make it (the signature,
    if any, kept as it was)."""
    import base64
    import json

    body, dot, sig = real.partition(".")
    fields = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    raw = json.dumps({**fields, **changes}, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=") + dot + sig


def test_a_forged_delivery_cursor_is_refused_before_any_read(w: World) -> None:
    """The cursor carries the time range resolved on the first page; forged to
    span years it would walk one Cassandra partition per day. Signed, it is refused unread."""
    e = create(w)
    for n in range(1, 6):
        add_delivery(w, e, n, DeliveryStatus.FAILED)
    page = w.deliveries.list(ALICE, e.endpoint_id, [], None, None, 2, "")
    assert page.next_cursor
    reads: list[tuple[int, int]] = []
    real_iter = w.store.iter_endpoint_deliveries

    def counting(tenant_id, endpoint_id, start_ms, end_ms, after):  # type: ignore[no-untyped-def]
        reads.append((start_ms, end_ms))
        return real_iter(tenant_id, endpoint_id, start_ms, end_ms, after)

    w.store.iter_endpoint_deliveries = counting  # type: ignore[method-assign]
    for forged in (_forge(page.next_cursor, start=0), _forge(page.next_cursor, end=w.clock.now + 400 * DAY_MS),
                   _forge(page.next_cursor, at=w.clock.now + 1), page.next_cursor[:-2],
                   page.next_cursor.partition(".")[0]):
        with pytest.raises(errors.InvalidArgument, match="cursor"):
            w.deliveries.list(ALICE, e.endpoint_id, [], None, None, 2, forged)
    assert reads == []
    assert len(w.deliveries.list(ALICE, e.endpoint_id, [], None, None, 2, page.next_cursor).items) == 2


def test_a_forged_endpoint_cursor_is_refused(w: World) -> None:
    for _ in range(3):
        create(w)
    page = w.endpoints.list(ALICE, 2, "")
    with pytest.raises(errors.InvalidArgument, match="cursor"):
        w.endpoints.list(ALICE, 2, _forge(page.next_cursor, after=""))
    assert len(w.endpoints.list(ALICE, 2, page.next_cursor).items) == 1


# -- ed25519 endpoints --------------------------------------------------------

def _stored_secret(w: World, e: Endpoint, version: int) -> str:
    from core.secrets import decrypt_secret

    stored = w.store.endpoints[(e.tenant_id, e.endpoint_id)]
    [key] = [k for k in stored.signing_keys if k.version == version]
    return decrypt_secret(Keyring.single(MASTER_KEY), key.ciphertext_b64, tenant_id=e.tenant_id,
                          endpoint_id=e.endpoint_id, key_version=version)


def test_an_ed25519_endpoint_hands_out_its_public_key_and_keeps_the_private_one(w: World) -> None:
    from core import signing

    created = w.endpoints.create(ALICE, spec(), "", signature_scheme="ed25519")
    assert created.signing_secret == "" and created.public_key.startswith("whpk_")
    e = created.endpoint
    [key] = e.signing_keys
    assert key.scheme == "ed25519" and key.public_key == created.public_key
    whsk = _stored_secret(w, e, 1)  # encrypted at rest like an HMAC secret
    assert whsk.startswith("whsk_") and signing.public_key(whsk) == created.public_key
    assert whsk[5:] not in repr(created)
    # What the job receives: the same ciphertext; the dispatcher derives v1a signatures from it.
    assert w.publisher.configs[-1].signing_keys[0].ciphertext_b64 == key.ciphertext_b64


def test_an_unknown_scheme_is_refused_before_anything_is_stored(w: World) -> None:
    with pytest.raises(errors.InvalidArgument, match="unknown signature_scheme 'rsa'"):
        w.endpoints.create(ALICE, spec(), "", signature_scheme="rsa")
    assert not w.store.endpoints
    e = create(w)
    with pytest.raises(errors.InvalidArgument, match="unknown signature_scheme"):
        w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=False, overlap_s=0,
                                  signature_scheme="hmac-sha1")


def test_rotation_moves_an_endpoint_between_schemes_with_an_overlap(w: World) -> None:
    e = create(w)  # HMAC
    rotated = w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=False, overlap_s=3600,
                                        signature_scheme="ed25519")
    assert rotated.signing_secret == "" and rotated.public_key.startswith("whpk_")
    assert [(k.version, k.scheme) for k in rotated.live_keys] == [(2, "ed25519"), (1, "hmac-sha256")]
    again = w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=True, overlap_s=0)
    assert again.public_key.startswith("whpk_") and again.public_key != rotated.public_key  # kept ed25519
    back = w.endpoints.rotate_secret(ALICE, e.endpoint_id, revoke_immediately=True, overlap_s=0,
                                     signature_scheme="hmac-sha256")
    assert back.signing_secret.startswith("whsec_") and back.public_key == ""


def test_a_retried_create_must_ask_for_the_same_scheme(w: World) -> None:
    first = w.endpoints.create(ALICE, spec(), "req-ed", signature_scheme="ed25519")
    again = w.endpoints.create(ALICE, spec(), "req-ed", signature_scheme="ed25519")
    assert again.endpoint.endpoint_id == first.endpoint.endpoint_id
    assert again.public_key == "" and again.signing_secret == ""  # the retry shows no key either way
    with pytest.raises(errors.AlreadyExists):
        w.endpoints.create(ALICE, spec(), "req-ed")  # same body, HMAC this time


# -- master-key rotation --------------------------------------------------------

NEW_MASTER = bytes(range(100, 132))


def test_reencryption_moves_every_live_key_to_the_new_master_key(w: World) -> None:
    """Keys sealed under k1 (one endpoint mid-rotation with two live keys) are sealed again under
    k2 with the same plaintext and version, as an audited, published change; a second pass and a
    dry run change nothing; once done, a keyring without k1 still opens every key."""
    from core.secrets import sealed_with

    w.store.tenants["tenant-a"] = Tenant("tenant-a", "a", 0)
    one, two = create(w), create(w)
    w.endpoints.rotate_secret(ALICE, two.endpoint_id, revoke_immediately=False, overlap_s=3600)
    gone = create(w)
    w.endpoints.delete(ALICE, gone.endpoint_id)
    before = {e.endpoint_id: [_stored_secret(w, e, k.version) for k in
                              w.store.endpoints[(e.tenant_id, e.endpoint_id)].signing_keys] for e in (one, two)}
    ring = Keyring("k2", {"k2": NEW_MASTER, "k1": MASTER_KEY})
    rotated = replace(w.endpoints._d, master_key=ring)  # what the new settings give the service
    service = EndpointService(rotated)

    dry = service.reencrypt_keys(None, dry_run=True)
    assert (dry.endpoints_scanned, dry.endpoints_reencrypted, dry.keys_by_master_key) == (2, 0, {"k1": 3})
    published = len(w.publisher.configs)
    report = service.reencrypt_keys(None, dry_run=False)
    assert (report.current_id, report.endpoints_reencrypted, report.keys_reencrypted) == ("k2", 2, 3)
    assert report.keys_by_master_key == {"k2": 3} and report.unpublished == 0
    assert len(w.publisher.configs) == published + 2  # the job gets the re-sealed keys
    for e in (one, two):
        stored = w.store.endpoints[(e.tenant_id, e.endpoint_id)]
        assert all(sealed_with(k.ciphertext_b64) == "k2" for k in stored.signing_keys)
        assert stored.change == "re-encrypt signing keys under master key k2" and stored.changed_by == "admin"
        opened = [decrypt_secret(Keyring.single(NEW_MASTER, "k2"), k.ciphertext_b64, tenant_id=e.tenant_id,
                                 endpoint_id=e.endpoint_id, key_version=k.version) for k in stored.signing_keys]
        assert opened == before[e.endpoint_id]  # same secrets: receivers notice nothing
    again = service.reencrypt_keys(None, dry_run=False)
    assert again.endpoints_reencrypted == 0 and len(w.publisher.configs) == published + 2


def test_a_new_secret_is_sealed_under_the_current_key_and_named(w: World) -> None:
    from core.secrets import sealed_with

    service = EndpointService(replace(w.endpoints._d, master_key=Keyring("k2", {"k2": NEW_MASTER, "k1": MASTER_KEY})))
    e = service.create(ALICE, spec(), "").endpoint
    assert sealed_with(e.signing_keys[0].ciphertext_b64) == "k2"


# -- payload minimisation and subscription authorisation ------------------------

def test_an_endpoint_can_be_sent_only_allowed_fields_and_the_job_is_told(w: World) -> None:
    e = w.endpoints.create(ALICE, spec(payload_mode="fields", payload_fields=("/id", "/customer/id")), "").endpoint
    assert (e.spec.payload_mode, e.spec.payload_fields) == ("fields", ("/id", "/customer/id"))
    cfg = w.publisher.configs[-1]
    assert (cfg.payload_mode, cfg.payload_fields) == ("fields", ("/id", "/customer/id"))
    thin = w.endpoints.update(ALICE, e.endpoint_id, spec(payload_mode="thin"), ["payload_mode", "payload_fields"])
    assert (thin.spec.payload_mode, thin.spec.payload_fields) == ("thin", ())
    assert thin.change == "update payload_fields,payload_mode"


@pytest.mark.parametrize(("mode", "fields", "error"), [
    ("fields", (), "needs at least one JSON Pointer"),
    ("fields", ("customer.id",), "must start with '/'"),
    ("thin", ("/id",), "only used with payload mode 'fields'"),
    ("partial", (), "unknown payload mode"),
])
def test_a_malformed_allow_list_is_invalid_argument(w: World, mode: str, fields: tuple[str, ...], error: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=f"payload allow-list: .*{error}"):
        w.endpoints.create(ALICE, spec(payload_mode=mode, payload_fields=fields), "")
    assert not w.store.endpoints


def test_an_update_to_fields_mode_without_fields_is_refused(w: World) -> None:
    e = create(w)
    with pytest.raises(errors.InvalidArgument, match="needs at least one"):
        w.endpoints.update(ALICE, e.endpoint_id, spec(payload_mode="fields"), ["payload_mode"])


def test_a_restricted_tenant_subscribes_only_within_its_allow_list(w: World) -> None:
    from control_plane.admin import AdminService

    w.store.tenants["tenant-a"] = Tenant("tenant-a", "a", 0)
    wide = create(w, event_types=("*",))
    narrow = create(w, event_types=("invoice.paid",))
    admin = AdminService(w.store, w.clock, counting_random())  # type: ignore[arg-type]
    tenant, outside = admin.set_event_types("tenant-a", ["invoice.*", "order.shipped"], unrestricted=False)
    assert tenant.allowed_event_types == ("invoice.*", "order.shipped") and outside == [wide.endpoint_id]
    assert narrow.endpoint_id not in outside
    create(w, event_types=("invoice.*", "invoice.paid.v2.*", "order.shipped"))  # covered
    create(w, event_types=("webhooks.*",))  # operational events, about its own endpoints: always allowed
    for refused in (("*",), ("order.*",), ("customer.created",), ("invoice.paid", "refund.created")):
        with pytest.raises(errors.PermissionDenied, match="not allowed for this tenant"):
            create(w, event_types=refused)
    with pytest.raises(errors.PermissionDenied, match=r"\*"):
        w.endpoints.update(ALICE, narrow.endpoint_id, spec(event_types=("*",)), ["event_types"])
    admin.set_event_types("tenant-a", [], unrestricted=True)
    create(w, event_types=("*",))  # lifted
    with pytest.raises(errors.NotFound):
        admin.set_event_types("tenant-nope", ["a.b"], unrestricted=False)
    with pytest.raises(errors.InvalidArgument):
        admin.set_event_types("tenant-a", ["a.b"], unrestricted=True)


# -- endpoint ownership challenge ---------------------------------------------

def _answer(w: World, e: Endpoint, status: int = 200, echo: bool = True) -> None:
    """What the job records when the URL answers the challenge event (history, as the job writes it)."""
    import json as _json

    [event] = [ev for ev in w.publisher.events if ev.event_id == e.challenge.event_id]  # type: ignore[union-attr]
    token = _json.loads(event.payload)["challenge"]
    did = delivery_id_for(event.event_id, e.endpoint_id)
    body = _json.dumps({"challenge": token}) if echo else "{}"
    attempt = Attempt(1, "a1", w.clock.now, w.clock.now + 5, status, 5, "succeeded", "", False, 1, e.spec.url,
                      (1,), "", body)
    summary = DeliverySummary(did, event.event_id, e.tenant_id, e.endpoint_id, "webhook.challenge",
                              DeliveryStatus.SUCCEEDED, 1, status, w.clock.now, None)
    w.store.deliveries[did] = DeliveryDetail(summary, 1, False, None, None, "", (attempt,))


def test_a_verifying_tenants_endpoint_waits_for_its_challenge(w: World) -> None:
    w.store.tenants["tenant-a"] = Tenant("tenant-a", "a", 0, verify_endpoints=True)
    e = w.endpoints.create(ALICE, spec(), "").endpoint
    assert e.status is EndpointStatus.PENDING_VERIFICATION and e.challenge is not None
    assert w.publisher.configs[-1].status is EndpointStatus.PENDING_VERIFICATION
    [challenge] = w.publisher.events
    assert (challenge.event_type, challenge.target_endpoint_id) == ("webhook.challenge", e.endpoint_id)
    assert challenge.target_proof  # the job honours the target only with the proof
    with pytest.raises(errors.FailedPrecondition, match="has not answered its challenge.*no attempt yet"):
        w.endpoints.verify(ALICE, e.endpoint_id)
    with pytest.raises(errors.FailedPrecondition, match="awaits its ownership challenge"):
        w.endpoints.set_enabled(ALICE, e.endpoint_id, enabled=True)
    _answer(w, e, echo=False)
    with pytest.raises(errors.FailedPrecondition, match="1 attempt"):
        w.endpoints.verify(ALICE, e.endpoint_id)
    _answer(w, e)
    verified = w.endpoints.verify(ALICE, e.endpoint_id)
    assert verified.status is EndpointStatus.ACTIVE and verified.challenge is None
    assert verified.change.startswith("verified ownership")
    assert w.publisher.configs[-1].status is EndpointStatus.ACTIVE
    assert w.endpoints.verify(ALICE, e.endpoint_id) == verified  # idempotent


def test_an_expired_challenge_is_refused_and_a_new_one_can_be_sent(w: World) -> None:
    w.store.tenants["tenant-a"] = Tenant("tenant-a", "a", 0, verify_endpoints=True)
    e = w.endpoints.create(ALICE, spec(), "").endpoint
    _answer(w, e)
    w.clock.now += 601_000  # challenge_ttl_s=600
    with pytest.raises(errors.FailedPrecondition, match="expired"):
        w.endpoints.verify(ALICE, e.endpoint_id)
    again = w.endpoints.resend_challenge(ALICE, e.endpoint_id)
    assert again.challenge is not None and again.challenge.event_id != e.challenge.event_id  # type: ignore[union-attr]
    with pytest.raises(errors.FailedPrecondition):  # the old answer does not answer the new challenge
        w.endpoints.verify(ALICE, e.endpoint_id)
    _answer(w, again)
    assert w.endpoints.verify(ALICE, e.endpoint_id).status is EndpointStatus.ACTIVE
    with pytest.raises(errors.FailedPrecondition, match="not awaiting"):
        w.endpoints.resend_challenge(ALICE, e.endpoint_id)


def test_a_new_url_is_challenged_again_and_other_tenants_are_not_challenged(w: World) -> None:
    w.store.tenants["tenant-a"] = Tenant("tenant-a", "a", 0, verify_endpoints=True)
    e = w.endpoints.create(ALICE, spec(), "").endpoint
    _answer(w, e)
    w.endpoints.verify(ALICE, e.endpoint_id)
    moved = w.endpoints.update(ALICE, e.endpoint_id, spec(url="https://hooks.example.com/new"), ["url"])
    assert moved.status is EndpointStatus.PENDING_VERIFICATION and len(w.publisher.events) == 2
    described = w.endpoints.update(ALICE, e.endpoint_id, spec(description="x"), ["description"])
    assert described.challenge == moved.challenge and len(w.publisher.events) == 2  # no new challenge
    other = w.endpoints.create(BOB, spec(), "").endpoint  # tenant-b does not verify
    assert other.status is EndpointStatus.ACTIVE


def test_tenants_verify_endpoints_by_default_in_production_only(w: World) -> None:
    from control_plane.admin import AdminService

    prod = AdminService(w.store, w.clock, counting_random(), verify_endpoints_by_default=True)  # type: ignore[arg-type]
    assert prod.create_tenant("t-prod", "p").verify_endpoints
    assert not prod.create_tenant("t-optout", "p", verify_endpoints=False).verify_endpoints
    assert not w.admin.create_tenant("t-dev", "d").verify_endpoints


# -- ordering keys -------------------------------------------------------------

def test_an_endpoint_can_be_ordered_changed_and_unordered_and_the_job_is_told(w: World) -> None:
    e = create(w, ordering_key="object_id")
    assert e.spec.ordering_key == "object_id" and w.publisher.configs[-1].ordering_key == "object_id"
    u = w.endpoints.update(ALICE, e.endpoint_id, spec(ordering_key="/customer/id"), ["ordering_key"])
    assert (u.spec.ordering_key, u.change) == ("/customer/id", "update ordering_key")
    assert w.publisher.configs[-1].ordering_key == "/customer/id"
    off = w.endpoints.update(ALICE, e.endpoint_id, spec(), ["ordering_key"])  # "" turns it off
    assert off.spec.ordering_key == "" and w.publisher.configs[-1].ordering_key == ""
    assert create(w).spec.ordering_key == ""  # off by default


@pytest.mark.parametrize(("setting", "error"), [
    ("customer.id", "use 'object_id', a JSON Pointer"),  # not a pointer, not a word we know
    ("object-id", "use 'object_id'"),
    ("/customer/~2id", "must be escaped"),  # a malformed pointer
])
def test_a_malformed_ordering_key_is_invalid_argument(w: World, setting: str, error: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=f"ordering key.*{error}"):
        create(w, ordering_key=setting)
    assert not w.store.endpoints
    e = create(w)
    with pytest.raises(errors.InvalidArgument, match=error):
        w.endpoints.update(ALICE, e.endpoint_id, spec(ordering_key=setting), ["ordering_key"])
    assert w.store.endpoints[("tenant-a", e.endpoint_id)].config_version == 1


def test_unordered_creates_keep_their_idempotency_fingerprints(w: World) -> None:
    import hashlib
    import json

    from control_plane.endpoints.service import _fingerprint

    s = spec()
    before = json.dumps([s.url, s.description, list(s.event_types), s.rate_limit_per_s, s.max_in_flight,
                         sorted(s.metadata.items())], separators=(",", ":"))
    assert _fingerprint(s) == hashlib.sha256(before.encode()).hexdigest()  # as stored before ordering
    assert _fingerprint(spec(ordering_key="object_id")) != _fingerprint(s)
    w.endpoints.create(ALICE, spec(ordering_key="object_id"), "req-o")
    with pytest.raises(errors.AlreadyExists):
        w.endpoints.create(ALICE, spec(), "req-o")


def block(w: World, e: Endpoint, key: str, head: str, tenant: str = "tenant-a") -> BlockedKey:
    """A blocked_ordering_keys row as the job writes it."""
    row = BlockedKey(key, bucket_of(key), head, "evt_" + head, 3, 2, 503, "http_5xx", w.clock.now + 1000, 4,
                     w.clock.now - 5000, w.clock.now)
    w.store.blocked[(tenant, e.endpoint_id, key)] = row
    return row


def test_blocked_keys_page_in_storage_order_and_hide_heads_that_are_final(w: World) -> None:
    e = create(w, ordering_key="object_id")
    keys = [f"inv_{n}" for n in range(7)]
    heads = {k: add_delivery(w, e, n, DeliveryStatus.PENDING) for n, k in enumerate(keys)}
    for k in keys:
        block(w, e, k, heads[k])
    done = add_delivery(w, e, 20, DeliveryStatus.SUCCEEDED)
    block(w, e, "inv_done", done)  # its delete was lost in a crash: not shown, goes by TTL
    block(w, e, "inv_unread", "dlv_no_row_yet")  # nothing says it is final: shown
    seen, token, pages = [], "", 0
    while True:
        page = w.ordering.blocked_keys(ALICE, e.endpoint_id, 3, token)
        seen += page.items
        pages += 1
        if not (token := page.next_cursor):
            break
    assert [k.ordering_key for k in seen] == [k.ordering_key for k in sorted(
        (w.store.blocked[("tenant-a", e.endpoint_id, k)] for k in [*keys, "inv_unread"]), key=lambda k: k.position)]
    assert pages == 3 and seen[0].waiting == 4 and seen[0].last_http_status == 503
    assert len(w.ordering.blocked_keys(ALICE, e.endpoint_id, 0, "").items) == 8  # default page: 100
    with pytest.raises(errors.InvalidArgument, match="page_size"):
        w.ordering.blocked_keys(ALICE, e.endpoint_id, 1001, "")


def test_a_blocked_keys_token_is_signed_and_bound_to_its_endpoint(w: World) -> None:
    e, other = create(w, ordering_key="object_id"), create(w, ordering_key="object_id")
    for n in range(3):
        block(w, e, f"k{n}", add_delivery(w, e, n, DeliveryStatus.PENDING))
    token = w.ordering.blocked_keys(ALICE, e.endpoint_id, 1, "").next_cursor
    assert token
    for forged in (_forge(token, bucket=99), _forge(token, key="zzz"), token[:-2], "garbage"):
        with pytest.raises(errors.InvalidArgument, match="page_token is not valid; pass next_page_token"):
            w.ordering.blocked_keys(ALICE, e.endpoint_id, 1, forged)
    with pytest.raises(errors.InvalidArgument, match="different endpoint"):
        w.ordering.blocked_keys(ALICE, other.endpoint_id, 1, token)


def test_an_endpoint_no_longer_ordered_still_lists_what_was_blocked(w: World) -> None:
    e = create(w, ordering_key="object_id")
    block(w, e, "inv_1", add_delivery(w, e, 1, DeliveryStatus.PENDING))
    w.endpoints.update(ALICE, e.endpoint_id, spec(), ["ordering_key"])
    assert [k.ordering_key for k in w.ordering.blocked_keys(ALICE, e.endpoint_id, 0, "").items] == ["inv_1"]
    assert w.ordering.blocked_keys(ALICE, create(w).endpoint_id, 0, "").items == ()
    # Turning ordering off released what was held: a skip would be an audited no-op.
    with pytest.raises(errors.FailedPrecondition, match="not ordered"):
        w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", "", "why", "")
    assert not w.publisher.replays


def test_skip_audits_then_asks_the_job_to_end_that_head(w: World) -> None:
    e = create(w, ordering_key="object_id")
    head = add_delivery(w, e, 1, DeliveryStatus.PENDING)
    block(w, e, "inv_1", head)
    skipped = w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", head, " receiver cannot take v3 ", "")
    assert skipped.delivery_id == head and skipped.request_id.startswith("skp_")
    [req] = w.publisher.replays
    assert (req.delivery_id, req.tenant_id, req.endpoint_id, req.requested_by, req.request_id, req.action) == (
        head, "tenant-a", e.endpoint_id, "key_a", skipped.request_id, SKIP)
    [audit] = w.deliveries.get(ALICE, head).replays
    assert (audit.action, audit.reason, audit.requested_by) == (SKIP, "receiver cannot take v3", "key_a")
    # Without delivery_id: whatever the head is now.
    w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", "", "again", "")
    assert [r.delivery_id for r in w.publisher.replays] == [head, head]
    assert not w.publisher.events  # never a new event


def test_skip_refuses_what_is_not_blocked_or_not_the_head_seen(w: World) -> None:
    e = create(w, ordering_key="object_id")
    head = add_delivery(w, e, 1, DeliveryStatus.PENDING)
    block(w, e, "inv_1", head)
    block(w, e, "inv_done", add_delivery(w, e, 2, DeliveryStatus.FAILED))
    for key in ("inv_9", "inv_done"):
        with pytest.raises(errors.NotFound, match=f"ordering key '{key}' of endpoint {e.endpoint_id} is not blocked"):
            w.ordering.skip_head(ALICE, e.endpoint_id, key, "", "why", "")
    with pytest.raises(errors.FailedPrecondition, match=f"is now delivery {head}, not dlv_old"):
        w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", "dlv_old", "why", "")
    for call, error in [
        (lambda: w.ordering.skip_head(ALICE, e.endpoint_id, "", "", "why", ""), errors.InvalidArgument),
        (lambda: w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", "", "", ""), errors.InvalidArgument),
        (lambda: w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", "", "a\nb", ""), errors.InvalidArgument),
        (lambda: w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", "bad id!", "why", ""), errors.InvalidArgument),
        (lambda: w.ordering.skip_head(ALICE_RO, e.endpoint_id, "inv_1", "", "why", ""), errors.PermissionDenied),
        (lambda: w.ordering.skip_head(ALICE, "ep_unknown", "inv_1", "", "why", ""), errors.NotFound),
    ]:
        with pytest.raises(error):
            call()
    assert not w.publisher.replays and not w.store.replay_audit


def test_a_retried_skip_is_queued_again_and_audited_once(w: World) -> None:
    e = create(w, ordering_key="object_id")
    head = add_delivery(w, e, 1, DeliveryStatus.PENDING)
    block(w, e, "inv_1", head)
    w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", head, "why", "skip-1")
    w.store.deliveries[head] = replace(w.store.deliveries[head], summary=replace(
        w.store.deliveries[head].summary, status=DeliveryStatus.FAILED))  # the job applied it
    again = w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", head, "why", "skip-1")
    assert (again.delivery_id, again.request_id) == (head, "skip-1")
    assert [r.request_id for r in w.publisher.replays] == ["skip-1", "skip-1"]
    assert len(w.deliveries.get(ALICE, head).replays) == 1
    # An id used for a replay of the head: the job would drop the skip as a duplicate.
    other = add_delivery(w, e, 2, DeliveryStatus.PENDING)
    block(w, e, "inv_2", other)
    w.deliveries.replay(ALICE, other, "rq-1")
    with pytest.raises(errors.AlreadyExists, match="used for a replay"):
        w.ordering.skip_head(ALICE, e.endpoint_id, "inv_2", "", "why", "rq-1")


def test_a_skip_kafka_did_not_take_is_unavailable_and_audited(w: World) -> None:
    e = create(w, ordering_key="object_id")
    head = add_delivery(w, e, 1, DeliveryStatus.PENDING)
    block(w, e, "inv_1", head)
    w.publisher.failing = True
    with pytest.raises(errors.Unavailable, match="could not queue the skip"):
        w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", head, "why", "skip-1")
    w.publisher.failing = False
    w.ordering.skip_head(ALICE, e.endpoint_id, "inv_1", head, "why", "skip-1")  # the client retries
    assert [r.request_id for r in w.publisher.replays] == ["skip-1"]
    assert [a.request_id for a in w.deliveries.get(ALICE, head).replays] == ["skip-1"]


def test_another_tenant_can_neither_list_nor_skip(w: World) -> None:
    e = create(w, ordering_key="object_id")
    head = add_delivery(w, e, 1, DeliveryStatus.PENDING)
    block(w, e, "inv_1", head)
    with pytest.raises(errors.NotFound):
        w.ordering.blocked_keys(BOB, e.endpoint_id, 0, "")
    with pytest.raises(errors.NotFound):
        w.ordering.skip_head(BOB, e.endpoint_id, "inv_1", head, "why", "")
    # Bob's own endpoint with Alice's key: rows are read in Bob's partition only.
    mine = create(w, BOB, ordering_key="object_id")
    assert w.ordering.blocked_keys(BOB, mine.endpoint_id, 0, "").items == ()
    with pytest.raises(errors.NotFound, match="not blocked"):
        w.ordering.skip_head(BOB, mine.endpoint_id, "inv_1", "", "why", "")
    assert not w.publisher.replays
    w.endpoints.delete(ALICE, e.endpoint_id)
    with pytest.raises(errors.NotFound):
        w.ordering.blocked_keys(ALICE, e.endpoint_id, 0, "")


def test_versions_show_the_payload_mode_and_ordering_key_each_version_had(w: World) -> None:
    from control_plane.rpc.servicer import version_pb

    e = w.endpoints.create(ALICE, spec(), "").endpoint
    w.endpoints.update(ALICE, e.endpoint_id, spec(payload_mode="fields", payload_fields=("/id",),
                                                  ordering_key="object_id"),
                       ["payload_mode", "payload_fields", "ordering_key"])
    w.endpoints.update(ALICE, e.endpoint_id, spec(), ["ordering_key"])
    v3, v2, v1 = (version_pb(v) for v in w.endpoints.versions(ALICE, e.endpoint_id))
    assert (v1.payload_mode, list(v1.payload_fields), v1.ordering_key) == ("full", [], "")
    assert v1.HasField("ordering_key") and v1.description == "orders"
    assert (v2.payload_mode, list(v2.payload_fields), v2.ordering_key) == ("fields", ["/id"], "object_id")
    assert (v3.payload_mode, v3.ordering_key) == ("fields", "")  # ordering turned off, fields kept


def test_a_version_recorded_before_delivery_settings_were_kept_shows_them_as_unknown() -> None:
    from control_plane.rpc.servicer import version_pb

    old = EndpointVersion(tenant_id="t", endpoint_id="ep", config_version=1,
                          spec=EndpointSpec(url="https://a.example.com:443/", description="", event_types=("*",),
                                            rate_limit_per_s=None, max_in_flight=None),
                          status=EndpointStatus.ACTIVE, key_versions=(1,), changed_at_ms=1, changed_by="k",
                          change="create", delivery_settings_known=False)
    pb_old = version_pb(old)
    assert pb_old.payload_mode == "" and not pb_old.HasField("ordering_key") and not pb_old.payload_fields
