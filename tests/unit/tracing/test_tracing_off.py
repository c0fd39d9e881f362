"""Tracing off costs no import: a process that builds the job's operators' send path, the control
plane's server and the outbox library with tracing off never loads the OpenTelemetry SDK, and a
delivery's traceparent is passed on without being parsed. A fresh interpreter, so no other test's
import counts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from core.settings import REPO_ROOT

PROGRAM = textwrap.dedent("""
    import asyncio, sys
    from dataclasses import replace

    import control_plane.server, control_plane.cli.main, control_plane.httpapi.server
    import jobs.delivery_job, operators.dispatcher, operators.fanout, outbox.producer
    from core import dispatch, trace_context
    from core.fanout import NewDelivery
    from core.records import EndpointConfig, EndpointStatus, EventRecord
    from core.settings import DispatchSettings, Settings
    from operators.http_sender import SendResult
    from operators.sender import Sender
    from tracing import tracer

    settings = Settings()
    assert not settings.tracing.enabled
    assert tracer(settings.tracing, settings.tracing.job_service_name) is None

    def refuse(*_a, **_k):
        raise AssertionError("tracing off parsed a traceparent")

    trace_context.parse = refuse
    trace_context.begin = refuse

    class Http:
        async def send(self, url, body, headers):
            self.headers = dict(headers)
            return SendResult(status=200, error=None, error_detail="", latency_ms=1)

    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    e = EventRecord("evt_1", "t_1", "a.b", "1", "", 0, 0, b"{}")
    p = dispatch.Pending(delivery=NewDelivery("dlv_1", e, "ep_1", "t_1", 1, 0, 1, trace=tp),
                         stage=dispatch.Stage.SENDING, intent=dispatch.Intent(1, "att_1"))
    cfg = EndpointConfig("ep_1", "t_1", 1, "https://example.com/", EndpointStatus.ACTIVE, ("*",), (), 0)
    http = Http()
    asyncio.run(Sender(DispatchSettings(), http, None, tracer(settings.tracing, "x")).send(p, b"{}", cfg,
                                                                                             [(1, b"k" * 32)]))
    assert http.headers["traceparent"] == tp
    loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
    assert not loaded, loaded
    print("ok")
""")


def _run(program: str) -> str:
    # No WEBHOOKS_* of the calling shell; its PYTHONPATH, where the SDK may have been installed.
    env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0",
           **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    out = subprocess.run([sys.executable, "-c", program], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_nothing_of_the_sdk_is_loaded_with_tracing_off() -> None:
    assert _run(PROGRAM) == "ok"


def test_the_check_can_fail_tracing_on_loads_the_sdk() -> None:
    on = ("import sys\nfrom core.tracing_settings import TracingSettings\nfrom tracing import tracer\n"
          "tracer(TracingSettings(enabled=True), 'x')\nprint(any(m.startswith('opentelemetry') for m in sys.modules))")
    assert _run(on) == "True"
