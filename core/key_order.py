"""Ordering keys (:mod:`core.ordering`) as an endpoint driver applies them to its deliveries.

:mod:`core.ordering` knows keys and versions; this module knows deliveries (:class:`Pending`):
which key a held delivery joins, the key a delivery history gave back takes now, whether one may
be sent automatically, and what a head's record does to its key's row in
``blocked_ordering_keys``. The driver (:mod:`core.endpoint_driver`) keeps one
:class:`core.ordering.KeyQueues` per endpoint and calls these.
"""

from __future__ import annotations

from core import dispatch as d
from core import ordering
from core.dispatch import Pending, replace
from core.fanout import NewDelivery
from core.ordering import KeyQueues
from core.records import EndpointConfig


def join(order: KeyQueues, p: Pending, started: bool = False) -> None:
    """``p`` joins its key (``started``: it was sent before, so it stays head until final)."""
    e = p.delivery.event
    order.add(p.delivery_id, p.delivery.ordering_key, e.object_version, p.delivery.created_at_ms, started)


def may_send_auto(order: KeyQueues, did: str, ordered: bool) -> bool:
    """Whether a held delivery may be sent automatically: the endpoint is not ordered, or it is
    its key's head."""
    return not ordered or order.is_head(did)


def keyed_now(config: EndpointConfig | None, delivery: NewDelivery) -> NewDelivery:
    """A delivery history gave back (a replay's load, a redrive) carries no ordering key:
    the endpoint's setting now decides it."""
    e = delivery.event
    key = ordering.key_for(config.ordering_key, e.object_id, e.payload) if config else ""
    return replace(delivery, ordering_key=key)


def key_row(order: KeyQueues, p: Pending, ordered: bool) -> ordering.KeyRowChange | None:
    """What a head's record does to its key's row in blocked_ordering_keys."""
    key, r = order.key_of(p.delivery_id), p.record
    if not key or r is None or not order.is_head(p.delivery_id):
        return None
    if r.delivery_status in d.FINAL_STATUSES:
        # No row was written for a head that succeeded at its first try.
        first_try_ok = r.outcome == "succeeded" and not r.manual and p.attempt_count <= 1
        return None if first_try_ok else ordering.KeyRowChange(key, blocked=False)
    if r.outcome == "retry" and not r.manual and ordered:
        return ordering.KeyRowChange(key, blocked=True, waiting=order.waiting(key),
                                     first_failure=p.attempt_count == 1)
    return None
