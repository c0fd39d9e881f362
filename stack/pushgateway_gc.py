"""Delete the Pushgateway groups of Flink processes that are gone.

Flink's reporter pushes each JobManager's and TaskManager's metrics every 5 s under
``webhooks-flink<random suffix>`` and deletes its group on a clean shutdown. A process that dies
(SIGKILL in a fault test, a crash) leaves its group behind for good: dead groups pile up, cost the
Pushgateway CPU (Prometheus scrapes them all; docs/performance-log.md, stale Pushgateway groups)
and leave their last values on the dashboards. `stack/flink.sh start` runs this; a
group is dead when its last push is older than ``--max-age-s``.

    python -m stack.pushgateway_gc [--url http://127.0.0.1:9091] [--max-age-s 120] [--prefix webhooks-flink]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.parse
import urllib.request


def stale_groups(url: str, prefix: str, max_age_s: float, now: float | None = None) -> list[str]:
    with urllib.request.urlopen(f"{url}/api/v1/metrics", timeout=5) as r:
        groups = json.load(r)["data"]
    now = time.time() if now is None else now
    out = []
    for g in groups:
        job = g.get("labels", {}).get("job", "")
        pushed = g.get("push_time_seconds", {}).get("metrics", [{}])[0].get("value")
        if job.startswith(prefix) and pushed is not None and now - float(pushed) > max_age_s:
            out.append(job)
    return out


def delete(url: str, job: str) -> None:
    req = urllib.request.Request(f"{url}/metrics/job/{urllib.parse.quote(job, safe='')}", method="DELETE")
    urllib.request.urlopen(req, timeout=5).close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=f"http://127.0.0.1:{os.environ.get('WEBHOOKS_PUSHGATEWAY_PORT', '9091')}")
    p.add_argument("--max-age-s", type=float, default=120.0)
    p.add_argument("--prefix", default="webhooks-flink")
    args = p.parse_args()
    jobs = stale_groups(args.url, args.prefix, args.max_age_s)
    for job in jobs:
        delete(args.url, job)
    if jobs:
        print(f"pushgateway: deleted {len(jobs)} group(s) of Flink processes that are gone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
