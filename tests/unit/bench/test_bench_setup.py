"""The bench run's own processes (bench/run.py): what their environment makes of them."""

from __future__ import annotations

from bench.run import bench_env, control_plane_env
from stack.isolation import settings_with


def test_the_runs_control_plane_leaves_the_console_and_http_ports_to_the_stacks() -> None:
    """Its console on the default port failed to bind beside the stack's control plane (8090) and
    the process exited before its gRPC API was up: every `make bench` stopped at set-up. The HTTP
    API's port (8088) is the stack's too."""
    settings = settings_with(control_plane_env(bench_env("x1", 4443, 2), 50123))
    assert settings.control_plane.console_port == 0
    assert settings.control_plane.http_port == 0
    assert settings.control_plane.port == 50123
