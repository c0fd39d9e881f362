"""The local stack's tracing parts: Jaeger's configuration binds every listener to 127.0.0.1,
TRACING=1 is remembered and reaches what the scripts start, the outbox connector copies the
traceparent into a Kafka header, and the job ships every package it imports (tracing included)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from core.settings import REPO_ROOT

STACK = REPO_ROOT / "stack"


def _rendered() -> dict[str, Any]:
    text = (STACK / "conf/jaeger.yaml").read_text()
    marks = {m for line in text.splitlines() if not line.lstrip().startswith("#")
             for m in re.findall(r"__[A-Z_]+__", line)}
    filled = set(re.findall(r"s#(__[A-Z_]+__)#", (STACK / "jaeger.sh").read_text()))
    assert marks == filled, "every mark of the template is filled by jaeger.sh"
    for i, mark in enumerate(sorted(marks)):
        text = text.replace(mark, str(20000 + i))
    return dict(yaml.safe_load(text))


def _walk(node: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [item for k, v in node.items() for item in _walk(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [item for i, v in enumerate(node) for item in _walk(v, f"{path}[{i}]")]
    return [(path, node)]


def test_every_jaeger_listener_binds_loopback() -> None:
    config = _rendered()
    leaves = _walk(config)
    endpoints = {p: v for p, v in leaves if p.endswith(".endpoint")}
    hosts = {p: v for p, v in leaves if p.endswith(".host")}
    assert set(endpoints) == {".extensions.jaeger_query.http.endpoint", ".extensions.jaeger_query.grpc.endpoint",
                              ".extensions.healthcheckv2.http.endpoint", ".receivers.otlp.protocols.grpc.endpoint",
                              ".receivers.otlp.protocols.http.endpoint"}
    assert all(str(v).startswith("127.0.0.1:") for v in endpoints.values()), endpoints
    assert set(hosts.values()) == {"127.0.0.1"}  # the collector's own metrics
    # Only components whose every listener is named above: no Jaeger or Zipkin receiver, no
    # zpages, pprof, expvar or remote sampling (each listens on a default port of its own).
    service = config["service"]
    assert service["pipelines"]["traces"]["receivers"] == ["otlp"]
    assert set(service["extensions"]) == {"jaeger_storage", "jaeger_query", "healthcheckv2"}
    assert set(config["receivers"]) == {"otlp"}
    assert "grpc" not in config["extensions"]["healthcheckv2"]


def _shell(run_dir: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOKS_") and k != "TRACING"}
    return subprocess.run(["bash", "-c", f'source "{STACK}/lib.sh"; {script}'], capture_output=True, text=True,
                          timeout=30, env={**base, "WEBHOOKS_RUN_DIR": str(run_dir), **env})


def _applied(run_dir: Path, **env: str) -> str:
    out = _shell(run_dir, 'tracing_apply; echo "$WEBHOOKS_TRACING__ENABLED"', **env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_tracing_1_is_remembered_until_tracing_0(tmp_path: Path) -> None:
    assert _applied(tmp_path) == "false"
    assert _shell(tmp_path, "record_tracing", TRACING="1").returncode == 0
    assert _applied(tmp_path) == "true"  # a later `make job` or restart, without TRACING
    assert _applied(tmp_path, TRACING="0") == "false"
    assert _applied(tmp_path, WEBHOOKS_TRACING__ENABLED="false") == "false"  # a run's own choice wins
    assert _shell(tmp_path, "record_tracing", TRACING="0").returncode == 0
    assert _applied(tmp_path) == "false"
    assert _applied(tmp_path, WEBHOOKS_TRACING__ENABLED="true") == "true"


def test_tracing_takes_only_1_or_0(tmp_path: Path) -> None:
    out = _shell(tmp_path, "true", TRACING="yes")
    assert out.returncode != 0 and "TRACING must be 1 (on) or 0 (off)" in out.stderr


def test_the_connector_copies_the_rows_traceparent_into_a_header_and_keys_by_event_id() -> None:
    props = dict(line.split("=", 1) for line in (STACK / "conf/debezium-outbox.properties").read_text().splitlines()
                 if line and not line.startswith("#"))
    assert props["message.key.columns"] == "public.webhook_outbox:event_id,traceparent"
    assert props["transforms"].split(",") == ["trace", "key", "route"]  # the header first, then the key's unwrap
    assert props["transforms.trace.type"] == "org.apache.kafka.connect.transforms.HeaderFrom$Key"
    assert (props["transforms.trace.fields"], props["transforms.trace.headers"]) == ("traceparent", "traceparent")
    assert props["transforms.trace.operation"] == "copy"
    assert props["transforms.key.field"] == "event_id"


IMPORTED = """
import importlib, sys
from pathlib import Path
root = Path(sys.argv[1])
importlib.import_module("jobs.delivery_job")
tops = set()
for mod in list(sys.modules.values()):
    f = getattr(mod, "__file__", None)
    if not f:
        continue
    try:
        rel = Path(f).relative_to(root)
    except ValueError:
        continue
    if len(rel.parts) > 1 and not rel.parts[0].startswith(".") and (root / rel.parts[0] / "__init__.py").exists():
        tops.add(rel.parts[0])
print(" ".join(sorted(tops)))
"""


def test_the_job_ships_every_package_of_the_repository_it_imports() -> None:
    shipped = re.search(r'-pyfs "([^"]+)"', (STACK / "job.sh").read_text())
    assert shipped is not None
    packages = {Path(p.replace("$REPO/", "")).name for p in shipped.group(1).split(",")}
    out = subprocess.run([sys.executable, "-c", IMPORTED, str(REPO_ROOT)], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    imported = set(out.stdout.split())
    assert {"core", "operators", "jobs", "tracing"} <= imported
    assert imported <= packages, f"imported by the job but not shipped with -pyfs: {imported - packages}"
