"""The record schemas of core/records.py: delivery identity, JSON round trips, the endpoints topic."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.custom_headers import SealedHeader
from core.records import (
    CLOCK_SCHEMA_V1,
    SKIP,
    ConfigClock,
    EndpointConfig,
    EndpointStatus,
    ReplayRequest,
    SigningKey,
    delivery_id_for,
    parse_endpoint_topic_value,
)

NOW = 1_700_000_000_000

# -- delivery identity ---------------------------------------------------------------------------


def test_delivery_id_is_deterministic_and_shaped() -> None:
    first = delivery_id_for("evt_1", "ep_1")
    assert first == delivery_id_for("evt_1", "ep_1")
    assert first.startswith("dlv_") and len(first) == 4 + 32
    int(first[4:], 16)  # hex


DISTINCT_PAIRS = [
    # two (event_id, endpoint_id) pairs that must name different deliveries
    (("evt_1", "ep_1"), ("evt_2", "ep_1")),  # other event
    (("evt_1", "ep_1"), ("evt_1", "ep_2")),  # other endpoint
    (("evt_1", "ep_1"), ("ep_1", "evt_1")),  # swapped
    (("a:b", "c"), ("a", "b:c")),  # the separator moved from one field to the other
    (("1:a", "b"), ("1", "a:b")),  # ...even when it looks like the length prefix
    (("", "a:b"), ("a", "b")),
    (("a", ""), ("", "a")),
]


@pytest.mark.parametrize(("one", "other"), DISTINCT_PAIRS)
def test_delivery_ids_differ_for_different_pairs(one: tuple[str, str], other: tuple[str, str]) -> None:
    assert delivery_id_for(*one) != delivery_id_for(*other)


@given(st.tuples(st.text(), st.text()), st.tuples(st.text(), st.text()))
def test_delivery_ids_differ_whenever_the_pairs_do(one: tuple[str, str], other: tuple[str, str]) -> None:
    if one != other:
        assert delivery_id_for(*one) != delivery_id_for(*other)


# -- endpoint configs and replays: JSON round trips ----------------------------------------------

CONFIGS = [
    EndpointConfig(
        endpoint_id="ep_1", tenant_id="t_1", config_version=1, url="https://example.com/hook",
        status=EndpointStatus.ACTIVE, event_types=("*",), signing_keys=(), published_at_ms=NOW,
    ),
    EndpointConfig(
        endpoint_id="ep_2", tenant_id="t_1", config_version=7, url="https://example.com/h?x=1",
        status=EndpointStatus.DISABLED, event_types=("invoice.*", "customer.created"),
        signing_keys=(
            SigningKey(version=1, ciphertext_b64="AAAA", not_after_ms=NOW + 1000),
            SigningKey(version=2, ciphertext_b64="BBBB"),
        ),
        published_at_ms=NOW, rate_limit_per_s=2.5, max_in_flight=3,
    ),
    EndpointConfig(
        endpoint_id="ep_3", tenant_id="t_2", config_version=2, url="https://example.com/",
        status=EndpointStatus.DELETED, event_types=(), signing_keys=(), published_at_ms=NOW,
        rate_limit_per_s=10.0,
    ),
    EndpointConfig(
        endpoint_id="ep_4", tenant_id="t_2", config_version=3, url="https://example.com/",
        status=EndpointStatus.ACTIVE, event_types=("a.b",), signing_keys=(), published_at_ms=NOW,
        payload_mode="fields", payload_fields=("/id", "/customer/id"),
    ),
    EndpointConfig(
        endpoint_id="ep_5", tenant_id="t_2", config_version=4, url="https://example.com/",
        status=EndpointStatus.ACTIVE, event_types=("a.b",), signing_keys=(), published_at_ms=NOW,
        ordering_key="/customer/id",
    ),
    EndpointConfig(
        endpoint_id="ep_6", tenant_id="t_2", config_version=5, url="https://example.com/",
        status=EndpointStatus.ACTIVE, event_types=("a.b",), signing_keys=(), published_at_ms=NOW,
        headers=(SealedHeader("X-Tenant", value="acme"), SealedHeader("Authorization", sealed="AQIDBA==")),
    ),
]


def test_custom_headers_travel_only_when_an_endpoint_has_some() -> None:
    """Configs without custom headers are the records they always were; a secret value travels
    sealed only, under "sealed", never as a "value"."""
    assert "headers" not in json.loads(CONFIGS[0].to_json())
    assert json.loads(CONFIGS[5].to_json())["headers"] == [
        {"name": "X-Tenant", "value": "acme"}, {"name": "Authorization", "sealed": "AQIDBA=="}]
    assert parse_endpoint_topic_value(CONFIGS[0].to_json()).headers == ()


def test_the_payload_policy_travels_only_when_it_is_not_full() -> None:
    """Configs of endpoints sent the full payload are the records they always were; one published
    before the policy existed reads as full."""
    assert "payload_mode" not in json.loads(CONFIGS[0].to_json())
    doc = json.loads(CONFIGS[3].to_json())
    assert (doc["payload_mode"], doc["payload_fields"]) == ("fields", ["/id", "/customer/id"])
    assert parse_endpoint_topic_value(CONFIGS[0].to_json()).payload_mode == "full"


def test_the_ordering_key_travels_only_when_an_endpoint_is_ordered() -> None:
    """Unordered configs are the records they always were; one published before ordering existed
    reads as unordered."""
    assert "ordering_key" not in json.loads(CONFIGS[0].to_json())
    assert json.loads(CONFIGS[4].to_json())["ordering_key"] == "/customer/id"
    assert parse_endpoint_topic_value(CONFIGS[0].to_json()).ordering_key == ""


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.endpoint_id)
def test_endpoint_config_round_trips_through_the_topic(config: EndpointConfig) -> None:
    assert parse_endpoint_topic_value(config.to_json()) == config
    assert parse_endpoint_topic_value(config.to_json().decode()) == config


def test_endpoint_config_json_is_documented_shape() -> None:
    doc = json.loads(CONFIGS[1].to_json())
    assert doc["schema"] == "webhooks.endpoint/v1"
    assert doc["status"] == "disabled"
    assert doc["event_types"] == ["invoice.*", "customer.created"]
    assert doc["signing_keys"][0] == {"version": 1, "ciphertext_b64": "AAAA", "not_after_ms": NOW + 1000}


def test_a_config_from_a_newer_control_plane_is_read_not_refused() -> None:
    """Unknown fields are ignored; a status this job does not know reads as not active (nothing
    sent, nothing cancelled), never as a refused record."""
    doc = json.loads(CONFIGS[0].to_json())
    doc.update(status="paused_by_billing", delivery_window="09-17", future={"nested": [1]})
    parsed = parse_endpoint_topic_value(json.dumps(doc))
    assert parsed == replace(CONFIGS[0], status=EndpointStatus.DISABLED)
    assert "refused" not in json.loads(CONFIGS[0].to_json())  # the dispatcher's mark is never published


REPLAYS = [
    ReplayRequest(delivery_id="dlv_1", tenant_id="t_1", endpoint_id="ep_1", requested_by="alice",
                  requested_at_ms=NOW, request_id="req_1"),
    ReplayRequest(delivery_id="dlv_2", tenant_id="t_1", endpoint_id="ep_1", requested_by="bob",
                  requested_at_ms=NOW),
    ReplayRequest(delivery_id="dlv_3", tenant_id="t_1", endpoint_id="ep_1", requested_by="carol",
                  requested_at_ms=NOW, request_id="skp_1", action=SKIP),
]


@pytest.mark.parametrize("replay", REPLAYS, ids=lambda r: r.delivery_id)
def test_replay_request_round_trips(replay: ReplayRequest) -> None:
    assert ReplayRequest.from_json(replay.to_json()) == replay


def test_a_replay_is_the_record_it_always_was_and_a_skip_says_so() -> None:
    """An older job reads replays as before; a skip names its action."""
    assert "action" not in json.loads(REPLAYS[0].to_json())
    assert json.loads(REPLAYS[2].to_json())["action"] == "skip"
    assert ReplayRequest.from_json(REPLAYS[0].to_json()).action == "replay"


REPLAY_REFUSALS = [
    b'{"schema": "webhooks.replay/v1", "delivery_id": "d", "tenant_id": "t", "endpoint_id": "e", '
    b'"requested_by": "u", "requested_at_ms": 1, "action": "purge"}',  # an action this job does not know
    b'{"schema": "webhooks.replay/v2", "delivery_id": "d"}',
    b'{"delivery_id": "d"}',
    b"[]",
    b"null",
]


@pytest.mark.parametrize("raw", REPLAY_REFUSALS)
def test_replay_request_refuses_unknown_records(raw: bytes) -> None:
    with pytest.raises(ValueError):
        ReplayRequest.from_json(raw)


# -- the endpoints topic: configs and clock ticks ------------------------------------------------


def test_config_clock_round_trips() -> None:
    clock = ConfigClock(published_at_ms=NOW, lease_ms=1_000)
    assert json.loads(clock.to_json())["schema"] == CLOCK_SCHEMA_V1
    assert parse_endpoint_topic_value(clock.to_json()) == clock
    assert clock.horizon_ms == NOW + 1_000


def test_a_clock_tick_from_before_leases_reads_as_a_lease_of_0() -> None:
    tick = parse_endpoint_topic_value(b'{"schema": "webhooks.clock/v1", "published_at_ms": 5}')
    assert tick == ConfigClock(published_at_ms=5, lease_ms=0)


ENDPOINT_TOPIC_REFUSALS = [
    # raw value                                                  why it is refused
    (b'{"schema": "webhooks.endpoint/v2", "endpoint_id": "e"}', "future endpoint schema"),
    (b'{"schema": "webhooks.clock/v2", "published_at_ms": 1}', "future clock schema"),
    (b'{"schema": "webhooks.clock/v1", "published_at_ms": 1, "lease_ms": -1}', "negative lease"),
    (b'{"published_at_ms": 1}', "no schema at all"),
    (b'{"schema": 1}', "schema is not a string"),
    (b"[]", "not an object"),
    (b"null", "not an object"),
    (b'"webhooks.clock/v1"', "not an object"),
    (b"{", "not JSON"),
]


@pytest.mark.parametrize(("raw", "why"), ENDPOINT_TOPIC_REFUSALS)
def test_endpoints_topic_refuses_unknown_records(raw: bytes, why: str) -> None:
    # ValueError is what the endpoint-config operator skips; anything else would fail the job.
    with pytest.raises(ValueError):
        parse_endpoint_topic_value(raw)


# -- reconciliation's redrive -----------------------------------------------------------------------


def test_a_redrive_round_trips_with_its_event_bytes_exactly() -> None:
    from core.ingest import parse_redrive
    from core.records import REDRIVE_SCHEMA_V1, EventRecord, RedriveRequest, record_schema

    event = EventRecord(event_id="evt_1", tenant_id="t_1", event_type="invoice.paid", schema_version="2",
                        object_id="in_1", object_version=3, occurred_at_ms=NOW, payload=b'{"a":1}\xff')
    r = RedriveRequest(delivery_id=delivery_id_for("evt_1", "ep_1"), tenant_id="t_1", endpoint_id="ep_1",
                       endpoint_config_version=4, created_at_ms=NOW, expires_at_ms=NOW + 86_400_000, event=event,
                       reason="reconcile: no deliveries row", requested_by="admin")
    raw = r.to_json()
    assert record_schema(raw) == REDRIVE_SCHEMA_V1
    assert parse_redrive(raw) == r
    assert record_schema(ReplayRequest("d", "t", "e", "u", NOW).to_json()) != REDRIVE_SCHEMA_V1


@pytest.mark.parametrize("raw", [b"[]", b"{}", b'{"schema":"webhooks.redrive/v1"}',
                                 b'{"schema":"webhooks.redrive/v1","delivery_id":"d","tenant_id":"t",'
                                 b'"endpoint_id":"e","endpoint_config_version":1,"created_at_ms":1,'
                                 b'"expires_at_ms":2,"reason":"r","requested_by":"a","event":{"x":1}}'])
def test_an_unreadable_redrive_is_a_value_or_key_error(raw: bytes) -> None:
    from core.ingest import parse_redrive

    with pytest.raises((ValueError, KeyError)):
        parse_redrive(raw)
