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
    ("new optional property that accepts anything", changed(["properties", "note"], {})),
    ("new optional property, annotations only", changed(["properties", "note"], {"description": "free text"})),
    ("new optional nested property that accepts anything", changed(["properties", "customer", "properties", "name"],
                                                                  True)),
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
    ("nested property removed", changed(["properties", "customer", "properties", "email"], None),
     "/properties/customer/properties/email", "removed"),
    ("property removed inside array items", changed(["properties", "lines", "items", "properties", "sku"], None),
     "/properties/lines/items/properties/sku", "removed"),
    ("optional made required", changed(["required"], ["id", "amount", "status"]), "/properties/status", "required"),
    # BASE's objects are open: a 1.0 event may carry "note" with any value, so a typed "note" is a
    # narrowing (the new-property rules are in NEW_PROPERTIES below).
    ("new optional property with a type", changed(["properties", "note"], {"type": "string"}),
     "/properties/note", "closed"),
    ("new optional nested property with a type",
     changed(["properties", "customer", "properties", "name"], {"type": "string"}),
     "/properties/customer/properties/name", "closed"),
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


def test_a_rename_is_a_removal_and_under_an_open_object_a_narrowing() -> None:
    renamed = {**BASE, "properties": {**{k: v for k, v in BASE["properties"].items() if k != "id"},
                                      "invoice_id": {"type": "string"}},
               "required": ["amount"]}
    assert [(b.pointer, b.rule) for b in breaking_changes(BASE, renamed)] == [
        ("/properties/id", "removed"), ("/properties/invoice_id", "closed")]


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


# A property new in ``properties`` must accept every value the old schema let that name have: what
# the old ``patternProperties`` matching the name said, or else the old ``additionalProperties``.
STRING, INTEGER = {"type": "string"}, {"type": "integer"}
CLOSED = {"additionalProperties": False}
X_STRINGS = {"patternProperties": {"^x_": STRING}}  # extras open
X_STRINGS_ONLY = {**X_STRINGS, **CLOSED}
X_OR_ID_ID = {"type": "string", "maxLength": 8}
X_OR_ID = {"patternProperties": {"^x_": STRING, "_id$": X_OR_ID_ID}, **CLOSED}
NEW_PROPERTIES = [
    # id                                         old object's extras          new property               breaks
    ("closed before: any schema",                CLOSED,                      ("n", INTEGER),            False),
    ("open before (absent): {}",                 {},                          ("n", {}),                 False),
    ("open before (absent): true",               {},                          ("n", True),               False),
    ("open before (absent): a type",             {},                          ("n", STRING),             True),
    ("open before (absent): false",              {},                          ("n", False),              True),
    ("open before (true): a type",               {"additionalProperties": True}, ("n", STRING),          True),
    ("open before ({}): a type",                 {"additionalProperties": {}}, ("n", STRING),            True),
    ("extras typed: the same type",              {"additionalProperties": STRING}, ("n", STRING),        False),
    ("extras typed: a wider type",               {"additionalProperties": STRING},
     ("n", {"type": ["string", "null"]}), False),
    ("extras integer: number",                   {"additionalProperties": INTEGER}, ("n", {"type": "number"}), False),
    ("extras typed: a bound added",              {"additionalProperties": STRING},
     ("n", {"type": "string", "maxLength": 3}), True),
    ("extras typed: another type",               {"additionalProperties": STRING}, ("n", INTEGER),       True),
    ("extras typed: a pattern added",            {"additionalProperties": STRING},
     ("n", {"type": "string", "pattern": "^a"}), True),
    ("pattern matches: the same schema",         X_STRINGS_ONLY,              ("x_n", STRING),           False),
    ("pattern matches: an enum added",           X_STRINGS_ONLY,
     ("x_n", {"type": "string", "enum": ["a"]}), True),
    ("pattern matches, extras open: narrower",   X_STRINGS,                   ("x_n", INTEGER),          True),
    ("pattern matches, extras open: the same",   X_STRINGS,                   ("x_n", STRING),           False),
    ("pattern does not match, extras closed",    X_STRINGS_ONLY,              ("n", INTEGER),            False),
    ("pattern does not match, extras open",      X_STRINGS,                   ("n", STRING),             True),
    ("pattern unanchored, as validators search", {"patternProperties": {"_id": STRING}, **CLOSED},
     ("x_id_2", INTEGER), True),
    ("two patterns: as narrow as one of them",   X_OR_ID,                     ("x_id", X_OR_ID_ID),      False),
    ("two patterns: narrower than both",         X_OR_ID,
     ("x_id", {"type": "string", "maxLength": 4}), True),
    ("a pattern Python cannot compile",          {"patternProperties": {"(?<n>x)": STRING}, **CLOSED},
     ("x", STRING), True),
]


@pytest.mark.parametrize(("extras", "added", "breaks"), [c[1:] for c in NEW_PROPERTIES],
                         ids=[c[0] for c in NEW_PROPERTIES])
def test_a_new_property_must_accept_what_its_name_was_allowed_before(
        extras: dict[str, Any], added: tuple[str, Any], breaks: bool) -> None:
    name, schema = added
    old = {"type": "object", "properties": {"id": STRING}, **extras}
    new = {**old, "properties": {"id": STRING, name: schema}}
    found = breaking_changes(old, new)
    assert [b.pointer for b in found] == ([f"/properties/{name}"] if breaks else []), found
    assert all(b.rule in ("closed", "unproven") for b in found)


def test_the_narrowing_is_shown_by_an_event_the_old_version_accepted() -> None:
    """Why the rule exists: a 1.0-valid event would be schema_invalid labelled 1.1."""
    old = {"type": "object", "properties": {"id": STRING}}
    new = {**old, "properties": {"id": STRING, "note": STRING}}
    event = {"id": "inv_1", "note": 5}
    assert compile_validator(old)(event) is None and compile_validator(new)(event) is not None
    (found,) = breaking_changes(old, new)
    assert (found.pointer, found.rule) == ("/properties/note", "closed")
    assert "additionalProperties" in found.detail
