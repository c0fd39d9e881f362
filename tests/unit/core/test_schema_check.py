"""core/schema_check.py: fan-out's decision per event given the tenant's catalog, rule by rule;
and the catalog's records on the endpoints topic (core/records.py)."""

from __future__ import annotations

import json
import pickle

import pytest

from core.event_schemas import ValidatorCache
from core.records import (
    CatalogSettingsRecord,
    CatalogTypeRecord,
    EventRecord,
    SchemaPinsRecord,
    parse_endpoint_topic_value,
)
from core.schema_check import (
    SEND,
    CatalogIndex,
    Refuse,
    Send,
    TenantCatalog,
    accepts_major,
    check_event,
    skip_reason,
    supersedes,
)

SCHEMA = {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}


def event(event_type: str = "invoice.paid", version: str = "1", payload: object = None) -> EventRecord:
    body = json.dumps({"amount": 1} if payload is None else payload).encode()
    return EventRecord("evt_1", "acme", event_type, version, "", 0, 0, body)


def catalog(enforcement: str = "reject", unknown: str | None = "reject") -> TenantCatalog:
    kind = CatalogTypeRecord("acme", "invoice.paid", enforcement, 1, {"1.0": SCHEMA, "2.0": SCHEMA}, 0)
    settings = CatalogSettingsRecord("acme", unknown, 0) if unknown else None
    return TenantCatalog({"invoice.paid": kind}, settings)


@pytest.mark.parametrize(("case", "ev", "cat", "expected"), [
    ("valid", event(), catalog(), SEND),
    ("valid, version without minor", event(version="2"), catalog(), SEND),
    ("tenant without a catalog: unchecked", event(payload={}), None, SEND),
    ("platform event: unchecked", event("webhook.ping", "2026-01-01", {}), catalog(), SEND),
    ("operational event: the platform's catalog, not the tenant's", event("webhooks.endpoint.failing", "1.0", {}),
     catalog(), SEND),
    ("invalid, reject", event(payload={"amount": "1"}), catalog(),
     Refuse("schema_invalid", "payload does not match invoice.paid 1.0 at /amount: '1' is not of type 'integer'",
            "/amount", "1.0")),
    ("invalid at the root, reject", event(payload={}), catalog(),
     Refuse("schema_invalid", "payload does not match invoice.paid 1.0 at /: 'amount' is a required property",
            "", "1.0")),
    ("invalid, warn", event(payload={"amount": "1"}), catalog("warn"), Send("schema_invalid")),
    ("unknown type, reject", event("invoice.sent"), catalog(),
     Refuse("schema_unknown", "event type 'invoice.sent' is not in the event-type catalog of tenant acme", "", "1")),
    ("unknown version, reject", event(version="3"), catalog(),
     Refuse("schema_unknown", "schema version '3' of invoice.paid is not in the event-type catalog of tenant acme",
            "", "3")),
    ("version that does not parse, reject", event(version="2026-01-01"), catalog(),
     Refuse("schema_unknown", "schema version '2026-01-01' of invoice.paid is not in the event-type catalog of "
            "tenant acme", "", "2026-01-01")),
    ("unknown type, warn", event("invoice.sent"), catalog(unknown="warn"), Send("schema_unknown")),
    ("unknown type before the settings arrived: warn", event("invoice.sent"), catalog(unknown=None),
     Send("schema_unknown")),
])
def test_fan_out_decision(case: str, ev: EventRecord, cat: TenantCatalog | None, expected: object) -> None:
    assert check_event(ev, cat, ValidatorCache()) == expected


def test_validators_are_compiled_once_per_tenant_type_and_version() -> None:
    cache = ValidatorCache()
    for _ in range(3):
        check_event(event(), catalog(), cache)
        check_event(event(version="2.0"), catalog(), cache)
    assert len(cache) == 2


@pytest.mark.parametrize(("pins", "event_type", "version", "sent"), [
    ((), "invoice.paid", "1", True),
    ((2,), "invoice.paid", "2.3", True),
    ((2,), "invoice.paid", "1.0", False),
    ((1, 2), "invoice.paid", "1", True),
    ((2,), "invoice.paid", "2026-01-01", False),
    ((2,), "webhook.ping", "2026-01-01", True),
])
def test_schema_pins(pins: tuple[int, ...], event_type: str, version: str, sent: bool) -> None:
    assert accepts_major(pins, event(event_type, version)) is sent


@pytest.mark.parametrize(("pins", "event_type", "version", "reason"), [
    ((), "invoice.paid", "1", ""),
    ((2,), "invoice.paid", "2.3", ""),
    ((2,), "invoice.paid", "1.0", "schema major 1 not accepted (pinned: 2)"),
    ((3, 2), "invoice.paid", "1", "schema major 1 not accepted (pinned: 2, 3)"),
    ((2,), "invoice.paid", "2026-01-01", "schema version '2026-01-01' has no major (pinned: 2)"),
    ((2,), "webhook.ping", "1", ""),
])
def test_a_skipped_pin_says_why(pins: tuple[int, ...], event_type: str, version: str, reason: str) -> None:
    assert skip_reason(pins, event(event_type, version)) == reason


@pytest.mark.parametrize("record", [
    CatalogTypeRecord("acme", "invoice.paid", "warn", 3, {"1.0": SCHEMA}, 1767225600000),
    CatalogSettingsRecord("acme", "reject", 1767225600000),
    SchemaPinsRecord("acme", "ep_1", (1, 2), 1767225600000),
])
def test_catalog_records_round_trip_on_the_endpoints_topic(record: object) -> None:
    assert parse_endpoint_topic_value(record.to_json()) == record  # type: ignore[attr-defined]


def test_record_keys_cannot_collide_with_endpoint_ids() -> None:
    # Endpoint ids are [A-Za-z0-9_-]: a key with '/' is never one.
    assert CatalogTypeRecord("acme", "a.b", "reject", 1, {}, 0).key == "__catalog__/acme/a.b"
    assert CatalogSettingsRecord("acme", "warn", 0).key == "__catalog__/acme"
    assert SchemaPinsRecord("acme", "ep_1", (), 0).key == "__schema_pins__/ep_1"


def test_a_catalog_record_with_versions_that_are_not_schemas_is_refused() -> None:
    bad = json.dumps({"schema": "webhooks.catalog-type/v1", "tenant_id": "a", "event_type": "x", "enforcement": "warn",
                      "revision": 1, "versions": {"1.0": 3}, "published_at_ms": 0})
    with pytest.raises(ValueError):
        parse_endpoint_topic_value(bad)


def test_the_index_keeps_the_latest_record_per_tenant_type_and_endpoint() -> None:
    index = CatalogIndex()
    assert index.tenant("acme") is None and index.pins("ep_1") == ()
    index.add(CatalogTypeRecord("acme", "invoice.paid", "reject", 1, {"1.0": SCHEMA}, 0))
    index.add(CatalogTypeRecord("acme", "invoice.paid", "warn", 2, {"1.0": SCHEMA, "2.0": SCHEMA}, 0))
    index.add(CatalogSettingsRecord("acme", "warn", 0))
    index.add(SchemaPinsRecord("acme", "ep_1", (2,), 0))
    acme = index.tenant("acme")
    assert acme is not None and acme.types["invoice.paid"].enforcement == "warn" and acme.unknown_types == "warn"
    assert index.tenant("other") is None and index.pins("ep_1") == (2,)
    assert check_event(event("invoice.sent"), acme, ValidatorCache()) == Send("schema_unknown")


def pins(majors: tuple[int, ...], revision: int) -> SchemaPinsRecord:
    return SchemaPinsRecord("acme", "ep_1", majors, 0, revision)


def kind(revision: int, *versions: str) -> CatalogTypeRecord:
    return CatalogTypeRecord("acme", "invoice.paid", "reject", revision, {v: SCHEMA for v in versions}, 0)


# Records of one key can reach the job in any order of revisions (two control-plane replicas, a
# retried call racing a change, the republisher): what the index holds after each sequence.
@pytest.mark.parametrize(("case", "records", "held"), [
    ("types in order", [kind(1, "1.0"), kind(2, "1.0", "1.1"), kind(3, "1.0", "1.1", "2.0")], 3),
    ("a stale type after newer ones", [kind(1, "1.0"), kind(2, "1.0", "1.1"), kind(3, "1.0", "1.1", "2.0"),
                                       kind(2, "1.0", "1.1")], 3),
    ("the oldest type last", [kind(3, "1.0", "1.1", "2.0"), kind(1, "1.0")], 3),
    ("the same revision again", [kind(2, "1.0", "1.1"), kind(2, "1.0", "1.1")], 2),
])
def test_the_index_never_replaces_a_type_with_a_lower_revision(case: str, records: list[CatalogTypeRecord],
                                                               held: int) -> None:
    index = CatalogIndex()
    for record in records:
        index.add(record)
    acme = index.tenant("acme")
    assert acme is not None and acme.types["invoice.paid"] == next(r for r in records if r.revision == held)


@pytest.mark.parametrize(("case", "records", "held"), [
    ("pins in order", [pins((1,), 10), pins((2,), 20), pins((), 30)], ()),
    ("stale pins after newer ones", [pins((1,), 10), pins((2,), 20), pins((1,), 10)], (2,)),
    ("the same revision again", [pins((2,), 20), pins((2,), 20)], (2,)),
])
def test_the_index_never_replaces_pins_with_a_lower_revision(case: str, records: list[SchemaPinsRecord],
                                                             held: tuple[int, ...]) -> None:
    index = CatalogIndex()
    for record in records:
        index.add(record)
    assert index.pins("ep_1") == held


def test_the_index_never_replaces_settings_with_a_lower_revision() -> None:
    index = CatalogIndex()
    for record in (CatalogSettingsRecord("acme", "reject", 0, 5), CatalogSettingsRecord("acme", "warn", 0, 9),
                   CatalogSettingsRecord("acme", "reject", 0, 5)):
        index.add(record)
    acme = index.tenant("acme")
    assert acme is not None and acme.unknown_types == "warn"


@pytest.mark.parametrize(("current", "incoming", "kept"), [
    (None, kind(1), True),
    (kind(1), kind(2), True),
    (kind(2), kind(2), True),  # idempotent: the same record again
    (kind(3), kind(2), False),
    (pins((1,), 10), pins((2,), 9), False),
    (CatalogSettingsRecord("acme", "warn", 0, 9), CatalogSettingsRecord("acme", "reject", 0, 5), False),
    # Written before records carried a revision (0): any revision replaces it.
    (SchemaPinsRecord("acme", "ep_1", (1,), 0), pins((2,), 10), True),
])
def test_supersedes(current: object, incoming: object, kept: bool) -> None:
    assert supersedes(current, incoming) is kept  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", [
    {"schema": "webhooks.schema-pins/v1", "tenant_id": "acme", "endpoint_id": "ep_1", "schema_majors": [2],
     "published_at_ms": 0},
    {"schema": "webhooks.catalog-settings/v1", "tenant_id": "acme", "unknown_types": "warn", "published_at_ms": 0},
])
def test_records_published_before_revisions_read_as_revision_0(raw: dict[str, object]) -> None:
    assert parse_endpoint_topic_value(json.dumps(raw)).revision == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("record", [SchemaPinsRecord("acme", "ep_1", (2,), 0, 7),
                                    CatalogSettingsRecord("acme", "warn", 0, 7)])
def test_a_record_kept_in_state_before_revisions_loads_as_revision_0(record: object) -> None:
    # The broadcast state holds pickled records: a value pickled before the field existed has no
    # "revision" in its __dict__, and must still load (savepoint compatibility).
    del record.__dict__["revision"]
    old = pickle.loads(pickle.dumps(record))
    assert old.revision == 0
    assert supersedes(old, record.__class__(**{**old.__dict__, "revision": 1}))  # type: ignore[arg-type]


# The catalog check judges only strict JSON (core/strict_json.py): a value json.loads would make
# of these passes "minimum": 0 or is not the document a receiver reads.
AMOUNT = {"type": "object", "properties": {"amount": {"type": "number", "minimum": 0}}, "required": ["amount"]}
NOT_STRICT = [
    # id                      payload bytes
    ("NaN", b'{"amount":NaN}'),
    ("Infinity", b'{"amount":Infinity}'),
    ("-Infinity inside", b'{"amount":1,"x":-Infinity}'),
    ("past a double", b'{"amount":1e400}'),
    ("UTF-16", '{"amount":5}'.encode("utf-16")),
    ("UTF-32", '{"amount":5}'.encode("utf-32")),
    ("byte order mark", b'\xef\xbb\xbf{"amount":5}'),
    ("lone surrogate value", b'{"amount":5,"note":"\\ud800"}'),
    ("lone surrogate key", b'{"amount":5,"\\udfff":1}'),
    ("duplicate key", b'{"amount":-5,"amount":5}'),
    ("trailing data", b'{"amount":5} {}'),
]


@pytest.mark.parametrize("payload", [p for _, p in NOT_STRICT], ids=[i for i, _ in NOT_STRICT])
def test_a_payload_that_is_not_strict_json_is_schema_invalid(payload: bytes) -> None:
    kind = CatalogTypeRecord("acme", "invoice.paid", "reject", 1, {"1.0": AMOUNT}, 0)
    ev = EventRecord("evt_1", "acme", "invoice.paid", "1", "", 0, 0, payload)
    decision = check_event(ev, TenantCatalog({"invoice.paid": kind}), ValidatorCache())
    assert isinstance(decision, Refuse) and decision.reason == "schema_invalid", decision
    assert "not strict JSON" in decision.detail


@pytest.mark.parametrize("payload", [b'{"amount":5}', b'{"amount":0.5e2,"note":"\\ud83d\\ude00 \\u00e9"}',
                                     b' {"amount":1e308}\r\n'])
def test_strict_json_that_matches_is_sent(payload: bytes) -> None:
    kind = CatalogTypeRecord("acme", "invoice.paid", "reject", 1, {"1.0": AMOUNT}, 0)
    ev = EventRecord("evt_1", "acme", "invoice.paid", "1", "", 0, 0, payload)
    assert check_event(ev, TenantCatalog({"invoice.paid": kind}), ValidatorCache()) == SEND
