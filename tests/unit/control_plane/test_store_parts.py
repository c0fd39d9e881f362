"""The control plane's store is one Cassandra module per protocol, composed into CassandraStore
over one session: each part implements its protocol whole, and the composition prepares every
part's statements, no name claimed by two parts (one text would silently replace the other)."""

from __future__ import annotations

from collections import Counter

import pytest

from control_plane.store import (
    CassandraEndpointStore,
    CassandraHistoryStore,
    CassandraOrderingStore,
    CassandraStore,
    EndpointStore,
    HistoryStore,
    OrderingStore,
)

PARTS = [(EndpointStore, CassandraEndpointStore), (HistoryStore, CassandraHistoryStore),
         (OrderingStore, CassandraOrderingStore)]


@pytest.mark.parametrize(("protocol", "part"), PARTS, ids=lambda c: c.__name__)
def test_each_part_and_the_composition_implement_the_protocol_whole(protocol: type, part: type) -> None:
    methods = [name for name in vars(protocol) if not name.startswith("_")]
    assert methods
    assert [m for m in methods if not callable(getattr(part, m, None))] == []
    assert [m for m in methods if getattr(CassandraStore, m) is not getattr(part, m)] == []


def test_the_composition_prepares_every_parts_statements_and_no_name_twice() -> None:
    names = Counter(name for _, part in PARTS for name in part.STATEMENTS)
    assert [name for name, n in names.items() if n > 1] == []
    assert {name: text for _, part in PARTS for name, text in part.STATEMENTS.items()} == CassandraStore.STATEMENTS
