"""How fast can plain aiohttp POST to a receiver? The ceiling any dispatcher here is measured against.

    python -m bench.raw_http --url https://127.0.0.1:8443/ep/bench --ca .run/certs/ca.pem \
        --concurrency 64 --duration 10 --count 200000

Sends 1.5 KB JSON bodies from `concurrency` workers over one keep-alive connection pool and stops
at whichever bound comes first: `count` requests started or `duration` seconds elapsed. Each
request carries a unique `webhook-id`, so a receiver in `--record count` mode can check delivery.
Prints key=value lines:

    raw_http_per_s=...     responses (any status) per second of wall time
    requests=... ok=... non_2xx=... errors=... elapsed_s=...
    latency_p50_ms=... latency_p99_ms=...
    client_cpu_ms_per_request=...   this process's CPU per response (aiohttp's own cost)
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import math
import ssl
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

DEFAULT_BODY_BYTES = 1536


@dataclass
class Result:
    elapsed_s: float = 0.0
    ok: int = 0
    non_2xx: int = 0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)
    # CPU (user + system) of this client process over the run: what aiohttp alone costs a
    # request, a floor under any dispatcher built on it (the receiver runs in its own process).
    client_cpu_s: float = 0.0

    @property
    def responses(self) -> int:
        return self.ok + self.non_2xx

    @property
    def client_cpu_ms_per_request(self) -> float:
        return self.client_cpu_s * 1000 / self.responses if self.responses else 0.0

    @property
    def per_second(self) -> float:
        return self.responses / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def lines(self) -> list[str]:
        lat = sorted(self.latencies_s)
        p50_ms, p99_ms = percentile(lat, 50) * 1000, percentile(lat, 99) * 1000
        return [
            f"raw_http_per_s={self.per_second:.0f}",
            f"requests={self.responses + self.errors} ok={self.ok} non_2xx={self.non_2xx} "
            f"errors={self.errors} elapsed_s={self.elapsed_s:.3f}",
            f"latency_p50_ms={p50_ms:.2f} latency_p99_ms={p99_ms:.2f}",
            f"client_cpu_ms_per_request={self.client_cpu_ms_per_request:.3f}",
        ]


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values; 0.0 when there are none."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def make_body(n_bytes: int) -> bytes:
    """A JSON object of exactly n_bytes (at least the size of its frame)."""
    frame = b'{"type":"bench.raw_http","data":""}'
    if n_bytes < len(frame):
        raise ValueError(f"body must be at least {len(frame)} bytes")
    return frame[:-2] + b"x" * (n_bytes - len(frame)) + frame[-2:]


def check_loopback(url: str) -> None:
    """Benchmarks talk to 127.0.0.1 only; refuse anything else before sending a byte."""
    host = urlsplit(url).hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ValueError(f"refusing non-loopback URL {url!r}: benchmarks run against 127.0.0.1 only")


async def run(
    url: str,
    ssl_ctx: ssl.SSLContext | None,
    concurrency: int,
    duration_s: float,
    count: int,
    body: bytes,
    timeout_s: float = 10.0,
) -> Result:
    check_loopback(url)
    result = Result()
    started = 0
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=ssl_ctx if ssl_ctx is not None else True)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        begin = time.perf_counter()
        cpu_begin = time.process_time()
        deadline = begin + duration_s

        async def worker() -> None:
            nonlocal started
            while started < count and time.perf_counter() < deadline:
                n = started
                started += 1
                headers = {"content-type": "application/json", "webhook-id": f"msg_bench_{n}"}
                t0 = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=headers, allow_redirects=False) as resp:
                        await resp.read()
                        code = resp.status
                except (aiohttp.ClientError, TimeoutError):
                    result.errors += 1
                    continue
                result.latencies_s.append(time.perf_counter() - t0)
                if 200 <= code < 300:
                    result.ok += 1
                else:
                    result.non_2xx += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.elapsed_s = time.perf_counter() - begin
        result.client_cpu_s = time.process_time() - cpu_begin
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.raw_http", description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="receiver URL on 127.0.0.1")
    parser.add_argument("--ca", help="CA file to trust (the test CA's ca.pem) for https URLs")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0, help="stop after this many seconds")
    parser.add_argument("--count", type=int, default=200_000, help="stop after this many requests")
    parser.add_argument("--body-bytes", type=int, default=DEFAULT_BODY_BYTES)
    parser.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, seconds")
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.count < 1 or args.duration <= 0:
        parser.error("--concurrency and --count must be >= 1 and --duration > 0")
    try:
        check_loopback(args.url)
    except ValueError as e:
        parser.error(str(e))
    ssl_ctx = ssl.create_default_context(cafile=args.ca) if args.ca else None
    result = asyncio.run(
        run(
            args.url,
            ssl_ctx,
            args.concurrency,
            args.duration,
            args.count,
            make_body(args.body_bytes),
            args.timeout,
        )
    )
    print("\n".join(result.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
