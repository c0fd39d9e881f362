"""Observability on the real stack: a delivery job of its own is driven through
successes, 500s, a hanging endpoint, a 429 storm and a tenant throttled to one request at a time;
then the stack's real Prometheus (fed by Flink's reporter through the Pushgateway) is asked, over
its HTTP API, whether each series exists and moves the right way, whether the first-attempt alert
fires and clears, and whether the health page renders its charts in a real headless Chromium.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from control_plane.history import stats
from control_plane.rpc.api import pb, rpc
from core.records import delivery_id_for
from core.settings import REPO_ROOT, Settings, load_settings
from tests.support.faults import wait_all_reached
from tests.support.helpers import auth, create_endpoints, event, eventually, new_tenant, produce
from tests.support.stack_fixtures import second_stack

pytestmark = pytest.mark.integration

PROM = "http://127.0.0.1:9090"
OP = "flink_taskmanager_job_task_operator_"


def values(promql: str) -> list[tuple[dict[str, str], float]]:
    return [(s["metric"], float(s["value"][1])) for s in stats.query(PROM, promql)]


def value(promql: str) -> float | None:
    got = values(promql)
    assert len(got) <= 1, f"{promql} has {len(got)} series"
    return got[0][1] if got else None


class Obs:
    def __init__(self, settings: Settings, channel: grpc.Channel, receiver: Any) -> None:
        self.settings, self.channel, self.receiver = settings, channel, receiver
        self.job = settings.flink.job_name
        self.sel = f'job_name="{self.job}"'
        self.failing_ep = ""

    def tenant(self, n: int, behaviour: str | None, prefix: str) -> tuple[str, list[str]]:
        tenant_id, key = new_tenant(self.channel, self.settings)
        paths = [f"/obs/{prefix}-{tenant_id}-{i}" for i in range(n)]
        if behaviour:
            for path in paths:
                self.receiver.set_behaviour(path, behaviour)
        # Concurrently: each create is answered a config lease after its publish.
        return tenant_id, create_endpoints(self.channel, key, [f"{self.receiver.base_url}{p}" for p in paths],
                                           ["order.*"])

    def send(self, tenant_id: str, n: int) -> list[str]:
        events = [event(tenant_id, "order.created", b'{"n":1}') for _ in range(n)]
        produce(self.settings, [e.to_json() for e in events], keys=[e.event_id for e in events])
        return [e.event_id for e in events]

    def op(self, metric: str, extra: str = "") -> float | None:
        """The job's raw counter or gauge, summed over its operator instances."""
        return value(f"sum({OP}{metric}{{{self.sel}{extra}}})")


@pytest.fixture(scope="module")
def obs(job_env: dict[str, str], receiver: Any) -> Iterator[Obs]:
    overrides = {
        # One request in flight per tenant: the throttled tenant's backlog is the platform's lag.
        "WEBHOOKS_DISPATCH__TENANT_MAX_IN_FLIGHT": "1",
        # A failing endpoint stays open long enough to be seen, and keeps retrying.
        "WEBHOOKS_DISPATCH__BREAKER_OPEN_S": "60",
        "WEBHOOKS_DISPATCH__MAX_ATTEMPTS": "20",
        "WEBHOOKS_DISPATCH__RETRY_BASE_S": "1",
        "WEBHOOKS_DISPATCH__RETRY_CAP_S": "2",
        "WEBHOOKS_DISPATCH__PER_ENDPOINT_METRICS": "true",  # for stats' top failing endpoints
    }
    with second_stack(job_env, "obs", overrides) as (settings, address, _session):
        channel = grpc.insecure_channel(address)
        yield Obs(settings, channel, receiver)
        channel.close()


def test_the_job_series_move_the_right_way_and_the_alert_fires_and_clears(obs: Obs) -> None:
    # -- successes: the first-attempt histogram counts every delivery, all within 10 s ------------
    ok_tenant, (ok_ep,) = obs.tenant(1, None, "ok")
    ok_ids = obs.send(ok_tenant, 5)
    wait_all_reached(obs.receiver, {delivery_id_for(e, ok_ep) for e in ok_ids}, timeout=60)
    eventually(lambda: obs.op("first_attempt_le_ms_first_attempts", ',first_attempt_le_ms="inf"') == 5 or None,
               timeout=60, what="5 first attempts in the histogram's +Inf bucket")
    assert obs.op("deliveries_created") == 5
    assert obs.op("first_attempt_le_ms_first_attempts", ',first_attempt_le_ms="10000"') == 5
    assert obs.op("status_class_attempts", ',status_class="2xx"') == 5
    assert obs.op("fanout_lag_le_ms_events", ',fanout_lag_le_ms="inf"') == 5

    bad_tenant, (obs.failing_ep,) = obs.tenant(1, "500", "fail")
    obs.send(bad_tenant, 6)
    # -- a throttled tenant: its backlog waits for its single slot, long enough for the alert to
    # fire (the age past 10 s for its `for:` of 10 s, behind the reporter, scrape and rule
    # intervals) -- so it drains while the failing, hanging and storming endpoints below are
    # observed, and the alert is checked afterwards in Prometheus's own record of it. Sent after
    # the failing endpoint's events, its deliveries are younger than that endpoint's retries:
    # they cannot move the oldest-retry age watched below.
    slow_tenant, slow_eps = obs.tenant(30, "slow 1.5", "slow")
    slow_sent = time.time()
    slow_ids = obs.send(slow_tenant, 1)
    firing = f'ALERTS{{alertname="FirstAttemptObjectiveMissed",alertstate="firing",{obs.sel}}}'
    eventually(lambda: (obs.op("tenants_at_quota") or 0) >= 1 or None, timeout=30, what="a tenant at its quota")

    # -- a failing endpoint: 5xx attempts, its breaker opens, its oldest retry keeps ageing --------
    eventually(lambda: value(f"webhooks:breakers_open{{{obs.sel}}}") == 1 or None, timeout=90,
               what="the breaker-open gauge at 1")
    # The dispatcher refreshes its gauges and publishes its counts on their own clocks (up to a
    # second apart), and the reporter pushes every 5 s: the breaker can be seen open one push
    # before the 5xx attempts that opened it.
    eventually(lambda: (obs.op("status_class_attempts", ',status_class="5xx"') or 0) >= 5 or None, timeout=30,
               what="the 5xx attempts that opened the breaker")
    first = eventually(lambda: value(f"webhooks:oldest_retry_age_seconds{{{obs.sel}}}"), timeout=30,
                       what="an oldest-retry age")
    eventually(lambda: (value(f"webhooks:oldest_retry_age_seconds{{{obs.sel}}}") or 0) >= first + 10 or None,
               timeout=60, what="the oldest retry age to rise while the endpoint fails")
    assert (value(f"webhooks:oldest_parked_new_age_seconds{{{obs.sel}}}") or 0) >= 0  # series exists
    assert value(f"webhooks:endpoints_parked{{{obs.sel}}}") == 1

    # -- a hanging endpoint and a 429 storm: timeouts and 4xx, retried ----------------------------
    hang_tenant, _ = obs.tenant(1, "hang", "hang")
    storm_tenant, _ = obs.tenant(3, "retry_after 429 1", "storm")
    obs.send(hang_tenant, 1)
    obs.send(storm_tenant, 4)
    eventually(lambda: (obs.op("status_class_attempts", ',status_class="timeout"') or 0) >= 1 or None,
               timeout=90, what="a timeout attempt")
    eventually(lambda: (obs.op("status_class_attempts", ',status_class="4xx"') or 0) >= 12 or None,
               timeout=90, what="the 429 storm's attempts")
    assert (obs.op("retried") or 0) >= 12

    # -- the throttled tenant drained: the alert fired meanwhile, and clears ----------------------
    wait_all_reached(obs.receiver, {delivery_id_for(e, ep) for e in slow_ids for ep in slow_eps}, timeout=120)
    assert (obs.op("throttled_slots") or 0) >= 1

    def fired_since_the_backlog() -> list[tuple[dict[str, str], float]] | None:
        return values(f"max_over_time({firing}[{int(time.time() - slow_sent) + 5}s])") or None

    eventually(fired_since_the_backlog, timeout=90, interval=2, what="FirstAttemptObjectiveMissed firing")
    eventually(lambda: not values(firing) or None, timeout=90, interval=2, what="the alert to clear")

    # 54 deliveries so far, and retries of the hanging and storming ones (the breakers soon stop
    # most of them): more requests than deliveries, in the raw counters and in the rule.
    # (Eventually: the storm's 429s are counted the moment they are answered, their retries a
    # Retry-After later.)
    eventually(lambda: (obs.op("attempts") or 0) > (obs.op("deliveries_created") or 0) or None,
               timeout=60, what="more attempts than deliveries")
    eventually(lambda: (value(f"webhooks:retry_amplification:15m{{{obs.sel}}}") or 0) > 1.05 or None,
               timeout=60, what="retry amplification above 1.05")


def test_webhookctl_stats_and_the_health_page_show_the_job(obs: Obs, tmp_path: Any) -> None:
    out = subprocess.run([str(REPO_ROOT / ".venv/bin/webhookctl"), "stats", "--job", obs.job],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"job {obs.job}" in out.stdout and "first attempt" in out.stdout and "breakers open" in out.stdout
    top = next(line for line in out.stdout.splitlines() if "top failing" in line)
    assert obs.failing_ep and obs.failing_ep in top, out.stdout

    chromium = shutil.which("chromium")
    assert chromium, "chromium not installed: make setup installs it"
    url = f"{PROM}/consoles/webhooks.html?job={obs.job}"
    shot = REPO_ROOT / ".run" / "observability" / "health.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + str(tmp_path),
            "--virtual-time-budget=15000", "--window-size=1100,1400"]
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True, timeout=120)
    assert f">{obs.job}</a>" in dom, "the summary table has no row for the job"
    for chart in ("ages", "attempts", "latency", "pending"):
        part = dom.split(f'id="{chart}"', 1)[1].split('class="chart"', 1)[0]
        assert "<svg" in part and "<path" in part, f"chart {chart} drew no line"
    assert shot.exists() and shot.stat().st_size > 10_000


def test_the_control_plane_exports_rpc_counts_and_loop_health() -> None:
    """The stack's control plane (stack/control_plane.sh) is scraped too: a refused call is
    counted with its status code, and the config clock's last publish is recent."""
    stack = load_settings()
    before = value('sum(webhooks_cp_rpc_total{method="ListEndpoints",code="UNAUTHENTICATED"})') or 0
    with grpc.insecure_channel(f"127.0.0.1:{stack.control_plane.port}") as ch, pytest.raises(grpc.RpcError):
        rpc.ControlPlaneStub(ch).ListEndpoints(pb.ListEndpointsRequest(), metadata=auth("not-a-key"))
    eventually(lambda: (value('sum(webhooks_cp_rpc_total{method="ListEndpoints",code="UNAUTHENTICATED"})') or 0)
               > before or None, timeout=30, what="the refused call counted")
    lag = value('time() - webhooks_cp_loop_last_success_timestamp_seconds{loop="config-clock"}')
    assert lag is not None and lag < 15
    assert value('sum(webhooks_cp_rpc_seconds_count{method="ListEndpoints"})')
