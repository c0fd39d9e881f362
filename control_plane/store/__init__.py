"""Persistence for the control plane: the interfaces its services use, and Cassandra behind them.

- :mod:`.protocols`: :class:`EndpointStore` (the control plane's own tables), :class:`HistoryStore`
  (the delivery history the job writes, read here) and :class:`OrderingStore` (the blocked
  ordering keys the job writes, read here). Unit tests implement them in memory.
- One Cassandra module per protocol: :mod:`.endpoints` (with its rows in :mod:`.endpoint_rows`),
  :mod:`.history`, :mod:`.ordering`.
- :mod:`.cql`: what they share: the session, prepared statements, rows, driver failures as
  :class:`errors.Unavailable` so no driver type leaks upwards, and the lightweight transactions.

:class:`CassandraStore` is the three over one session, as the server builds it.
"""

from __future__ import annotations

from control_plane.store.endpoints import CassandraEndpointStore
from control_plane.store.history import CassandraHistoryStore, delivery_detail
from control_plane.store.ordering import CassandraOrderingStore
from control_plane.store.protocols import EndpointStore, HistoryPosition, HistoryStore, OrderingStore

__all__ = [
    "CassandraEndpointStore",
    "CassandraHistoryStore",
    "CassandraOrderingStore",
    "CassandraStore",
    "EndpointStore",
    "HistoryPosition",
    "HistoryStore",
    "OrderingStore",
    "delivery_detail",
]


class CassandraStore(CassandraEndpointStore, CassandraHistoryStore, CassandraOrderingStore):
    """Every protocol of this package over one driver session; each statement prepared once."""

    STATEMENTS = {**CassandraEndpointStore.STATEMENTS, **CassandraHistoryStore.STATEMENTS,
                  **CassandraOrderingStore.STATEMENTS}
