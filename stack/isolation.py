"""Per-run isolation for tests and the benchmark: their own topics, consumer group and job name,
so they can run beside the `make run` job on the same stack without reading its records."""

from __future__ import annotations

import os

from core.settings import Settings


def isolated_env(run: str) -> dict[str, str]:
    """WEBHOOKS_* overrides naming everything a job and its control plane share after ``run``."""
    return {
        "WEBHOOKS_KAFKA__EVENTS_TOPIC": f"webhooks.events.{run}",
        "WEBHOOKS_KAFKA__ENDPOINTS_TOPIC": f"webhooks.endpoints.{run}",
        "WEBHOOKS_KAFKA__REPLAYS_TOPIC": f"webhooks.replays.{run}",
        "WEBHOOKS_KAFKA__DLQ_TOPIC": f"webhooks.events.dlq.{run}",
        "WEBHOOKS_KAFKA__SIGNALS_TOPIC": f"webhooks.endpoint-signals.{run}",
        "WEBHOOKS_KAFKA__CONSUMER_GROUP": f"webhooks-{run}",
        "WEBHOOKS_FLINK__JOB_NAME": f"webhooks-{run}",
    }


def settings_with(env: dict[str, str]) -> Settings:
    """Settings as a process started with these extra environment variables would see them."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return Settings()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
