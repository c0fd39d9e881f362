"""`webhookctl stats`: the delivery health of each job, from Prometheus' recording rules.

One instant query per series (stack/conf/prometheus-rules.yml names them), grouped by job_name,
rendered as a short terminal summary; the firing alerts come last. Reads Prometheus' HTTP API
only: no credential, nothing written.
"""

from __future__ import annotations

import json
import math
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

# What each line shows -> its recording rule. Every rule keeps job_name; status_class splits attempts.
QUERIES: dict[str, str] = {
    "created": "webhooks:deliveries_created:rate1m",
    "attempts": "webhooks:attempts:rate1m",
    "amplification": "webhooks:retry_amplification:15m",
    "success": "webhooks:success_ratio:5m",
    "p50": "webhooks:first_attempt_latency_seconds:p50",
    "p99": "webhooks:first_attempt_latency_seconds:p99",
    "oldest_new": "webhooks:oldest_new_age_seconds",
    "oldest_parked": "webhooks:oldest_parked_new_age_seconds",
    "oldest_retry": "webhooks:oldest_retry_age_seconds",
    "pending": "webhooks:pending_deliveries",
    "breakers_open": "webhooks:breakers_open",
    "parked": "webhooks:endpoints_parked",
    "at_quota": "webhooks:tenants_at_quota",
    "fanout_p99": "webhooks:fanout_lag_seconds:p99",
    "held": "webhooks:oldest_held_event_age_seconds",
}


class PrometheusError(RuntimeError):
    pass


def query(base_url: str, promql: str, timeout: float = 5.0) -> list[dict]:
    url = f"{base_url.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = json.load(resp)
    except OSError as exc:
        raise PrometheusError(f"Prometheus at {base_url} did not answer: {exc}") from exc
    if body.get("status") != "success":
        raise PrometheusError(f"Prometheus refused {promql!r}: {body.get('error')}")
    return list(body["data"]["result"])


# Only with dispatch.per_endpoint_metrics on (bounded series otherwise have no endpoint label).
TOP_FAILING = ("topk(5, sum by (job_name, endpoint_id) "
               "(flink_taskmanager_job_task_operator_endpoint_id_consecutive_failures) > 0)")
PENDING_BY_ENDPOINT = "sum by (job_name, endpoint_id) (flink_taskmanager_job_task_operator_endpoint_id_pending)"


@dataclass
class JobHealth:
    values: dict[str, float] = field(default_factory=dict)
    attempts: dict[str, float] = field(default_factory=dict)  # status class -> per second
    pending: dict[str, float] = field(default_factory=dict)  # new / retry
    # endpoint_id -> (consecutive failures, pending), worst first; None: per-endpoint series off
    failing: list[tuple[str, float, float]] | None = None


def collect(base_url: str, job: str | None = None) -> tuple[dict[str, JobHealth], list[str]]:
    """Every job's health, and the alerts firing now (one line each)."""
    jobs: dict[str, JobHealth] = defaultdict(JobHealth)
    for key, promql in QUERIES.items():
        for series in query(base_url, promql):
            labels, value = series["metric"], float(series["value"][1])
            name = labels.get("job_name", "?")
            if job is not None and name != job:
                continue
            if key == "attempts":
                jobs[name].attempts[labels.get("status_class", "?")] = value
            elif key == "pending":
                jobs[name].pending[labels.get("kind", "?")] = value
            else:
                jobs[name].values[key] = value
    per_endpoint = query(base_url, PENDING_BY_ENDPOINT)
    pending_by_ep = {(s["metric"].get("job_name"), s["metric"].get("endpoint_id")): float(s["value"][1])
                     for s in per_endpoint}
    if per_endpoint:
        for name in jobs:
            jobs[name].failing = []
        for series in query(base_url, TOP_FAILING):
            labels = series["metric"]
            name, ep = labels.get("job_name", "?"), labels.get("endpoint_id", "?")
            if name in jobs:
                jobs[name].failing = [*(jobs[name].failing or []),
                                      (ep, float(series["value"][1]), pending_by_ep.get((name, ep), 0.0))]
    alerts = [f"{a['metric'].get('alertname')} ({a['metric'].get('job_name') or a['metric'].get('kind', '')})"
              for a in query(base_url, 'ALERTS{alertstate="firing"}')]
    return dict(jobs), alerts


def _num(v: float | None, fmt: str = "{:.2f}", unit: str = "") -> str:
    if v is None or math.isnan(v):
        return "-"
    return fmt.format(v) + unit


def render(jobs: dict[str, JobHealth], alerts: list[str]) -> str:
    lines = [] if jobs else ["no delivery job has reported metrics yet (is it running? Flink pushes every 5 s)"]
    for name in sorted(jobs):
        h = jobs[name]
        v = h.values.get
        success = v("success")
        classes = "  ".join(f"{c} {r:.1f}" for c, r in sorted(h.attempts.items()) if r > 0) or "none"
        lines += [
            f"job {name}",
            f"  deliveries created   {_num(v('created'), '{:.1f}', '/s')}    attempts "
            f"{_num(sum(h.attempts.values()), '{:.1f}', '/s')} ({classes})",
            f"  retry amplification  {_num(v('amplification'))} requests/delivery (15 min)   "
            f"success {_num(success * 100 if success is not None else None, '{:.1f}', ' %')} (5 min)",
            f"  first attempt        p50 {_num(v('p50'), '{:.3f}', ' s')}   p99 {_num(v('p99'), '{:.3f}', ' s')}"
            f"   (objective: 10 s)",
            f"  oldest new           {_num(v('oldest_new'), '{:.1f}', ' s')}   behind parked endpoints "
            f"{_num(v('oldest_parked'), '{:.1f}', ' s')}   oldest retry {_num(v('oldest_retry'), '{:.1f}', ' s')}",
            f"  pending              new {_num(h.pending.get('new'), '{:.0f}')}   retry "
            f"{_num(h.pending.get('retry'), '{:.0f}')}   breakers open {_num(v('breakers_open'), '{:.0f}')}   "
            f"endpoints parked {_num(v('parked'), '{:.0f}')}   tenants at quota {_num(v('at_quota'), '{:.0f}')}",
            f"  fan-out lag p99      {_num(v('fanout_p99'), '{:.3f}', ' s')}   oldest held event "
            f"{_num(v('held'), '{:.1f}', ' s')}",
        ]
        if h.failing is None:
            lines.append("  top failing          (no per-endpoint series: they are on only with "
                         "WEBHOOKS_DISPATCH__PER_ENDPOINT_METRICS=true)")
        elif not h.failing:
            lines.append("  top failing          none")
        else:
            lines.append("  top failing          " + "; ".join(
                f"{ep} ({f:.0f} failures in a row, {p:.0f} pending)"
                for ep, f, p in sorted(h.failing, key=lambda x: -x[1])))
    lines.append("alerts firing: " + (", ".join(sorted(alerts)) if alerts else "none"))
    return "\n".join(lines)
