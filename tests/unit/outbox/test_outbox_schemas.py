"""outbox/schemas.py: what the producer refuses by the catalog, and when it refetches it
(a fake catalog source and an injected clock; the real one is tested over gRPC in
tests/integration/test_event_catalog.py)."""

from __future__ import annotations

import pytest

from core.event_schemas import SchemaVersion
from outbox.producer import OutboxError, write_event
from outbox.schemas import CatalogType, CatalogUnavailable, SchemaGuard, SchemaRefused, TenantCatalog
from tests.unit.outbox.test_outbox_producer import RecordingConnection

SCHEMA = {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}


class FakeSource:
    def __init__(self, catalog: TenantCatalog | None) -> None:
        self.catalog = catalog
        self.fetches = 0

    def fetch(self, tenant_id: str) -> TenantCatalog:
        self.fetches += 1
        if self.catalog is None:
            raise CatalogUnavailable("down")
        return self.catalog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def catalog(enforcement: str = "reject", unknown: str = "reject",
            versions: tuple[str, ...] = ("1.0",)) -> TenantCatalog:
    return TenantCatalog({"invoice.paid": CatalogType(enforcement, {SchemaVersion.parse(v): SCHEMA for v in versions})},
                         unknown)


def guard(source: FakeSource, clock: Clock | None = None) -> SchemaGuard:
    return SchemaGuard(source, clock=clock or Clock())


@pytest.mark.parametrize(("enforcement", "unknown", "event_type", "version", "payload", "refused"), [
    ("reject", "reject", "invoice.paid", "1", b'{"amount": 3}', None),
    ("reject", "reject", "invoice.paid", "1.0", b'{"amount": "3"}', "/amount"),
    ("reject", "reject", "invoice.paid", "1", b"{}", "/: 'amount' is a required property"),
    ("warn", "reject", "invoice.paid", "1", b'{"amount": "3"}', None),
    ("reject", "reject", "invoice.sent", "1", b"{}", "event type 'invoice.sent' is not in the catalog"),
    ("reject", "reject", "invoice.paid", "3", b"{}", "schema version '3' of invoice.paid"),
    ("reject", "reject", "invoice.paid", "2026-01-01", b"{}", "not MAJOR or MAJOR.MINOR"),
    ("reject", "warn", "invoice.sent", "1", b"{}", None),
    ("reject", "reject", "webhook.ping", "2026-01-01", b"{}", None),
])
def test_what_the_catalog_refuses(enforcement: str, unknown: str, event_type: str, version: str, payload: bytes,
                                  refused: str | None) -> None:
    g = guard(FakeSource(catalog(enforcement, unknown)))
    if refused is None:
        g.check("acme", event_type, version, payload)
    else:
        with pytest.raises(SchemaRefused, match=refused.replace("(", r"\(")):
            g.check("acme", event_type, version, payload)


def test_the_catalog_is_cached_for_its_ttl() -> None:
    source, clock = FakeSource(catalog()), Clock()
    g = guard(source, clock)
    for _ in range(3):
        g.check("acme", "invoice.paid", "1", b'{"amount": 1}')
    assert source.fetches == 1
    clock.now += 31
    g.check("acme", "invoice.paid", "1", b'{"amount": 1}')
    assert source.fetches == 2


def test_a_version_added_a_moment_ago_is_fetched_at_once_but_misses_refetch_at_most_once_a_second() -> None:
    source, clock = FakeSource(catalog()), Clock()
    g = guard(source, clock)
    g.check("acme", "invoice.paid", "1", b'{"amount": 1}')
    clock.now += 2
    source.catalog = catalog(versions=("1.0", "1.1"))
    g.check("acme", "invoice.paid", "1.1", b'{"amount": 1}')  # not cached yet: refetched, accepted
    assert source.fetches == 2
    for _ in range(5):
        with pytest.raises(SchemaRefused):
            g.check("acme", "invoice.paid", "9", b"{}")
    assert source.fetches == 2  # within a second of the last fetch
    clock.now += 1.5
    with pytest.raises(SchemaRefused):
        g.check("acme", "invoice.paid", "9", b"{}")
    assert source.fetches == 3


def test_an_unreachable_catalog_keeps_the_last_copy_and_with_none_writes_unchecked() -> None:
    source, clock = FakeSource(catalog()), Clock()
    g = guard(source, clock)
    g.check("acme", "invoice.paid", "1", b'{"amount": 1}')
    source.catalog = None
    clock.now += 60
    with pytest.raises(SchemaRefused):
        g.check("acme", "invoice.paid", "1", b'{"amount": "x"}')  # the stale copy still decides
    guard(FakeSource(None)).check("acme", "invoice.paid", "1", b'{"amount": "x"}')  # never fetched: unchecked


def test_write_event_refuses_before_any_sql() -> None:
    conn = RecordingConnection()
    g = guard(FakeSource(catalog()))
    with pytest.raises(OutboxError, match="/amount"):
        write_event(conn, "acme", "invoice.paid", {"amount": "3"}, schema_version="1", schemas=g)  # type: ignore[arg-type]
    assert conn.executed == []
    write_event(conn, "acme", "invoice.paid", {"amount": 3}, schema_version="1", schemas=g)  # type: ignore[arg-type]
    assert len(conn.executed) == 1


@pytest.mark.parametrize("enforcement", ["reject", "warn"])
@pytest.mark.parametrize(("payload", "says"), [
    (b'{"amount":"x","amount":3}', "the key 'amount' appears twice"),  # json.loads keeps the valid 3
    (b'{"amount":3,"n":NaN}', "NaN is not a JSON number"),
    (b'{"amount":3,"n":"\\udfff"}', "lone surrogate"),
    ('{"amount":3}'.encode("utf-16"), "not UTF-8"),
], ids=["key twice", "NaN", "lone surrogate", "UTF-16"])
def test_a_payload_that_is_not_strict_json_is_refused_whatever_the_enforcement(
        enforcement: str, payload: bytes, says: str) -> None:
    """The job dead-letters it at ingest (payload_not_json) before any catalog check, so even
    ``warn`` does not let it through; the catalog never judges json.loads's reading of it."""
    g = guard(FakeSource(catalog(enforcement)))
    with pytest.raises(SchemaRefused, match=f"not strict JSON: .*{says}"):
        g.check("acme", "invoice.paid", "1", payload)


def test_a_tenant_the_job_has_no_catalog_for_is_not_checked() -> None:
    """No type catalogued and no setting stored: the job has no catalog for the tenant and sends
    its events unchecked, so the guard must not refuse them for a default ``reject`` (a new
    tenant's first event, before any `event-types create`). A stored setting or a type counts."""
    guard(FakeSource(TenantCatalog({}, "reject", published=False))).check("acme", "invoice.paid", "1", b"{}")
    with pytest.raises(SchemaRefused, match="not in the catalog"):
        guard(FakeSource(TenantCatalog({}, "reject"))).check("acme", "invoice.paid", "1", b"{}")
