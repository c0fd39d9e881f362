"""Tracing's way out of a process: a :class:`core.spans.Tracer` for a process whose tracing is on.

:func:`tracer` is what every traced process calls once (the job's fan-out and dispatcher, the
control plane, the outbox library's producers): None when ``tracing.enabled`` is off, and then the
OpenTelemetry SDK is never imported -- only :mod:`tracing.otlp` imports it, and only from here.
"""

from __future__ import annotations

import random

from core.spans import Tracer
from core.trace_context import HeadSampler
from core.tracing_settings import TracingSettings


def tracer(settings: TracingSettings, service_name: str) -> Tracer | None:
    """The process's tracer for ``service_name``, or None when tracing is off."""
    if not settings.enabled:
        return None
    from tracing.otlp import sink

    # Ids from the OS's entropy (random.Random() seeds from it): unique across processes.
    return Tracer(sink(settings, service_name), HeadSampler(settings.sample_ratio), random.Random())
