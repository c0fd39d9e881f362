"""webhookctl without a server: argument -> request mapping and rendering."""

from __future__ import annotations

from typing import Any

from control_plane import cli
from control_plane.api import pb


class RecordingStub:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        def call(request: Any) -> Any:
            self.calls.append((name, request))
            if name == "RecoverFailedDeliveries":
                return iter([pb.RecoverProgress(total=2), pb.RecoverProgress(total=2, replayed=2, done=True)])
            return pb.Endpoint(endpoint_id="ep_1", url="https://h.example.com:443/")

        return call


def run(argv: list[str]) -> tuple[RecordingStub, list[str]]:
    stub, shown = RecordingStub(), []
    cli.run(cli.parser().parse_args(argv), stub, stub, emit=shown.append, show=shown.append)
    return stub, shown


def test_update_sends_only_the_given_fields_in_the_mask() -> None:
    stub, shown = run(["endpoints", "update", "ep_1", "--description", "new", "--clear-rate-limit",
                       "--max-in-flight", "3"])
    [(name, request)] = stub.calls
    assert name == "UpdateEndpoint"
    assert sorted(request.update_mask.paths) == ["description", "max_in_flight", "rate_limit_per_s"]
    assert request.endpoint.max_in_flight == 3 and not request.endpoint.HasField("rate_limit_per_s")
    assert "ep_1" in shown[0]


def test_recover_draws_a_progress_bar(capsys: Any) -> None:
    run(["deliveries", "recover", "ep_1", "--since", "2026-11-01T00:00:00Z", "--until", "2026-11-02"])
    assert "[" + "#" * 30 + "] 2/2 replayed" in capsys.readouterr().err


def test_table_aligns_columns() -> None:
    assert cli.table(["a", "bb"], [("xxx", 1)]).splitlines() == ["A    BB", "xxx  1"]
