"""The leased config clock end to end on fakes: two control-plane replicas' acknowledgements and
ticks (control_plane.publishing.configs) against fan-out's rule (core.fanout.ClockFollower).

A simulation, in the spirit of a deterministic one: two replicas on one store and one topic, one
fake clock, random steps (ticks, creates, updates, republisher passes, Kafka refusing and
coming back). While a request waits out its lease, the clock advances in random steps and the
replicas' clock loops and republishers run in between, as their threads would. The guarantee,
checked for every acknowledged change: a fan-out that has read any prefix of the topic releases
an event committed at the acknowledgement (or later) only if that prefix holds the change's
config. (The topic only grows, so checking every prefix once at the end is checking after every
step. One clock for all: skew is what ``config_clock_skew_ms`` is for.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from control_plane import errors
from control_plane.endpoints.service import Deps, EndpointService
from control_plane.publishing.configs import ConfigPublication
from control_plane.publishing.publisher import PublishError
from control_plane.validation import DestinationValidator
from core.egress import EgressPolicy
from core.fanout import RELEASE, ClockFollower
from core.records import ConfigClock, EndpointConfig
from core.secrets import Keyring
from tests.unit.control_plane.endpoints.test_control_plane_service import (
    ALICE,
    MASTER_KEY,
    Clock,
    MemoryStore,
    RecordingPublisher,
    counting_random,
    fake_resolver,
    spec,
)

LEASE_MS = 1_000
SCAN_MS = 1_000  # hold_scan_interval_ms


@dataclass
class Topic(RecordingPublisher):
    """The single-partition endpoints topic: configs and ticks in the order Kafka took them."""

    records: list[EndpointConfig | ConfigClock] = field(default_factory=list)

    def publish_config(self, config: EndpointConfig) -> None:
        super().publish_config(config)
        self.records.append(config)

    def publish_clock(self, clock: ConfigClock) -> None:
        super().publish_clock(clock)
        self.records.append(clock)


@dataclass(frozen=True)
class Ack:
    at_ms: int
    endpoint_id: str
    version: int


class Sim:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.clock = Clock()
        self.store = MemoryStore()
        self.topic = Topic()
        self.acks: list[Ack] = []
        self.publications = [self._publication() for _ in range(2)]
        random_bytes = counting_random()
        self.services = [EndpointService(Deps(
            store=self.store, publication=p, publisher=self.topic,
            destination=DestinationValidator(EgressPolicy(), fake_resolver),
            master_key=Keyring.single(MASTER_KEY), now_ms=self.clock, random_bytes=random_bytes,  # type: ignore[arg-type]
            default_overlap_s=0, history=self.store, challenge_ttl_s=600)) for p in self.publications]
        for p in self.publications:
            p.republish_pending()

    def _publication(self) -> ConfigPublication:
        return ConfigPublication(self.store, self.topic, self.clock, lease_ms=LEASE_MS,
                                 sleep_ms=self._sleep, hold_scan_interval_ms=SCAN_MS)

    def _sleep(self, ms: int) -> None:
        """A request waits; the other threads run meanwhile."""
        left = ms
        while left > 0:
            step = min(left, self.rng.randint(1, 300))
            self.clock.now += step
            left -= step
            self._background()

    def _background(self) -> None:
        p = self.rng.choice(self.publications)
        try:
            if self.rng.random() < 0.8:
                p.publish_clock()
            else:
                p.republish_pending()
        except PublishError:
            pass

    def step(self) -> None:
        self.clock.now += self.rng.randint(0, 400)
        roll = self.rng.random()
        if roll < 0.05:
            self.topic.failing = not self.topic.failing
        elif roll < 0.5:
            self._background()
        else:
            service = self.rng.choice(self.services)
            mine = [e for (t, _), e in self.store.endpoints.items() if t == ALICE.tenant_id]
            if not mine or roll < 0.7:
                e = service.create(ALICE, spec(), "").endpoint
            else:
                e = service.update(ALICE, self.rng.choice(mine).endpoint_id,
                                   spec(description=f"at {self.clock.now}"), ["description"])
            self.acks.append(Ack(self.clock.now, e.endpoint_id, e.config_version))

    def check(self) -> None:
        """Every prefix of the topic a fan-out may have read, against every acknowledgement."""
        follower = ClockFollower(interval_hint_ms=250, skew_ms=0, stale_after_ms=10**9, started_at_ms=0)
        read: dict[str, int] = {}
        for record in self.topic.records:
            if isinstance(record, EndpointConfig):
                read[record.endpoint_id] = max(read.get(record.endpoint_id, 0), record.config_version)
                continue
            follower.observe(record.published_at_ms, record.lease_ms, self.clock.now)
            for ack in self.acks:
                if follower.decide(ack.at_ms, self.clock.now).verdict == RELEASE:
                    assert read.get(ack.endpoint_id, 0) >= ack.version, (
                        f"an event committed at the acknowledgement of {ack} is released on tick "
                        f"{record} before the config is read")


@pytest.mark.parametrize("seed", range(100))
def test_no_event_committed_after_an_acknowledgement_is_released_before_its_config(seed: int) -> None:
    sim = Sim(seed)
    for _ in range(80):
        sim.step()
    sim.check()
    # The run exercised what it claims: acknowledgements, ticks that cover events, failures.
    assert sim.acks and any(isinstance(r, ConfigClock) for r in sim.topic.records)


def test_while_ticks_flow_a_change_is_acknowledged_one_lease_after_kafka_took_it() -> None:
    sim = Sim(0)
    waits: list[int] = []
    sim.publications[0]._sleep_ms = waits.append  # type: ignore[method-assign]
    sim.services[0].create(ALICE, spec(), "")
    assert waits == [LEASE_MS]
    sim.topic.failing = True
    sim.services[0].create(ALICE, spec(), "")
    # Other replicas may tick past a change they have not read the durable hold of yet.
    assert waits == [LEASE_MS, LEASE_MS + SCAN_MS]


LEASE_SETTINGS = [
    # lease   interval  skew  -> valid
    (1_000, 250, 100, True),  # the defaults
    (1_000, 899, 100, True),
    (1_000, 900, 100, False),  # the next tick would be due when the last one's horizon is
    (1_000, 1_000, 0, False),
    (100, 20, 0, True),
]


@pytest.mark.parametrize(("lease_ms", "interval_ms", "skew_ms", "valid"), LEASE_SETTINGS)
def test_settings_refuse_ticks_that_do_not_fit_in_the_lease(lease_ms: int, interval_ms: int, skew_ms: int,
                                                            valid: bool) -> None:
    from pydantic import ValidationError

    from core.settings import ControlPlaneSettings

    def make() -> ControlPlaneSettings:
        return ControlPlaneSettings(config_lease_ms=lease_ms, config_clock_interval_ms=interval_ms,
                                    config_clock_skew_ms=skew_ms)

    if valid:
        assert make().config_lease_ms == lease_ms
    else:
        with pytest.raises(ValidationError, match="config_lease_ms"):
            make()


REPUBLISH_MS = 2_000  # republish_interval_s, short
TICK_MS = 250  # config_clock_interval_ms


def test_a_change_whose_cassandra_write_failed_before_its_publish_is_passed_by_other_replicas_for_a_bounded_time(
) -> None:
    """No durable hold: the audit row (Cassandra) fails before the publish, so the change holds
    only its own replica's clock. Another replica ticks past it until its next republisher pass
    finds the row behind. The bound (control_plane.publishing.configs): its ticks before the config carry
    T < write + republish interval (+ two passes' durations, 0 here), so an event committed more
    than republish interval - hold_scan_interval_ms after the acknowledgement is matched against
    the change -- and one committed between the acknowledgement and then may not be."""
    clock, store, topic = Clock(), MemoryStore(), Topic()
    mine, other = (ConfigPublication(store, topic, clock, lease_ms=LEASE_MS, hold_scan_interval_ms=SCAN_MS)
                   for _ in range(2))
    next_pass = clock.now

    def run_other(until_ms: int) -> None:
        """The other replica's loops, while this one's request waits out its lease."""
        nonlocal next_pass
        while clock.now < until_ms:
            clock.now = min(clock.now + TICK_MS, until_ms)
            if clock.now >= next_pass:
                other.republish_pending()
                next_pass = clock.now + REPUBLISH_MS
            other.publish_clock()

    mine._sleep_ms = lambda ms: run_other(clock.now + ms)  # type: ignore[method-assign]
    service = EndpointService(Deps(
        store=store, publication=mine, publisher=topic, destination=DestinationValidator(EgressPolicy(), fake_resolver),
        master_key=Keyring.single(MASTER_KEY), now_ms=clock, random_bytes=counting_random(),  # type: ignore[arg-type]
        default_overlap_s=0, history=store, challenge_ttl_s=600))
    mine.republish_pending()
    endpoint = service.create(ALICE, spec(), "").endpoint
    run_other(next_pass)  # the worst case: the change lands just after the other replica's pass

    audit = store.put_version

    def fails_once(version: object) -> None:
        store.put_version = audit  # type: ignore[method-assign]
        raise errors.Unavailable("storage unavailable")

    store.put_version = fails_once  # type: ignore[method-assign]
    written_ms = clock.now
    updated = service.update(ALICE, endpoint.endpoint_id, spec(description="v2"), ["description"])
    acked_ms = clock.now
    assert (updated.config_version, updated.published_version) == (2, 1) and store.clock_holds == {}
    assert acked_ms == written_ms + LEASE_MS + SCAN_MS
    run_other(acked_ms + 2 * REPUBLISH_MS)

    at = next(i for i, r in enumerate(topic.records)
              if isinstance(r, EndpointConfig) and r.config_version == updated.config_version)
    passed = max(r.published_at_ms for r in topic.records[:at] if isinstance(r, ConfigClock))
    assert passed < written_ms + REPUBLISH_MS  # the bound on the other replica's ticks
    # What fan-out makes of it: events committed up to `passed + lease` are released by a tick
    # that precedes the config. That reaches past the acknowledgement, by at most
    # republish interval - hold_scan_interval_ms.
    window_ms = passed + LEASE_MS - acked_ms
    assert 0 < window_ms <= REPUBLISH_MS - SCAN_MS
    follower = ClockFollower(interval_hint_ms=TICK_MS, skew_ms=0, stale_after_ms=10**9, started_at_ms=0)
    for r in topic.records[:at]:
        if isinstance(r, ConfigClock):
            follower.observe(r.published_at_ms, r.lease_ms, clock.now)
    assert follower.decide(acked_ms, clock.now).verdict == RELEASE
    assert follower.decide(acked_ms + REPUBLISH_MS - SCAN_MS, clock.now).verdict != RELEASE
