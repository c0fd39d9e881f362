"""The catalog's records on webhooks.endpoints, where fan-out reads them in order with endpoint
configs and the config clock (core.records: CatalogTypeRecord, CatalogSettingsRecord,
SchemaPinsRecord; core.schema_check says what fan-out does with them).

A catalog change is acknowledged one lease after Kafka confirmed its records, as an endpoint
change is (control_plane.publishing.configs): a tick ahead of the records on the single-partition
topic was decided before the confirmation, so every event committed after the acknowledgement
is checked against the new catalog. A publish that fails answers UNAVAILABLE ("stored, not yet
sent to the delivery job"); retrying the same call publishes the stored state again, and without a
retry the republisher does (control_plane.publishing.catalog, which also decides what is sent:
the rows as stored, read back).

Catalog changes are rare (people editing a contract), so each opens a producer of its own and
closes it: the control plane keeps no second producer and thread alive for them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from control_plane.errors import Unavailable
from control_plane.publishing.publisher import KafkaPublisher, PublishError
from core.records import CatalogRecord
from core.settings import KafkaSettings


class _RecordPublisher(KafkaPublisher):
    def publish_record(self, record: CatalogRecord) -> None:
        self._send(self._topics.endpoints_topic, record.key, record.to_json())


class CatalogPublisher:
    def __init__(self, settings: KafkaSettings, lease_ms: int,
                 sleep_ms: Callable[[int], None] = lambda ms: time.sleep(ms / 1000)) -> None:
        self._settings = settings
        self._lease_ms = lease_ms
        self._sleep_ms = sleep_ms

    def publish_records(self, records: Sequence[CatalogRecord]) -> None:
        producer = _RecordPublisher(self._settings)
        try:
            for record in records:
                producer.publish_record(record)
        except PublishError as exc:
            raise Unavailable(f"the change is stored but not yet sent to the delivery job ({exc}); "
                              "retry the call") from exc
        finally:
            producer.close()
        self._sleep_ms(self._lease_ms)
