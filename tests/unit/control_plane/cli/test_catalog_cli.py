"""webhookctl event-types: what each command sends (a recording stub stands in for the API)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from control_plane.cli import main as cli
from control_plane.cli.event_types import run
from control_plane.rpc.catalog_api import cpb


class RecordingStub:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, method: str) -> Any:
        def call(request: Any) -> Any:
            self.calls.append((method, request))
            return cpb.CatalogEventType(name=getattr(request, "name", ""))
        return call


def parse(*argv: str) -> Any:
    return cli.parser().parse_args(["event-types", *argv])


def test_add_version_loads_the_schema_file_and_takes_its_examples(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"id": {"type": "string"}}, "examples": [{"id": "a"}, {"id": "b"}]}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    stub = RecordingStub()
    run(parse("--tenant", "acme", "add-version", "invoice.paid", "2.1", "--schema-file", str(tmp_path / "s.json")),
        stub)
    [(method, request)] = stub.calls
    assert method == "AddSchemaVersion"
    assert (request.tenant_id, request.name, request.version) == ("acme", "invoice.paid", "2.1")
    assert json.loads(request.schema_json) == schema
    assert [json.loads(e) for e in request.examples_json] == [{"id": "a"}, {"id": "b"}]


def test_example_files_replace_the_schemas_examples(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps({"type": "object", "examples": [{"id": "a"}]}))
    (tmp_path / "e.json").write_text('{"id": "z"}')
    stub = RecordingStub()
    run(parse("add-version", "invoice.paid", "1", "--schema-file", str(tmp_path / "s.json"),
              "--example-file", str(tmp_path / "e.json")), stub)
    assert [json.loads(e) for e in stub.calls[0][1].examples_json] == [{"id": "z"}]


def test_update_sends_only_the_fields_given() -> None:
    stub = RecordingStub()
    run(parse("update", "invoice.paid", "--enforcement", "warn"), stub)
    request = stub.calls[0][1]
    assert list(request.update_fields) == ["enforcement"] and request.enforcement == "warn"


def test_deprecate_sends_the_sunset_and_version() -> None:
    stub = RecordingStub()
    run(parse("deprecate", "invoice.paid", "--version", "1", "--sunset", "2027-01-01T00:00:00Z"), stub)
    request = stub.calls[0][1]
    assert request.version == "1" and request.sunset_at.ToJsonString() == "2027-01-01T00:00:00Z"


def test_pin_sends_the_majors() -> None:
    stub = RecordingStub()
    run(parse("pin", "ep_1", "--major", "2", "--major", "3"), stub)
    assert stub.calls[0][0] == "SetEndpointSchemaMajors" and list(stub.calls[0][1].schema_majors) == [2, 3]


def test_a_type_group_option_does_not_replace_the_command_group() -> None:
    """`--group billing` once overwrote the top-level command group (same argparse dest), so
    `webhookctl event-types create ... --group billing` went to the endpoints path and answered
    'set WEBHOOKCTL_API_KEY' even with the admin token and --tenant."""
    args = parse("--tenant", "acme", "create", "invoice.paid", "--group", "billing")
    assert args.group == "event-types"
    stub = RecordingStub()
    run(args, stub)
    assert stub.calls[0][1].group == "billing"
    stub = RecordingStub()
    run(parse("update", "invoice.paid", "--group", "finance"), stub)
    request = stub.calls[0][1]
    assert list(request.update_fields) == ["group"] and request.group == "finance"
