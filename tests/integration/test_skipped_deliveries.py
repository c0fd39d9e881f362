"""A pair fan-out skipped (the endpoint pinned to other schema majors) as the job writes it with the
event's fan-out snapshot, read back by the control plane from a real Cassandra: listed in the
endpoint's history as skipped with its reason, no attempt, and absent from the snapshot row that
reconciliation reads. A keyspace of this module's own; no job, no Kafka (the job end to end:
tests/integration/test_catalog_fanout.py)."""

from __future__ import annotations

import time
import uuid

import pytest
from cassandra.cluster import Session

from control_plane.domain import DeliveryStatus
from control_plane.rpc.api import pb
from control_plane.rpc.servicer import detail_pb
from control_plane.store import CassandraStore
from core.fanout import FanoutSnapshot, SkippedDelivery
from core.records import delivery_id_for
from core.settings import Settings
from operators.history_store import CassandraHistory
from stack.isolation import isolated_env, settings_with
from tests.support.helpers import durable

pytestmark = pytest.mark.integration

REASON = "schema major 1 not accepted (pinned: 2)"


@pytest.fixture(scope="module")
def own_settings() -> Settings:
    return settings_with(isolated_env(f"skip-{uuid.uuid4().hex[:8]}", own_keyspace=True))





def test_a_skipped_pair_is_listed_for_its_endpoint_and_not_in_the_snapshot(history: CassandraHistory,
                                                                           session: Session) -> None:
    event_id, tenant = f"evt_{uuid.uuid4().hex}", "t-skip"
    ep_any, ep_v2 = f"ep_any_{uuid.uuid4().hex[:8]}", f"ep_v2_{uuid.uuid4().hex[:8]}"
    at = int(time.time() * 1000) - 1000
    skipped = SkippedDelivery(delivery_id_for(event_id, ep_v2), ep_v2, 3, "order.paid", REASON)
    snapshot = FanoutSnapshot(event_id, tenant, at, ((ep_any, 1),), skipped=(skipped,))
    durable(history, history.write_snapshot(snapshot))
    durable(history, history.write_snapshot(snapshot))  # a re-write (failed confirmation, restore) changes nothing

    store = CassandraStore(session)
    [listed] = list(store.iter_endpoint_deliveries(tenant, ep_v2, at - 60_000, at + 60_000, None))
    assert (listed.delivery_id, listed.event_id, listed.event_type, listed.status, listed.attempt_count) == (
        skipped.delivery_id, event_id, "order.paid", DeliveryStatus.SKIPPED, 0)
    detail = store.get_delivery(skipped.delivery_id)
    assert detail is not None
    assert (detail.summary.status, detail.last_error_class, detail.attempts, detail.auto_retry_active,
            detail.endpoint_config_version) == (DeliveryStatus.SKIPPED, REASON, (), False, 3)
    assert detail_pb(detail).delivery.status == pb.DELIVERY_STATUS_SKIPPED  # what GetDelivery answers

    hour, bucket = snapshot.partition
    row = session.execute("SELECT endpoints FROM fanout_snapshots WHERE hour=%s AND bucket=%s AND arrived_at=%s"
                          " AND event_id=%s", (hour, bucket, at, event_id)).one()
    assert dict(row.endpoints) == {ep_any: 1}  # reconciliation expects only the delivery that exists
