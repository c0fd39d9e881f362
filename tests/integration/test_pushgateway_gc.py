"""stack/pushgateway_gc.py against the stack's real Pushgateway: only groups of the given prefix
whose last push is older than the limit go."""

from __future__ import annotations

import os
import urllib.request
import uuid

import pytest

from stack.pushgateway_gc import delete, stale_groups
from tests.support.helpers import eventually

pytestmark = pytest.mark.integration

URL = f"http://127.0.0.1:{os.environ.get('WEBHOOKS_PUSHGATEWAY_PORT', '9091')}"


def push(job: str) -> None:
    body = b"# TYPE gc_test_metric gauge\ngc_test_metric 1\n"
    req = urllib.request.Request(f"{URL}/metrics/job/{job}", data=body, method="PUT")
    urllib.request.urlopen(req, timeout=5).close()


def test_stale_groups_of_the_prefix_are_deleted_and_nothing_else() -> None:
    prefix = f"gc-test-{uuid.uuid4().hex[:8]}"
    mine, other = f"{prefix}-tm", f"other-{prefix}"
    push(mine)
    push(other)
    try:
        assert stale_groups(URL, prefix, max_age_s=120) == []  # just pushed: alive
        gone = stale_groups(URL, prefix, max_age_s=-1)  # as if the last push were long ago
        assert gone == [mine]
        for job in gone:
            delete(URL, job)
        # The Pushgateway only queues a delete (202 Accepted): a loaded CI run listed the group
        # right after. Gone within a few seconds is the behaviour.
        eventually(lambda: stale_groups(URL, prefix, max_age_s=-1) == [] or None, timeout=15, interval=0.2,
                   what="the deleted group gone from the listing")
        assert stale_groups(URL, "other-", max_age_s=-1).count(other) == 1  # another prefix stays
    finally:
        for job in (mine, other):
            delete(URL, job)
