"""The operator's background loop: coalesced wake-ups must still start every coroutine once."""

from __future__ import annotations

import asyncio
import threading

import pytest

from operators.async_runtime import AsyncRuntime


async def _echo(i: int) -> int:
    await asyncio.sleep(0)
    return i


async def _boom() -> None:
    raise ValueError("boom")


def test_every_submitted_coroutine_runs_once_with_its_own_result() -> None:
    rt = AsyncRuntime("test-io")
    try:
        futures = [rt.submit(_echo(i)) for i in range(500)]
        futures += rt.submit_all([_echo(i) for i in range(500, 1000)])
        assert [f.result(timeout=10) for f in futures] == list(range(1000))
    finally:
        rt.close()


def test_submissions_from_several_threads_are_not_lost() -> None:
    rt = AsyncRuntime("test-io")
    results: list[list[int]] = [[] for _ in range(4)]

    def worker(n: int) -> None:
        futures = [rt.submit(_echo(n * 1000 + i)) for i in range(300)]
        results[n] = [f.result(timeout=10) for f in futures]

    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [[n * 1000 + i for i in range(300)] for n in range(4)]
    finally:
        rt.close()


def test_an_exception_reaches_the_caller() -> None:
    rt = AsyncRuntime("test-io")
    try:
        with pytest.raises(ValueError, match="boom"):
            rt.call(_boom(), timeout=5)
    finally:
        rt.close()
