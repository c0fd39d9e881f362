"""The archive tier's budget, checked when the settings load (core/settings.py, core/archive_settings.py):
the facts topic keeps facts at least as long as the hot rows live, attempt rows outlive the retry
deadline, and the audit looks at an hour while its rows are still hot enough to repair it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.settings import Settings

DAY = 86_400


@pytest.fixture()
def settings(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    def load(**env: str) -> Settings:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        return Settings()
    return load


def test_the_defaults_hold_the_budget(settings):
    s = settings()
    assert s.archive.stream and s.archive.hot_ttl_s == 4 * DAY
    assert s.kafka.archive_facts_retention_ms >= s.archive.hot_ttl_s * 1000
    assert s.archive.hot_ttl_s > s.dispatch.retry_deadline_s


@pytest.mark.parametrize("env, message", [
    ({"WEBHOOKS_KAFKA__ARCHIVE_FACTS_RETENTION_MS": str(3 * DAY * 1000)}, "shorter than archive.hot_ttl_s"),
    ({"WEBHOOKS_ARCHIVE__HOT_TTL_S": str(DAY), "WEBHOOKS_ARCHIVE__AUDIT_AFTER_S": "3600"},
     "must exceed dispatch.retry_deadline_s"),
    ({"WEBHOOKS_ARCHIVE__AUDIT_AFTER_S": str(4 * DAY)}, "by at least 12 h"),
    ({"WEBHOOKS_ARCHIVE__HOT_TTL_S": str(31 * DAY)}, "exceeds cassandra.history_ttl_s"),
])
def test_a_budget_that_could_expire_rows_unarchived_is_refused_at_start_up(settings, env, message):
    with pytest.raises(ValidationError, match=message):
        settings(**env)


def test_without_the_stream_the_hot_tier_keeps_everything_and_no_budget_applies(settings):
    s = settings(WEBHOOKS_ARCHIVE__STREAM="false", WEBHOOKS_KAFKA__ARCHIVE_FACTS_RETENTION_MS="1000")
    assert not s.archive.stream
