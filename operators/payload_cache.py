"""Payload bytes in memory, by event id, bounded by bytes (least recently used goes first).

Keyed state keeps a delivery's payload only until the event row holding it is durable in
Cassandra (core/endpoint_store.py); after that a request takes the bytes from here, or reads the
event row when they were evicted. One event fanned out to ten endpoints is cached once.
"""

from __future__ import annotations

from collections import OrderedDict


class PayloadCache:
    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self.bytes = 0

    def get(self, event_id: str) -> bytes | None:
        payload = self._items.get(event_id)
        if payload is not None:
            self._items.move_to_end(event_id)
        return payload

    def put(self, event_id: str, payload: bytes) -> None:
        if len(payload) > self._max:
            return
        old = self._items.pop(event_id, None)
        if old is not None:
            self.bytes -= len(old)
        self._items[event_id] = payload
        self.bytes += len(payload)
        while self.bytes > self._max:
            _, evicted = self._items.popitem(last=False)
            self.bytes -= len(evicted)

    def __len__(self) -> int:
        return len(self._items)
