"""A lightweight transaction whose outcome Cassandra could not learn (a CAS write timeout, or
protocol v5's CAS_WRITE_UNKNOWN: on a 3-node ring, concurrent creates of one tenant contend on
one partition) is sent again by the store a bounded number of times; a retry that finds the
condition false tells this call's own write (applied after all: the create keeps its secret)
from another writer's. Driven through CassandraStore with a scripted session (no server)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cassandra import WriteTimeout, WriteType
from cassandra.protocol import ErrorMessage

from control_plane.domain import Endpoint, EndpointSpec, StoredKey, Tenant
from control_plane.errors import Unavailable
from control_plane.store import CassandraStore
from control_plane.store.cql import _LWT_TRIES
from control_plane.store.endpoint_rows import keys_to_json
from core.records import EndpointStatus

CAS_WRITE_UNKNOWN = 0x1700


def unknown() -> Exception:
    return ErrorMessage(CAS_WRITE_UNKNOWN, "CAS operation result is unknown - proposal accepted by 1 but not a quorum.",
                        None)


class Result:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.column_names = list(rows[0]) if rows else []
        self._rows = rows

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._rows)


class Statement:
    def __init__(self, name: str) -> None:
        self.name = name

    def bind(self, params: Any) -> tuple[str, Any]:
        return self.name, params


class ScriptedSession:
    """Answers each statement name from its own script: an exception is raised, a list of rows
    returned; the last entry repeats."""

    def __init__(self, script: dict[str, list[Any]]) -> None:
        self.script = script
        self.sent: list[str] = []

    def execute(self, bound: tuple[str, Any]) -> Result:
        name, _ = bound
        self.sent.append(name)
        steps = self.script[name]
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        if isinstance(step, Exception):
            raise step
        return Result(step)


def store(script: dict[str, list[Any]]) -> tuple[CassandraStore, ScriptedSession]:
    s = CassandraStore.__new__(CassandraStore)
    session = ScriptedSession(script)
    s._session = session  # type: ignore[assignment]
    s._p = {name: Statement(name) for name in script}  # type: ignore[misc]
    s._sleep = lambda _s: None  # type: ignore[method-assign]
    return s, session


def endpoint(ciphertext: str = "sealed-by-this-call") -> Endpoint:
    return Endpoint(
        tenant_id="t1", endpoint_id="ep_1",
        spec=EndpointSpec(url="https://example.com/hook", description="", event_types=("order.*",),
                          rate_limit_per_s=None, max_in_flight=None),
        status=EndpointStatus.ACTIVE, config_version=1, published_version=0,
        signing_keys=(StoredKey(1, ciphertext, 1_000),), created_at_ms=1_000, updated_at_ms=1_000,
        changed_by="key_1", change="create")


def not_applied(**row: Any) -> list[dict[str, Any]]:
    return [{"[applied]": False, **row}]


APPLIED = [{"[applied]": True}]


def test_a_create_whose_first_try_applied_unseen_is_this_calls_own_and_keeps_its_secret() -> None:
    ours = endpoint()
    s, session = store({"endpoint_insert": [unknown(), not_applied(signing_keys=keys_to_json(ours.signing_keys))]})
    assert s.insert_endpoint(ours) is True
    assert session.sent == ["endpoint_insert", "endpoint_insert"]


def test_a_retry_that_finds_another_writers_row_is_not_applied() -> None:
    theirs = endpoint("sealed-by-another-call")
    s, _ = store({"endpoint_insert": [unknown(), not_applied(signing_keys=keys_to_json(theirs.signing_keys))]})
    assert s.insert_endpoint(endpoint()) is False


def test_a_condition_false_at_the_first_try_is_not_taken_for_ours_whatever_the_row() -> None:
    ours = endpoint()
    s, _ = store({"endpoint_insert": [not_applied(signing_keys=keys_to_json(ours.signing_keys))]})
    assert s.insert_endpoint(ours) is False


@pytest.mark.parametrize("exc", [unknown(), WriteTimeout("timed out", write_type=WriteType.CAS)])
def test_an_outcome_still_unknown_after_the_last_try_answers_unavailable(exc: Exception) -> None:
    s, session = store({"endpoint_insert": [exc]})
    with pytest.raises(Unavailable, match="storage unavailable"):
        s.insert_endpoint(endpoint())
    assert len(session.sent) == _LWT_TRIES


def test_an_unknown_outcome_then_applied_is_applied() -> None:
    s, session = store({"tenant_insert": [unknown(), unknown(), APPLIED]})
    assert s.create_tenant(Tenant("t1", "Acme", 1_000)) is True
    assert len(session.sent) == 3


def test_a_timeout_that_is_not_an_lwts_is_not_retried_here() -> None:
    # Not a CAS write: the driver's own retry policy has had its say; the caller retries.
    s, session = store({"tenant_insert": [WriteTimeout("timed out", write_type=WriteType.SIMPLE)]})
    with pytest.raises(Unavailable):
        s.create_tenant(Tenant("t1", "Acme", 1_000))
    assert session.sent == ["tenant_insert"]


def test_a_tenant_created_unseen_by_this_call_is_recognised_by_its_name_and_time() -> None:
    from datetime import datetime
    created = datetime(1970, 1, 1, 0, 0, 1)  # 1,000 ms, naive UTC as the driver returns it
    s, _ = store({"tenant_insert": [unknown(), not_applied(name="Acme", created_at=created)]})
    assert s.create_tenant(Tenant("t1", "Acme", 1_000)) is True
    s, _ = store({"tenant_insert": [unknown(), not_applied(name="Other", created_at=created)]})
    assert s.create_tenant(Tenant("t1", "Acme", 1_000)) is False


def test_a_replace_whose_unknown_try_applied_is_recognised_by_rereading_the_row() -> None:
    from datetime import datetime
    ours = endpoint()
    row = {"config_version": 1, "signing_keys": keys_to_json(ours.signing_keys),
           "updated_at": datetime(1970, 1, 1, 0, 0, 1)}
    s, session = store({"endpoint_replace": [unknown(), not_applied(config_version=1)], "endpoint_get": [[row]]})
    assert s.replace_endpoint(ours, expected_version=0) is True
    assert session.sent == ["endpoint_replace", "endpoint_replace", "endpoint_get"]
    s, _ = store({"endpoint_replace": [unknown(), not_applied(config_version=1)],
                  "endpoint_get": [[{**row, "signing_keys": "[]"}]]})
    assert s.replace_endpoint(ours, expected_version=0) is False
