"""The archive writer's offline bench (bench/archive_writer_cpu.py): its phase holds the facts the
job writes for each delivery, and a run archives every delivery and prints its summary line."""

from __future__ import annotations

from collections import Counter

from bench import archive_writer_cpu
from core import archive_facts


def test_the_phase_holds_the_jobs_facts_of_each_delivery() -> None:
    p = archive_writer_cpu.phase(n_events=40, n_endpoints=10, n_tenants=2, body_bytes=1536, retried=0.1)
    facts = [f for r in p.records for f in archive_facts.decode(r)]
    kinds = Counter(kind for kind, _ in facts)
    assert p.deliveries == 400 and p.facts == len(facts)
    assert kinds["events"] == 40  # once per event, with its first delivery
    assert all(len(row["payload"]) == 1536 for kind, row in facts if kind == "events")
    # A creation per delivery, then an attempt and its status write per try; some retried once.
    assert kinds["deliveries"] == 400 + kinds["attempts"]
    assert 400 < kinds["attempts"] < 400 + 80
    assert archive_writer_cpu.phase(40, 10, 2, 1536, 0.1) == p  # deterministic


def test_a_run_archives_every_delivery_and_ends_with_the_summary(capsys) -> None:
    assert archive_writer_cpu.main(["--events", "20", "--endpoints", "3", "--repeat", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("archive-writer-bench: cpu_ms_per_delivery=") and " deliveries=60 " in last
