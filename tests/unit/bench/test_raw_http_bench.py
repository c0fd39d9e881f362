"""bench.raw_http: its pure helpers, and one short bounded run against the recording receiver."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path

import pytest

from bench.raw_http import check_loopback, make_body, percentile, run
from stack.certs import ensure_certs
from tests.support.receiver import Receiver


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([], 50, 0.0),
        ([1.0], 99, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([float(i) for i in range(1, 101)], 99, 99.0),
    ],
)
def test_percentile_nearest_rank(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == expected


def test_body_is_json_of_the_exact_size() -> None:
    body = make_body(1536)
    assert len(body) == 1536
    assert json.loads(body)["type"] == "bench.raw_http"


@pytest.mark.parametrize("url", ["https://example.com/x", "http://10.0.0.1:80/", "https://receiver.test/"])
def test_refuses_non_loopback(url: str) -> None:
    with pytest.raises(ValueError, match="non-loopback"):
        check_loopback(url)


def test_bounded_run_against_the_receiver(tmp_path: Path) -> None:
    paths, _ = ensure_certs(tmp_path)
    with Receiver(record="count") as rx:
        base = rx.start(certfile=paths.server_chain, keyfile=paths.server_key)
        ctx = ssl.create_default_context(cafile=str(paths.ca_cert))
        result = asyncio.run(run(f"{base}/ep/bench", ctx, 8, 10.0, 200, make_body(1536)))
        assert (result.ok, result.errors, result.non_2xx) == (200, 0, 0)
        assert result.per_second > 0 and len(result.latencies_s) == 200
        recs = rx.wait_for("/ep/bench", 200, timeout=5)
        assert len({r.webhook_id for r in recs}) == 200
        assert result.lines()[0].startswith("raw_http_per_s=")
        # Here the receiver shares the process, so the figure is only checked to be measured.
        assert result.client_cpu_s > 0 and result.lines()[-1].startswith("client_cpu_ms_per_request=")
