"""core/tracing_settings.py: off by default, WEBHOOKS_TRACING__* overrides, refusals at start-up."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.settings import Settings, for_taskmanagers
from stack.isolation import settings_with


def test_off_by_default_with_the_local_stacks_collector() -> None:
    t = Settings().tracing
    assert t.enabled is False
    assert t.traces_url == "http://127.0.0.1:4318/v1/traces"
    assert (t.job_service_name, t.control_plane_service_name, t.producer_service_name) == (
        "webhooks-delivery", "webhooks-control-plane", "webhooks-producer")


def test_the_environment_turns_it_on_and_the_job_ships_it_to_its_taskmanagers() -> None:
    s = settings_with({"WEBHOOKS_TRACING__ENABLED": "true", "WEBHOOKS_TRACING__SAMPLE_RATIO": "0.01",
                       "WEBHOOKS_TRACING__OTLP_ENDPOINT": "https://otel.example:4318/"})
    assert s.tracing.enabled and s.tracing.sample_ratio == 0.01
    assert s.tracing.traces_url == "https://otel.example:4318/v1/traces"
    assert for_taskmanagers(s).tracing == s.tracing


@pytest.mark.parametrize(("name", "value"), [("SAMPLE_RATIO", "1.5"), ("SAMPLE_RATIO", "-0.1"),
                                             ("OTLP_ENDPOINT", "127.0.0.1:4318"), ("EXPORT_DELAY_MS", "0")])
def test_a_bad_value_fails_at_start_up_naming_the_setting(name: str, value: str) -> None:
    with pytest.raises(ValidationError, match=name.lower()):
        settings_with({f"WEBHOOKS_TRACING__{name}": value})
