"""control_plane.catalog.export.asyncapi against the official AsyncAPI 3.0 JSON Schema.

The export is a pure function of the catalog, so every shape of catalog is checked here without the
stack; tests/integration/test_event_catalog.py checks the document the gRPC service answers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from control_plane.catalog.export import asyncapi
from control_plane.catalog.model import operational_entries
from control_plane.catalog.service import EventTypeEntry, VersionEntry
from core.event_schemas import SchemaVersion
from tests.support.asyncapi import asyncapi_3_errors

MONEY = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"money": {"type": "object", "properties": {"amount": {"type": "integer"},
                                                         "currency": {"type": "string"}}}},
    "properties": {"id": {"type": "string"}, "total": {"$ref": "#/$defs/money"}},
    "required": ["id"],
}


def version(text: str, status: str = "active", examples: tuple[Any, ...] = ({"id": "inv_1"},)) -> VersionEntry:
    return VersionEntry(SchemaVersion.parse(text), MONEY, examples, 0, "test", status)


def event_type(name: str, *versions: VersionEntry, group: str = "", description: str = "",
               status: str = "active") -> EventTypeEntry:
    return EventTypeEntry("acme", name, description, group, status, None, "reject", 0, 0, "test", 1, versions)


CATALOGS = {
    "empty": [],
    "one type, no group, no description, no example": [event_type("order.created", version("1", examples=()))],
    "groups, minors, majors, deprecated versions and types": [
        event_type("invoice.paid", version("1"), version("1.1"), version("2"), version("3", "deprecated"),
                   group="billing", description="An invoice was paid"),
        event_type("invoice.old", version("1"), status="deprecated"),
        event_type("order.created", version("1", examples=({"id": "o1"}, {"id": "o2", "total": {"amount": 1}}))),
    ],
    "the platform's operational event types": operational_entries("acme"),
}


@pytest.mark.parametrize("types", CATALOGS.values(), ids=CATALOGS.keys())
def test_the_export_is_valid_asyncapi_3(types: list[EventTypeEntry]) -> None:
    assert asyncapi_3_errors(asyncapi("acme", types)) == []


def _first(section: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda doc: next(iter(doc[section].values()))


# Each breaks the document in a way the official schema forbids, so the check above can fail.
BREAKAGES: dict[str, tuple[Callable[[dict[str, Any]], object], str]] = {
    "no asyncapi version": (lambda d: d.pop("asyncapi"), "'asyncapi' is a required property"),
    "no info title": (lambda d: d["info"].pop("title"), "'title' is a required property"),
    "an operation without a channel": (lambda d: _first("operations")(d).pop("channel"),
                                       "$.operations['receive_invoice.paid']"),
    "an operation sending instead of receiving": (lambda d: _first("operations")(d).update(action="post"),
                                                  "$.operations['receive_invoice.paid']"),
    "a message whose contentType is not a string": (
        lambda d: _first("messages")(d["components"]).update(contentType=1),
        "$.components.messages['invoice.paid_v1.0']"),
}


@pytest.mark.parametrize(("breakage", "found"), BREAKAGES.values(), ids=BREAKAGES.keys())
def test_the_official_schema_finds_a_broken_export(breakage: Callable[[dict[str, Any]], object], found: str) -> None:
    doc = copy.deepcopy(asyncapi("acme", CATALOGS["groups, minors, majors, deprecated versions and types"]))
    breakage(doc)
    errors = asyncapi_3_errors(doc)
    assert errors and any(found in e for e in errors), errors
