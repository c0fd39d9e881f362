"""Payload minimisation per endpoint: table-driven."""

from __future__ import annotations

import json

import pytest

from core import minimise as m

EVENT = {"event_type": "invoice.paid", "event_id": "evt_1", "object_id": "inv_9", "object_version": 3,
         "occurred_at_ms": 1_700_000_000_000}
BODY = json.dumps({"id": "inv_9", "amount": 4200, "customer": {"id": "cus_1", "email": "a@b.c", "card": "4242"},
                   "lines": [{"sku": "x"}], "a/b": 1, "t~x": 2}).encode()


@pytest.mark.parametrize(("fields", "expected"), [
    (["/id"], {"id": "inv_9"}),
    (["/amount", "/id"], {"amount": 4200, "id": "inv_9"}),                     # allow-list order
    (["/customer/id"], {"customer": {"id": "cus_1"}}),                          # nested: email, card left out
    (["/customer/id", "/customer/email"], {"customer": {"id": "cus_1", "email": "a@b.c"}}),
    (["/customer", "/customer/id"], {"customer": {"id": "cus_1", "email": "a@b.c", "card": "4242"}}),
    (["/lines"], {"lines": [{"sku": "x"}]}),                                    # an array, whole
    (["/lines/0/sku"], {}),                                                     # through an array: nothing
    (["/missing", "/customer/missing"], {}),                                    # names nothing in this event
    (["/a~1b", "/t~0x"], {"a/b": 1, "t~x": 2}),                                # RFC 6901 escapes
])
def test_fields_mode_sends_only_what_the_allow_list_names(fields: list[str], expected: dict) -> None:
    m.check(m.FIELDS, fields)
    out = m.minimise(BODY, m.FIELDS, fields, **EVENT)
    assert json.loads(out) == expected
    assert list(json.loads(out)) == list(expected)  # and in that order


def test_full_mode_is_the_exact_bytes_and_thin_mode_carries_no_business_data() -> None:
    assert m.minimise(BODY, m.FULL, (), **EVENT) is BODY
    thin = json.loads(m.minimise(BODY, m.THIN, (), **EVENT))
    assert thin == {"type": "invoice.paid", "event_id": "evt_1", "occurred_at": "2023-11-14T22:13:20.000Z",
                    "object": {"id": "inv_9", "version": 3}, "thin": True}
    assert b"4242" not in m.minimise(BODY, m.THIN, (), **EVENT)
    no_object = json.loads(m.minimise(BODY, m.THIN, (), **{**EVENT, "object_id": ""}))
    assert no_object["object"] is None


def test_a_payload_that_is_not_an_object_yields_an_empty_object() -> None:
    assert m.minimise(b"[1,2]", m.FIELDS, ["/id"], **EVENT) == b"{}"


@pytest.mark.parametrize(("mode", "fields", "error"), [
    ("partial", [], "unknown payload mode 'partial'"),
    (m.FIELDS, [], "needs at least one JSON Pointer"),
    (m.FIELDS, ["id"], "must start with '/'"),
    (m.FIELDS, ["/a~2b"], "must be escaped"),
    (m.FIELDS, ["/a~"], "must be escaped"),
    (m.FIELDS, [""], "use payload mode 'full'"),
    (m.FIELDS, ["/a", "/a"], "repeat"),
    (m.FIELDS, [f"/f{i}" for i in range(51)], "at most 50"),
    (m.FIELDS, ["/" + "x" * 300], "longer than 256"),
    (m.THIN, ["/id"], "only used with payload mode 'fields'"),
    (m.FULL, ["/id"], "only used with payload mode 'fields'"),
])
def test_a_malformed_allow_list_is_refused_with_the_reason(mode: str, fields: list[str], error: str) -> None:
    with pytest.raises(m.InvalidAllowList, match=error):
        m.check(mode, fields)
