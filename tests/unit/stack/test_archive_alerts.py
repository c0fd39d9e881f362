"""The archive tier's alerts (stack/conf/prometheus-rules.yml) fire on what the archive writer and
the audit push, checked by Prometheus's own rule tester (promtool, from the Debian package the
stack installs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from core.settings import REPO_ROOT

RULES = REPO_ROOT / "stack/conf/prometheus-rules.yml"

AUDIT = f"""
rule_files: [{RULES}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'webhooks_archive_failed_hours{{job="webhooks_archive_audit"}}'
        values: '0 0 1 1'
      - series: 'webhooks_archive_last_audit_ok{{job="webhooks_archive_audit"}}'
        values: '1 1 1 0'
    alert_rule_test:
      - eval_time: 1m
        alertname: ArchiveAuditFailed
        exp_alerts: []
      - eval_time: 2m
        alertname: ArchiveAuditFailed
        exp_alerts:
          - exp_labels: {{severity: page, job: webhooks_archive_audit}}
            exp_annotations:
              summary: "1 archive hour(s) failed their audit: recover them before their hot rows expire"
      - eval_time: 2m
        alertname: ArchiveAuditFailing
        exp_alerts: []
      - eval_time: 3m
        alertname: ArchiveAuditFailing
        exp_alerts:
          - exp_labels: {{severity: ticket, job: webhooks_archive_audit}}
            exp_annotations:
              summary: "the last archive audit run failed"
"""

# The writer pushes every 15 s; its lag grows by 1 s a second through an object-store outage.
LAG = f"""
rule_files: [{RULES}]
evaluation_interval: 1m
tests:
  - interval: 1h
    input_series:
      - series: 'webhooks_archive_writer_lag_seconds{{job="webhooks_archive_writer"}}'
        values: '0+3600x30'
    alert_rule_test:
      - eval_time: 6h
        alertname: ArchiveLagHigh
        exp_alerts: []
      - eval_time: 7h
        alertname: ArchiveLagHigh
        exp_alerts:
          - exp_labels: {{severity: ticket, job: webhooks_archive_writer}}
            exp_annotations:
              summary: "the archive is 7h 0m 0s behind the delivery job (budget: the hot TTL, 4 days)"
      - eval_time: 25h
        alertname: ArchiveLagCritical
        exp_alerts:
          - exp_labels: {{severity: page, job: webhooks_archive_writer}}
            exp_annotations:
              summary: "the archive is 1d 1h 0m 0s behind the delivery job (budget: the hot TTL, 4 days)"
"""

# A writer that stopped pushing: last seen at t=0.
DOWN = f"""
rule_files: [{RULES}]
evaluation_interval: 1m
tests:
  - interval: 5m
    input_series:
      - series: 'push_time_seconds{{job="webhooks_archive_writer"}}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 15m
        alertname: ArchiveWriterDown
        exp_alerts: []
      - eval_time: 20m
        alertname: ArchiveWriterDown
        exp_alerts:
          - exp_labels: {{severity: ticket, job: webhooks_archive_writer}}
            exp_annotations:
              summary: "the archive writer last reported 20m 0s ago"
"""


def promtool(spec: Path, tests: str) -> None:
    spec.write_text(tests)
    run = subprocess.run(["promtool", "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_audit_alerts_fire_on_the_audits_gauges(tmp_path: Path) -> None:
    promtool(tmp_path / "archive_audit_test.yml", AUDIT)


def test_a_writer_falling_behind_raises_a_ticket_after_6_hours_and_a_page_after_a_day(tmp_path: Path) -> None:
    promtool(tmp_path / "archive_lag_test.yml", LAG)


def test_a_writer_that_stopped_reporting_is_down_after_15_minutes(tmp_path: Path) -> None:
    promtool(tmp_path / "archive_down_test.yml", DOWN)
