"""Render the Kafka Connect worker and Debezium connector properties from the settings, or check
that the connector and its task run.

``python -m stack.connect_config render DIR`` writes DIR/worker.properties and
DIR/outbox-connector.properties from stack/conf/ templates; ``python -m stack.connect_config
--check`` exits 0 once the worker's REST API reports the connector and its task RUNNING (and 2
with the task's trace if the task FAILED, so start-up stops waiting at once).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from core.settings import Settings, load_settings

CONF = Path(__file__).resolve().parent / "conf"
CONNECTOR = "webhooks-outbox"


def render(settings: Settings, out: Path, flush_ms: int) -> None:
    pg = conninfo_to_dict(settings.outbox.dsn)
    marks = {
        "__BOOTSTRAP__": settings.kafka.bootstrap_servers,
        "__REST_PORT__": str(settings.outbox.connect_rest_port),
        "__DIR__": str(out),
        "__FLUSH_MS__": str(flush_ms),
        "__PG_HOST__": str(pg.get("host", "127.0.0.1")),
        "__PG_PORT__": str(pg.get("port", "5432")),
        "__PG_USER__": str(pg.get("user", "webhooks")),
        "__PG_DB__": str(pg.get("dbname", "webhooks")),
        "__SLOT__": settings.outbox.slot_name,
        "__PUBLICATION__": settings.outbox.publication_name,
        "__EVENTS_TOPIC__": settings.kafka.events_topic,
    }
    for template, name in (("connect-worker.properties", "worker.properties"),
                           ("debezium-outbox.properties", "outbox-connector.properties")):
        text = (CONF / template).read_text()
        for mark, value in marks.items():
            text = text.replace(mark, value)
        if "password" in pg:  # never in a template, never in git; the rendered file is 0600
            text += f"database.password={pg['password']}\n"
        if name == "worker.properties":
            # The relay's producer finds a dead broker's partitions as every platform client does.
            text += "".join(f"producer.{key}={value}\n" for key, value in settings.kafka.java_failover().items())
        path = out / name
        path.write_text(text)
        path.chmod(0o600)


def connector_state(rest_port: int) -> tuple[str, str, str]:
    """(connector state, task state, task trace) from the worker's REST API."""
    url = f"http://127.0.0.1:{rest_port}/connectors/{CONNECTOR}/status"
    with urllib.request.urlopen(url, timeout=3) as resp:
        status = json.load(resp)
    tasks = status.get("tasks") or [{}]
    return status["connector"]["state"], tasks[0].get("state", "NONE"), tasks[0].get("trace", "")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["render", "check"])
    p.add_argument("dir", nargs="?")
    args = p.parse_args()
    settings = load_settings()
    if args.command == "render":
        render(settings, Path(args.dir), int(os.environ.get("WEBHOOKS_CONNECT_FLUSH_MS", "10000")))
        return 0
    try:
        conn, task, trace = connector_state(settings.outbox.connect_rest_port)
    except Exception as exc:  # not up yet
        print(f"connect not ready: {exc}", file=sys.stderr)
        return 1
    if task == "FAILED" or conn == "FAILED":
        print(f"connector {conn}, task {task}:\n{trace}", file=sys.stderr)
        return 2
    return 0 if (conn, task) == ("RUNNING", "RUNNING") else 1


if __name__ == "__main__":
    sys.exit(main())
