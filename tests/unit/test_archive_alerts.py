"""The archiver's alerts (stack/conf/prometheus-rules.yml) fire on what the archiver pushes, checked
by Prometheus's own rule tester (promtool, from the Debian package the stack installs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from core.settings import REPO_ROOT

RULES = REPO_ROOT / "stack/conf/prometheus-rules.yml"

TESTS = f"""
rule_files: [{RULES}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'webhooks_archive_failed_hours{{job="webhooks_archiver"}}'
        values: '0 0 1 1'
      - series: 'webhooks_archive_last_run_ok{{job="webhooks_archiver"}}'
        values: '1 1 1 0'
    alert_rule_test:
      - eval_time: 1m
        alertname: ArchiveVerificationFailed
        exp_alerts: []
      - eval_time: 2m
        alertname: ArchiveVerificationFailed
        exp_alerts:
          - exp_labels: {{severity: ticket, job: webhooks_archiver}}
            exp_annotations:
              summary: "1 archive hour(s) failed verification and stay in Cassandra"
      - eval_time: 2m
        alertname: ArchiverFailing
        exp_alerts: []
      - eval_time: 3m
        alertname: ArchiverFailing
        exp_alerts:
          - exp_labels: {{severity: ticket, job: webhooks_archiver}}
            exp_annotations:
              summary: "the last archiver run failed; history stays hot until a run completes"
"""

# Two shards pushing hourly from t=0; shard 0 stops after its first run. Eval times are seconds
# since the series start, as time() is.
STALE = f"""
rule_files: [{RULES}]
evaluation_interval: 1m
tests:
  - interval: 1h
    input_series:
      - series: 'webhooks_archive_last_run_timestamp_seconds{{job="webhooks_archiver", shard="0-of-2"}}'
        values: '0x5'
      - series: 'webhooks_archive_last_run_timestamp_seconds{{job="webhooks_archiver", shard="1-of-2"}}'
        values: '0+3600x5'
    alert_rule_test:
      - eval_time: 3h
        alertname: ArchiverStale
        exp_alerts: []
      - eval_time: 3h1m
        alertname: ArchiverStale
        exp_alerts:
          - exp_labels: {{severity: ticket, job: webhooks_archiver, shard: 0-of-2}}
            exp_annotations:
              summary: "archiver shard 0-of-2 last finished a run 3h 1m 0s ago"
      - eval_time: 5h
        alertname: ArchiverStale
        exp_alerts:
          - exp_labels: {{severity: ticket, job: webhooks_archiver, shard: 0-of-2}}
            exp_annotations:
              summary: "archiver shard 0-of-2 last finished a run 5h 0m 0s ago"
"""


def promtool(spec: Path, tests: str) -> None:
    spec.write_text(tests)
    run = subprocess.run(["promtool", "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_archive_alerts_fire_on_the_archivers_gauges(tmp_path: Path) -> None:
    promtool(tmp_path / "archive_alerts_test.yml", TESTS)


def test_a_shard_that_stopped_pushing_is_stale_after_3_hours_and_its_peer_is_not(tmp_path: Path) -> None:
    promtool(tmp_path / "archiver_stale_test.yml", STALE)
