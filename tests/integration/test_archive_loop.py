"""The archiver's schedule mode as a process (python -m control_plane.archiver --every N): a run
that fails is logged and reported to the Pushgateway (the ArchiverFailing alert's gauge), the
loop goes on to the next boundary, and SIGTERM stops it cleanly. The failure is a keyspace that
does not exist (nothing of the shared stack is archived); the Pushgateway is a recorder of this
test's own."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from core.settings import REPO_ROOT

pytestmark = pytest.mark.integration


class Pushes(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str]] = []

    def do_PUT(self) -> None:  # noqa: N802 -- the stdlib's handler name
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        Pushes.seen.append((self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def gateway() -> Iterator[str]:
    Pushes.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pushes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_failed_run_is_reported_the_loop_goes_on_and_sigterm_stops_it(gateway):
    env = {**os.environ, "WEBHOOKS_CASSANDRA__KEYSPACE": "webhooks_no_such_keyspace",
           "WEBHOOKS_ARCHIVE__PUSHGATEWAY": gateway}
    proc = subprocess.Popen([sys.executable, "-m", "control_plane.archiver", "--every", "2", "--margin", "0",
                             "--shard", "1/2"], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(Pushes.seen) < 2:  # two runs, each failed and reported
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "no two runs reported within 60 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    for path, body in Pushes.seen[:2]:
        assert path == "/metrics/job/webhooks_archiver/shard/1-of-2"
        assert "webhooks_archive_last_run_ok 0.0" in body
    assert out.count("failed; the next run at the next boundary retries") >= 2
    assert "archiver stopped after" in out and "failed)" in out
