"""The bench's catalog (bench/catalog.py, `bench.run --catalog`): the schema it catalogues describes
the bench's payload, and a bench event as the run emits it is validated and sent by fan-out's
decision, not let through unchecked or dead-lettered."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import catalog as bench_catalog
from bench import raw_http
from bench.run import EVENT_TYPE, UNCATALOGUED_VERSION, Tenant, _event, main
from core.event_schemas import SchemaVersion, ValidatorCache, check_schema, compile_validator
from core.records import CatalogSettingsRecord, CatalogTypeRecord
from core.schema_check import SCHEMA_INVALID, SCHEMA_UNKNOWN, SEND, CatalogIndex, Refuse, check_event
from operators.fanout import _schema_letter

TENANT = "ten_bench_0_abcdef12"
SIZES = [len(b'{"type":"bench.raw_http","data":""}'), 200, raw_http.DEFAULT_BODY_BYTES, 10_000]


def catalogued_schema(body: bytes) -> dict[str, object]:
    _, version = bench_catalog.catalog_requests(TENANT, EVENT_TYPE, body)
    schema: dict[str, object] = json.loads(version.schema_json)
    return schema


def job_catalog(body: bytes) -> CatalogIndex:
    """The tenant's catalog as fan-out reads it off the endpoints topic after the bench's calls
    (the control plane publishes versions under their canonical MAJOR.MINOR, unknown types
    refused for a tenant created after the catalog)."""
    index = CatalogIndex()
    version = str(SchemaVersion.parse(bench_catalog.EVENT_VERSION))
    index.add(CatalogTypeRecord(TENANT, EVENT_TYPE, bench_catalog.ENFORCEMENT, 2,
                                {version: catalogued_schema(body)}, 0))
    index.add(CatalogSettingsRecord(TENANT, "reject", 0))
    return index


@pytest.mark.parametrize("size", SIZES)
def test_the_catalogued_schema_is_a_2020_12_schema_the_bench_payload_satisfies(size: int) -> None:
    body = raw_http.make_body(size)
    schema = catalogued_schema(body)
    check_schema(schema)
    assert compile_validator(schema)(json.loads(body)) is None


def test_the_schema_says_what_the_payload_is_not_merely_any_object() -> None:
    validate = compile_validator(catalogued_schema(raw_http.make_body(200)))
    assert validate({"type": "bench.raw_http"}) is not None  # data required
    assert validate({"type": "bench.raw_http", "data": 7}) is not None  # data a string
    assert validate({"type": "bench.other", "data": ""}) is not None


def test_the_versions_example_is_the_runs_payload_so_the_api_checks_it_at_set_up() -> None:
    body = raw_http.make_body(raw_http.DEFAULT_BODY_BYTES)
    create, version = bench_catalog.catalog_requests(TENANT, EVENT_TYPE, body)
    assert (create.tenant_id, create.name, create.enforcement) == (TENANT, EVENT_TYPE, "reject")
    assert (version.tenant_id, version.name, version.version) == (TENANT, EVENT_TYPE, bench_catalog.EVENT_VERSION)
    assert [json.loads(e) for e in version.examples_json] == [json.loads(body)]


def test_a_catalogued_tenants_bench_event_is_validated_and_sent() -> None:
    body = raw_http.make_body(raw_http.DEFAULT_BODY_BYTES)
    index = job_catalog(body)
    event = _event(Tenant(TENANT, [], bench_catalog.EVENT_VERSION), body)
    assert check_event(event, index.tenant(TENANT), ValidatorCache()) == SEND
    # The same event is checked, not waved through: a payload off the schema is refused.
    off = _event(Tenant(TENANT, [], bench_catalog.EVENT_VERSION), body.replace(b"bench.raw_http", b"bench.other"))
    verdict = check_event(off, index.tenant(TENANT), ValidatorCache())
    assert isinstance(verdict, Refuse) and verdict.reason == SCHEMA_INVALID


def test_without_the_catalogued_version_the_bench_event_would_be_refused_as_unknown() -> None:
    """Why --catalog changes the events' schema_version: the default one is no MAJOR[.MINOR]."""
    body = raw_http.make_body(raw_http.DEFAULT_BODY_BYTES)
    event = _event(Tenant(TENANT, []), body)
    assert event.schema_version == UNCATALOGUED_VERSION
    verdict = check_event(event, job_catalog(body).tenant(TENANT), ValidatorCache())
    assert isinstance(verdict, Refuse) and verdict.reason == SCHEMA_UNKNOWN


def test_the_probe_is_refused_schema_invalid_and_its_dead_letter_names_it() -> None:
    """The probe the run sends before the load to see fan-out validate: refused by the schema, and
    found again in the dead letter the job writes for it (operators.fanout's own writer)."""
    body = raw_http.make_body(raw_http.DEFAULT_BODY_BYTES)
    index = job_catalog(body)
    probe = _event(Tenant(TENANT, [], bench_catalog.EVENT_VERSION), bench_catalog.off_schema(body))
    refused = check_event(probe, index.tenant(TENANT), ValidatorCache())
    assert isinstance(refused, Refuse) and refused.reason == SCHEMA_INVALID
    letter = _schema_letter(probe, refused, "webhooks.events.x").encode()
    assert bench_catalog.refused_event_id(letter) == probe.event_id
    # A letter for any other reason does not count as the probe's.
    unknown = _event(Tenant(TENANT, []), body)
    unknown_refused = check_event(unknown, index.tenant(TENANT), ValidatorCache())
    assert isinstance(unknown_refused, Refuse)
    assert bench_catalog.refused_event_id(_schema_letter(unknown, unknown_refused, "t").encode()) is None


def test_the_probe_needs_a_bench_payload() -> None:
    with pytest.raises(ValueError, match="not a bench payload"):
        bench_catalog.off_schema(b'{"id":"x"}')


def test_the_report_line_says_whether_fan_out_validated() -> None:
    assert bench_catalog.catalog_line(False, EVENT_TYPE).startswith("catalog: off ")
    on = bench_catalog.catalog_line(True, EVENT_TYPE)
    assert on.startswith("catalog: on (bench.event 1.0 ")


def test_the_option_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def run(args: argparse.Namespace) -> int:
        seen.append(args.catalog)
        return 0

    monkeypatch.setattr("bench.run.run", run)
    assert main([]) == 0 and main(["--catalog"]) == 0
    assert seen == [False, True]
