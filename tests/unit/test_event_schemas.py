"""core/event_schemas.py: version ids, the compatibility policy rule by rule, validators."""

from __future__ import annotations

from typing import Any

import pytest

from core.event_schemas import (
    SchemaDocumentError,
    SchemaVersion,
    SchemaVersionError,
    ValidatorCache,
    breaking_changes,
    check_schema,
    compile_validator,
)


def obj(props: dict[str, Any], required: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), **extra}


@pytest.mark.parametrize(("text", "expected"), [
    ("1", SchemaVersion(1, 0)),
    ("2.0", SchemaVersion(2, 0)),
    ("2.13", SchemaVersion(2, 13)),
])
def test_version_ids(text: str, expected: SchemaVersion) -> None:
    assert SchemaVersion.parse(text) == expected


@pytest.mark.parametrize("text", ["", "0", "01", "1.01", "v1", "1.2.3", "2026-01-01", "1.", " 1"])
def test_version_ids_refused(text: str) -> None:
    with pytest.raises(SchemaVersionError):
        SchemaVersion.parse(text)


def test_versions_order_by_major_then_minor() -> None:
    assert sorted(SchemaVersion.parse(v) for v in ["2.1", "1.10", "2", "1.9"]) == [
        SchemaVersion(1, 9), SchemaVersion(1, 10), SchemaVersion(2, 0), SchemaVersion(2, 1)]


BASE = obj({"id": {"type": "string"},
            "amount": {"type": "integer", "minimum": 0},
            "status": {"type": "string", "enum": ["open", "paid"]},
            "customer": obj({"id": {"type": "string"}, "email": {"type": "string"}}, ("id",)),
            "lines": {"type": "array", "items": obj({"sku": {"type": "string"}}, ("sku",))}},
           ("id", "amount"))


def changed(path: list[str], value: Any) -> dict[str, Any]:
    """BASE with the subschema at ``path`` replaced (value ``None`` deletes it)."""
    import copy

    doc = copy.deepcopy(BASE)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


# Additive changes: a minor version may make them.
ALLOWED = [
    ("identical", BASE),
    ("new optional property", changed(["properties", "note"], {"type": "string"})),
    ("new optional nested property", changed(["properties", "customer", "properties", "name"], {"type": "string"})),
    ("enum widened", changed(["properties", "status", "enum"], ["open", "paid", "void"])),
    ("enum dropped", changed(["properties", "status", "enum"], None)),
    ("integer widened to number", changed(["properties", "amount", "type"], "number")),
    ("second type allowed", changed(["properties", "id", "type"], ["string", "null"])),
    ("required dropped", changed(["required"], ["id"])),
    ("lower bound relaxed", changed(["properties", "amount", "minimum"], -10)),
    ("lower bound removed", changed(["properties", "amount", "minimum"], None)),
    ("description added", changed(["properties", "id", "description"], "the invoice id")),
    ("examples changed", changed(["examples"], [{"id": "x", "amount": 1}])),
]


@pytest.mark.parametrize(("case", "new"), ALLOWED, ids=[c for c, _ in ALLOWED])
def test_additive_changes_are_allowed_within_a_major(case: str, new: dict[str, Any]) -> None:
    assert breaking_changes(BASE, new) == []


# Breaking changes: each needs a new major; the refusal names the pointer into the schema.
BREAKING = [
    ("property removed", changed(["properties", "status"], None), "/properties/status", "removed"),
    ("property renamed", {**BASE, "properties": {**{k: v for k, v in BASE["properties"].items() if k != "id"},
                                                 "invoice_id": {"type": "string"}},
                          "required": ["amount"]},
     "/properties/id", "removed"),
    ("nested property removed", changed(["properties", "customer", "properties", "email"], None),
     "/properties/customer/properties/email", "removed"),
    ("property removed inside array items", changed(["properties", "lines", "items", "properties", "sku"], None),
     "/properties/lines/items/properties/sku", "removed"),
    ("optional made required", changed(["required"], ["id", "amount", "status"]), "/properties/status", "required"),
    ("new property added as required", {**changed(["properties", "note"], {"type": "string"}),
                                        "required": ["id", "amount", "note"]}, "/properties/note", "required"),
    ("type changed", changed(["properties", "amount", "type"], "string"),
     "/properties/amount/type", "type"),
    ("upper bound added", changed(["properties", "customer", "properties", "email"],
                                                 {"type": "string", "maxLength": 3}),
     "/properties/customer/properties/email/maxLength", "bound"),
    ("enum narrowed", changed(["properties", "status", "enum"], ["open"]), "/properties/status/enum", "enum"),
    ("enum added", changed(["properties", "id", "enum"], ["a"]), "/properties/id/enum", "enum"),
    ("const added", changed(["properties", "id", "const"], "a"), "/properties/id/const", "const"),
    ("lower bound raised", changed(["properties", "amount", "minimum"], 1), "/properties/amount/minimum", "bound"),
    ("additionalProperties closed", changed(["additionalProperties"], False), "/additionalProperties", "closed"),
    ("pattern added", changed(["properties", "id", "pattern"], "^inv_"), "/properties/id/pattern", "unproven"),
    ("oneOf added", changed(["oneOf"], [{"required": ["id"]}]), "/oneOf", "unproven"),
    ("property schema made false", changed(["properties", "id"], False), "/properties/id", "unproven"),
]


@pytest.mark.parametrize(("case", "new", "pointer", "rule"), BREAKING, ids=[c[0] for c in BREAKING])
def test_breaking_changes_name_the_pointer(case: str, new: dict[str, Any], pointer: str, rule: str) -> None:
    found = breaking_changes(BASE, new)
    assert [(b.pointer, b.rule) for b in found] == [(pointer, rule)]
    assert pointer in str(found[0])


def test_number_to_integer_is_a_narrowing() -> None:
    old = obj({"n": {"type": "number"}})
    assert [b.pointer for b in breaking_changes(old, obj({"n": {"type": "integer"}}))] == ["/properties/n/type"]


def test_a_type_added_where_any_value_was_accepted_is_a_narrowing() -> None:
    old = obj({"n": {}})
    assert [b.rule for b in breaking_changes(old, obj({"n": {"type": "string"}}))] == ["type"]


def test_dropping_a_pattern_widens() -> None:
    old = obj({"id": {"type": "string", "pattern": "^inv_"}})
    assert breaking_changes(old, obj({"id": {"type": "string"}})) == []


def test_pointer_tokens_are_escaped() -> None:
    old = obj({"a/b": {"type": "string"}, "c~d": {"type": "string"}})
    assert [b.pointer for b in breaking_changes(old, obj({}))] == ["/properties/a~1b", "/properties/c~0d"]


def test_a_removed_definition_is_breaking() -> None:
    old = {"$defs": {"money": {"type": "integer"}}, "type": "object"}
    assert [b.pointer for b in breaking_changes(old, {"$defs": {}, "type": "object"})] == ["/$defs/money"]


@pytest.mark.parametrize(("doc", "pointer"), [
    ([], ""),
    ({"$schema": "http://json-schema.org/draft-07/schema#"}, "/$schema"),
    ({"type": "objekt"}, "/type"),
    ({"properties": {"a": {"minLength": -1}}}, "/properties/a/minLength"),
])
def test_schema_documents_are_checked_against_the_2020_12_meta_schema(doc: Any, pointer: str) -> None:
    with pytest.raises(SchemaDocumentError) as info:
        check_schema(doc)
    assert info.value.pointer == pointer


def test_a_valid_2020_12_document_passes() -> None:
    check_schema({"$schema": "https://json-schema.org/draft/2020-12/schema", **BASE})


@pytest.mark.parametrize(("payload", "pointer"), [
    ({"id": "inv_1", "amount": 3}, None),
    ({"id": "inv_1"}, ""),
    ({"id": "inv_1", "amount": "3"}, "/amount"),
    ({"id": "inv_1", "amount": 3, "customer": {"id": 5}}, "/customer/id"),
    ({"id": "inv_1", "amount": 3, "lines": [{"sku": "a"}, {}]}, "/lines/1"),
    ({"id": "inv_1", "amount": 3, "status": "void"}, "/status"),
])
def test_validation_names_the_pointer_in_the_payload(payload: Any, pointer: str | None) -> None:
    invalid = compile_validator(BASE)(payload)
    assert (invalid.pointer if invalid else None) == pointer


def test_2020_12_keywords_are_enforced() -> None:
    # prefixItems is what a draft-7 validator would silently ignore.
    validate = compile_validator({"type": "array", "prefixItems": [{"type": "string"}]})
    assert validate(["a", 1]) is None
    invalid = validate([1])
    assert invalid is not None and invalid.pointer == "/0"


def test_the_cache_compiles_once_per_key_and_is_bounded() -> None:
    cache = ValidatorCache(max_entries=2)
    first = cache.get(("t", "a", "1.0"), BASE)
    assert cache.get(("t", "a", "1.0"), BASE) is first
    cache.get(("t", "b", "1.0"), BASE)
    cache.get(("t", "c", "1.0"), BASE)
    assert len(cache) == 2
    assert cache.get(("t", "a", "1.0"), BASE) is not first  # evicted, least recently used
