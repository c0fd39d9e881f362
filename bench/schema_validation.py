"""Cost of validating one event against its schema: fastjsonschema vs jsonschema (2020-12).

    .venv/bin/python -m bench.schema_validation [--body-bytes 1536] [--n 20000]

The payload is the bench's (bench.raw_http.make_body: ``{"type": ..., "data": "xxx..."}``) and the
schema one a tenant would publish for it. Each figure is per event and includes ``json.loads`` of
the payload bytes, which the job must do to validate (the bytes stay what is sent). The compile
cost is paid once per schema version (core.event_schemas.ValidatorCache).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import fastjsonschema

from bench import raw_http
from core.event_schemas import compile_validator

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"type": {"type": "string", "enum": ["bench.raw_http"]}, "data": {"type": "string"}},
    "required": ["type", "data"],
    "additionalProperties": False,
}


def per_call_us(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(3):  # best of three: the machine is shared with the running stack
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def measure(body: bytes, n: int) -> list[tuple[str, float]]:
    """(what, microseconds per call) on ``body`` and a variant failing the schema."""
    invalid_body = body.replace(b'"type":"bench.raw_http"', b'"type":"bench.other"')

    fast = fastjsonschema.compile(SCHEMA)
    kept = compile_validator(SCHEMA)
    assert kept(json.loads(body)) is None and kept(json.loads(invalid_body)) is not None

    def fast_check(raw: bytes) -> object:
        try:
            return fast(json.loads(raw))
        except fastjsonschema.JsonSchemaValueException as exc:
            return exc

    return [
        ("json.loads only", per_call_us(lambda: json.loads(body), n)),
        ("fastjsonschema, valid", per_call_us(lambda: fast_check(body), n)),
        ("fastjsonschema, invalid", per_call_us(lambda: fast_check(invalid_body), n)),
        ("jsonschema 2020-12, valid", per_call_us(lambda: kept(json.loads(body)), n)),
        ("jsonschema 2020-12, invalid", per_call_us(lambda: kept(json.loads(invalid_body)), max(1, n // 10))),
        ("compile fastjsonschema", per_call_us(lambda: fastjsonschema.compile(SCHEMA), 50)),
        ("compile jsonschema", per_call_us(lambda: compile_validator(SCHEMA), 500)),
    ]


def report_line(body: bytes, n: int = 5_000) -> str:
    """The bench report's line: what fan-out's schema check costs per event of a catalogued tenant
    (parse + the kept validator), beside the faster library it does not use."""
    us = dict(measure(body, n))
    return (f"schema_check: payload_bytes={len(body)} per_event_us={us['jsonschema 2020-12, valid']:.1f} "
            f"(json.loads {us['json.loads only']:.1f} + jsonschema 2020-12; invalid "
            f"{us['jsonschema 2020-12, invalid']:.1f}) fastjsonschema_us={us['fastjsonschema, valid']:.1f} "
            "(not used: drafts 4-7 only)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--body-bytes", type=int, default=raw_http.DEFAULT_BODY_BYTES)
    ap.add_argument("--n", type=int, default=20_000)
    args = ap.parse_args()
    body = raw_http.make_body(args.body_bytes)
    print(f"schema validation, {len(body)} B payload, per call (best of 3, n={args.n}):")
    for name, us in measure(body, args.n):
        print(f"  {name:<30} {us:9.1f} us")
    print(report_line(body))


if __name__ == "__main__":
    main()
