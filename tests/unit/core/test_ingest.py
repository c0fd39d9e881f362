"""core/ingest.py: the plain form, the Debezium outbox envelope, and every refusal reason."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest

from core.ingest import IngestError, parse_event
from core.records import EventRecord

LIMIT = 1024
OCCURRED_ISO = "2026-11-29T19:00:00Z"
OCCURRED_MS = 1_795_978_800_000

PLAIN: dict[str, Any] = {
    "schema": "webhooks.event/v1",
    "event_id": "evt_1",
    "tenant_id": "t_1",
    "event_type": "invoice.paid",
    "schema_version": "2026-01-01",
    "object_id": "inv_9",
    "object_version": 3,
    "occurred_at": OCCURRED_ISO,
    "payload": '{"id":"inv_9"}',
}

EXPECTED = EventRecord(
    event_id="evt_1",
    tenant_id="t_1",
    event_type="invoice.paid",
    schema_version="2026-01-01",
    object_id="inv_9",
    object_version=3,
    occurred_at_ms=OCCURRED_MS,
    payload=b'{"id":"inv_9"}',
)


def plain(**changes: Any) -> dict[str, Any]:
    """The plain record with fields changed; a value of ``...`` removes the field."""
    doc = {**PLAIN, **changes}
    return {k: v for k, v in doc.items() if v is not ...}


def outbox_row(**changes: Any) -> dict[str, Any]:
    row = {k: v for k, v in plain(**changes).items() if k != "schema"}
    return row


def debezium(op: str = "c", wrapped: bool = True, **changes: Any) -> dict[str, Any]:
    envelope = {
        "op": op,
        "before": None,
        "after": outbox_row(**changes),
        "source": {"connector": "postgresql", "table": "outbox"},
        "ts_ms": OCCURRED_MS + 5,
    }
    if op == "d":
        envelope["before"], envelope["after"] = envelope["after"], None
    if wrapped:
        return {"schema": {"type": "struct", "name": "outbox.Envelope"}, "payload": envelope}
    return envelope


def encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def parse(doc: dict[str, Any], limit: int = LIMIT) -> EventRecord:
    return parse_event(encode(doc), limit)


# -- accepted records ----------------------------------------------------------------------------


def test_plain_v1() -> None:
    assert parse(PLAIN) == EXPECTED


def test_optional_fields_default() -> None:
    record = parse(plain(object_id=..., object_version=..., target_endpoint_id="ep_7"))
    assert (record.object_id, record.object_version, record.target_endpoint_id) == ("", 0, "ep_7")


PAYLOAD_STRINGS = [
    # payload as the producer wrote it   -> the exact bytes every attempt sends
    ('{"id":"inv_9"}', b'{"id":"inv_9"}'),
    ('{ "id" :\t"inv_9" }\r\n', b'{ "id" :\t"inv_9" }\r\n'),  # odd whitespace survives
    ('{"b":1,"a":2}', b'{"b":1,"a":2}'),  # key order survives
    ('{"n":1.0e0}', b'{"n":1.0e0}'),  # number spelling survives
    ('{"name":"Zoë ✓"}', '{"name":"Zoë ✓"}'.encode()),  # non-ASCII as UTF-8
    ('"just a string"', b'"just a string"'),  # any JSON value, as RFC 8259 allows
]


@pytest.mark.parametrize(("payload", "body"), PAYLOAD_STRINGS)
def test_payload_string_bytes_are_preserved(payload: str, body: bytes) -> None:
    assert parse(plain(payload=payload)).payload == body


PAYLOAD_BYTES = [
    b'{"id":"inv_9"}',
    b'  {"a" : 1}\n\n',
    '{"n":"caf\u00e9 ☕"}'.encode(),
    b'{"emoji":"\\ud83d\\ude00"}',  # an escaped surrogate pair is one character: fine
]


@pytest.mark.parametrize("body", PAYLOAD_BYTES)
def test_payload_base64_bytes_are_preserved(body: bytes) -> None:
    doc = plain(payload=..., payload_base64=base64.b64encode(body).decode())
    assert parse(doc).payload == body


def test_event_record_json_parses_back() -> None:
    record = EventRecord(**{**EXPECTED.__dict__, "payload": b'{"n":"\xc3\xa9"}', "target_endpoint_id": "ep_1"})
    assert parse_event(record.to_json(), LIMIT) == record


@pytest.mark.parametrize("wrapped", [True, False], ids=["with schema wrapper", "bare envelope"])
@pytest.mark.parametrize("op", ["c", "r"])
def test_debezium_inserts_and_snapshot_reads_are_events(op: str, wrapped: bool) -> None:
    assert parse(debezium(op, wrapped)) == EXPECTED


def outbox_v2(body: bytes, **changes: Any) -> dict[str, Any]:
    """A row of the platform's outbox table as Debezium streams it: bytea payload in base64, the
    timestamptz column as ISO text with microseconds, the extra created_at column."""
    return debezium("c", wrapped=False, envelope_version=2, payload=base64.b64encode(body).decode(),
                    occurred_at="2026-11-29T19:00:00.000000Z", created_at="2026-11-29T19:00:00.100000Z",
                    **changes)


def test_outbox_table_row_v2_payload_is_the_exact_bytea_bytes() -> None:
    body = '{"id": "inv_9",  "name": "caf\u00e9 ☕"}'.encode()  # odd spacing kept byte for byte
    assert parse(outbox_v2(body)) == EventRecord(**{**EXPECTED.__dict__, "payload": body})


@pytest.mark.parametrize("wrapped", [True, False], ids=["with schema wrapper", "bare envelope"])
def test_debezium_epoch_millis_timestamp_and_envelope_version(wrapped: bool) -> None:
    doc = debezium("c", wrapped, occurred_at=OCCURRED_MS, envelope_version=1)
    assert parse(doc) == EXPECTED


OCCURRED_AT = [
    # value                               -> unix ms
    ("2026-11-29T19:00:00Z", OCCURRED_MS),
    ("2026-11-29T19:00:00.123Z", OCCURRED_MS + 123),
    ("2026-11-29T20:00:00+01:00", OCCURRED_MS),
    ("2026-11-29T19:00:00.999+00:00", OCCURRED_MS + 999),
    (OCCURRED_MS, OCCURRED_MS),
    (0, 0),
]


@pytest.mark.parametrize(("value", "expected_ms"), OCCURRED_AT)
def test_occurred_at_forms(value: str | int, expected_ms: int) -> None:
    assert parse(plain(occurred_at=value)).occurred_at_ms == expected_ms


# -- refusals: every reason ----------------------------------------------------------------------

TOO_LARGE = "x" * (LIMIT + 1)

REFUSALS: list[tuple[str, bytes, str]] = [
    # id                              raw record                                          reason
    ("garbage bytes", b"\x80\x81\xfe{}", "not_utf8"),
    ("latin-1 text", '{"event_id": "café"}'.encode("latin-1"), "not_utf8"),
    ("utf-16 json", json.dumps(PLAIN).encode("utf-16"), "not_utf8"),
    ("truncated", encode(PLAIN)[:-10], "malformed_json"),
    ("empty", b"", "malformed_json"),
    ("array", b"[1, 2]", "malformed_json"),
    ("string", b'"evt_1"', "malformed_json"),
    ("future schema", encode(plain(schema="webhooks.event/v2")), "unknown_schema"),
    ("no schema", encode(plain(schema=...)), "unknown_schema"),
    ("unrelated object", b'{"hello": "world"}', "unknown_schema"),
    ("envelope_version 3", encode(debezium(envelope_version=3)), "unknown_schema"),
    ("v2 payload not JSON", encode(outbox_v2(b"{not json")), "payload_not_json"),
    ("v2 payload latin-1", encode(outbox_v2('{"n": "café"}'.encode("latin-1"))), "payload_not_json"),
    ("v2 payload two documents", encode(outbox_v2(b'{} {}')), "payload_not_json"),
    ("v2 payload not base64", encode(debezium(envelope_version=2, payload="%%%")), "wrong_type"),
    ("v2 payload null", encode(debezium(envelope_version=2, payload=None)), "missing_field"),
    ("v2 payload over the limit", encode(outbox_v2(b'"' + b"x" * LIMIT + b'"')), "payload_too_large"),
    ("v2 empty tenant_id", encode(outbox_v2(b"{}", tenant_id="")), "wrong_type"),
    ("envelope_version text", encode(debezium(wrapped=False, envelope_version="1")), "unknown_schema"),
    ("debezium update", encode(debezium("u")), "not_an_insert"),
    ("debezium delete", encode(debezium("d")), "not_an_insert"),
    ("bare debezium update", encode(debezium("u", wrapped=False)), "not_an_insert"),
    ("bare debezium delete", encode(debezium("d", wrapped=False)), "not_an_insert"),
    ("debezium insert without after", encode({"op": "c", "before": None}), "missing_field"),
    ("no event_id", encode(plain(event_id=...)), "missing_field"),
    ("null tenant_id", encode(plain(tenant_id=None)), "missing_field"),
    ("no event_type", encode(plain(event_type=...)), "missing_field"),
    ("no schema_version", encode(plain(schema_version=...)), "missing_field"),
    ("no occurred_at", encode(plain(occurred_at=...)), "missing_field"),
    ("no payload", encode(plain(payload=...)), "missing_field"),
    ("debezium row without event_id", encode(debezium(event_id=...)), "missing_field"),
    ("object_version as text", encode(plain(object_version="3")), "wrong_type"),
    ("object_version as float", encode(plain(object_version=3.0)), "wrong_type"),
    ("object_version as bool", encode(plain(object_version=True)), "wrong_type"),
    ("payload as object", encode(plain(payload={"id": "inv_9"})), "wrong_type"),
    ("payload as null", encode(plain(payload=None)), "wrong_type"),
    ("payload_base64 not base64", encode(plain(payload=..., payload_base64="%%%")), "wrong_type"),
    ("payload_base64 as bytes list", encode(plain(payload=..., payload_base64=[1, 2])), "wrong_type"),
    ("bool timestamp", encode(plain(occurred_at=True)), "wrong_type"),
    ("float timestamp", encode(plain(occurred_at=1.5)), "wrong_type"),
    ("naive timestamp", encode(plain(occurred_at="2026-11-29T19:00:00")), "wrong_type"),
    ("not a timestamp", encode(plain(occurred_at="yesterday")), "wrong_type"),
    ("event_id as number", encode(plain(event_id=1)), "wrong_type"),
    ("empty event_id", encode(plain(event_id="")), "wrong_type"),
    ("overlong tenant_id", encode(plain(tenant_id="t" * 201)), "wrong_type"),
    ("object_id as number", encode(plain(object_id=9)), "wrong_type"),
    ("payload over the limit", encode(plain(payload=TOO_LARGE)), "payload_too_large"),
    (
        "base64 payload over the limit",
        encode(plain(payload=..., payload_base64=base64.b64encode(b"\x00" * (LIMIT + 1)).decode())),
        "payload_too_large",
    ),
    ("multi-byte payload over the limit", encode(plain(payload="é" * (LIMIT // 2 + 1))), "payload_too_large"),
    ("debezium payload over the limit", encode(debezium(payload=TOO_LARGE)), "payload_too_large"),
]


@pytest.mark.parametrize(("raw", "reason"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals(raw: bytes, reason: str) -> None:
    with pytest.raises(IngestError) as info:
        parse_event(raw, LIMIT)
    assert info.value.reason == reason
    assert info.value.detail


# -- payloads that are not strict JSON (core/strict_json.py), in every form ---------------------
# Every delivery is sent as application/json, and the catalog check must judge the document a
# receiver reads: anything else is dead-lettered as payload_not_json, whichever form carried it.
NOT_STRICT_PAYLOADS: list[tuple[str, bytes]] = [
    # id                      payload bytes
    ("NaN", b'{"amount":NaN}'),
    ("Infinity", b'{"amount":Infinity}'),
    ("-Infinity", b'[-Infinity]'),
    ("past a double", b'{"amount":1e400}'),
    ("lone high surrogate", b'{"note":"\\ud800"}'),
    ("lone low surrogate in a key", b'{"\\udc00":1}'),
    ("surrogates in the wrong order", b'"\\udc00\\ud800"'),
    ("duplicate key", b'{"amount":-5,"amount":5}'),
    ("duplicate key nested", b'{"a":{"b":1,"b":2}}'),
    ("trailing data", b'{} {}'),
    ("trailing garbage", b'{"a":1}x'),
    ("empty", b""),
    ("only whitespace", b" \n"),
    ("nested past the stack", b"[" * 100_000 + b"]" * 100_000),
    ("UTF-8 byte order mark", b'\xef\xbb\xbf{"a":1}'),
    ("UTF-16", '{"a":1}'.encode("utf-16")),
    ("UTF-16-LE without a BOM", '{"a":1}'.encode("utf-16-le")),
    ("UTF-32", '{"a":1}'.encode("utf-32")),
    ("latin-1", '{"n":"caf\u00e9"}'.encode("latin-1")),
    ("an encoded surrogate (CESU-8)", b'"\xed\xa0\x80"'),
]


def _in_every_form(body: bytes) -> list[tuple[str, bytes]]:
    """``body`` as each ingest form carries it: base64 in the plain form and the v2 outbox row
    always; as text in the plain form and the v1 outbox row when it is UTF-8 text at all."""
    b64 = base64.b64encode(body).decode()
    forms = [("plain payload_base64", encode(plain(payload=..., payload_base64=b64))),
             ("outbox v2 bytea", encode(outbox_v2(body)))]
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return forms
    return forms + [("plain payload text", encode(plain(payload=text))),
                    ("outbox v1 text", encode(debezium(payload=text)))]


NOT_STRICT_RECORDS = [(f"{form}: {case}", raw) for case, body in NOT_STRICT_PAYLOADS
                      for form, raw in _in_every_form(body)]


@pytest.mark.parametrize("raw", [r for _, r in NOT_STRICT_RECORDS], ids=[i for i, _ in NOT_STRICT_RECORDS])
def test_a_payload_that_is_not_strict_json_is_refused_in_every_form(raw: bytes) -> None:
    with pytest.raises(IngestError) as info:
        parse_event(raw, 1 << 20)
    assert info.value.reason == "payload_not_json"
    assert "strict JSON" in info.value.detail


# The record itself is parsed as strictly: a lone surrogate in an id would fail every later
# encode of it (delivery ids, headers, Cassandra), a NaN or a twice-given field is ambiguous.
BAD_RECORDS = [
    # id                              raw record
    ("lone surrogate in event_id", encode(PLAIN).replace(b'"evt_1"', b'"evt_\\ud800"')),
    ("lone surrogate in the payload text", encode(plain(payload='{"a":"\ud800"}'))),
    ("NaN in object_version", encode(PLAIN).replace(b'"object_version": 3', b'"object_version": NaN')),
    ("payload given twice", encode(PLAIN)[:-1] + b', "payload": "{\\"id\\":\\"other\\"}"}'),
    ("nested past the stack", b'{"schema": "webhooks.event/v1", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
]


@pytest.mark.parametrize("raw", [r for _, r in BAD_RECORDS], ids=[i for i, _ in BAD_RECORDS])
def test_a_record_that_is_not_strict_json_is_malformed(raw: bytes) -> None:
    with pytest.raises(IngestError) as info:
        parse_event(raw, LIMIT)
    assert info.value.reason == "malformed_json"


def test_payload_at_the_limit_is_accepted() -> None:
    at_limit = b'"' + b"x" * (LIMIT - 2) + b'"'
    assert len(parse(plain(payload=at_limit.decode())).payload) == LIMIT
    at_limit_b64 = base64.b64encode(at_limit).decode()
    assert parse(plain(payload=..., payload_base64=at_limit_b64)).payload == at_limit


def test_a_utf8_byte_order_mark_is_tolerated() -> None:
    assert parse_event(b"\xef\xbb\xbf" + encode(PLAIN), LIMIT) == EXPECTED


def test_a_targeted_event_needs_the_control_planes_proof() -> None:
    """Target_endpoint_id skips subscription matching; only a valid proof (made by
    the control plane, bound to tenant, event and endpoint) lets it through."""
    from core import target_proof
    from core.ingest import check_target

    key = target_proof.target_key(b"k" * 32)
    plain_event = parse(plain())
    check_target(plain_event, [key])  # not aimed: nothing to prove
    aimed = parse(plain(target_endpoint_id="ep_7"))
    with pytest.raises(IngestError) as err:
        check_target(aimed, [key])
    assert err.value.reason == "untrusted_target" and "ep_7" in err.value.detail
    good = target_proof.prove(key, aimed.tenant_id, aimed.event_id, "ep_7")
    proved = parse(plain(target_endpoint_id="ep_7", target_proof=good))
    assert proved.target_proof == good
    check_target(proved, [key])
    # The proof survives the control plane's own encoding (EventRecord.to_json -> parse_event).
    check_target(parse_event(proved.to_json(), LIMIT), [key])
    with pytest.raises(IngestError):
        check_target(parse(plain(target_endpoint_id="ep_8", target_proof=good)), [key])


def test_an_operational_event_needs_the_platforms_proof() -> None:
    """Only the control plane emits webhooks.* events: a producer's is dead-lettered."""
    from core import operational_events as ops
    from core import target_proof
    from core.ingest import check_target

    key = target_proof.target_key(b"k" * 32)
    forged = parse(plain(event_type="webhooks.endpoint.disabled"))
    with pytest.raises(IngestError) as err:
        check_target(forged, [key])
    assert err.value.reason == "untrusted_operational"
    made = ops.build(ops.ENDPOINT_DISABLED, "t_1", "ep_1", "evt_ops_1", 1_000, {"reason": "gone", "detail": "410"})
    proof = target_proof.prove(key, "t_1", "evt_ops_1", target_proof.OPERATIONAL)
    signed = parse_event(replace(made, target_proof=proof).to_json(), LIMIT)
    check_target(signed, [key])
    with pytest.raises(IngestError):  # a proof for one event does not carry over to another
        check_target(parse_event(replace(made, event_id="evt_ops_2", target_proof=proof).to_json(), LIMIT), [key])
    with pytest.raises(IngestError):  # nor does an endpoint's targeting proof
        aimed = target_proof.prove(key, "t_1", "evt_ops_1", "ep_1")
        check_target(parse_event(replace(made, target_proof=aimed).to_json(), LIMIT), [key])


# -- values the history schema cannot hold ---------------------------------------
# object_version is a Cassandra bigint; occurred_at a timestamp that signing also renders as
# RFC 3339 text (years 1..9999). Past either, the event's every write or send would fail.
BIGINT_MAX = 2**63 - 1
OUT_OF_RANGE = [
    # id                          field             record
    ("object_version 2**63", "object_version", plain(object_version=2**63)),
    ("object_version -2**63-1", "object_version", plain(object_version=-(2**63) - 1)),
    ("debezium object_version 2**64", "object_version", debezium(object_version=2**64)),
    ("occurred_at 2**63 ms", "occurred_at", plain(occurred_at=2**63)),
    ("occurred_at after year 9999", "occurred_at", plain(occurred_at=253_402_300_800_000)),
    ("occurred_at before year 1", "occurred_at", plain(occurred_at=-62_135_596_800_001)),
]


@pytest.mark.parametrize(("name", "doc"), [r[1:] for r in OUT_OF_RANGE], ids=[r[0] for r in OUT_OF_RANGE])
def test_values_the_history_cannot_hold_are_refused_naming_the_field(name: str, doc: dict[str, Any]) -> None:
    with pytest.raises(IngestError) as info:
        parse(doc)
    assert info.value.reason == "out_of_range"
    assert name in info.value.detail


def test_the_edges_of_the_ranges_are_accepted() -> None:
    assert parse(plain(object_version=BIGINT_MAX)).object_version == BIGINT_MAX
    assert parse(plain(object_version=-(2**63))).object_version == -(2**63)
    assert parse(plain(occurred_at=253_402_300_799_999)).occurred_at_ms == 253_402_300_799_999
    assert parse(plain(occurred_at=-62_135_596_800_000)).occurred_at_ms == -62_135_596_800_000
