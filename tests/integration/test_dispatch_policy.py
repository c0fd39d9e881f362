"""The response policy on the real stack (short schedule from conftest: base 0.5 s, cap 2 s,
max 4 attempts): retry on 5xx with the same webhook-id and body, Retry-After honoured on 429,
4xx and 3xx permanent (redirects never followed), 410 disables the endpoint, and an endpoint that
always fails ends visibly as failed after max_attempts."""

from __future__ import annotations

import time

import pytest

from control_plane.rpc.api import pb, rpc
from core.records import delivery_id_for
from tests.support.helpers import auth, event, eventually, new_tenant, produce

pytestmark = pytest.mark.integration

QUIET_S = 5
FINAL = (pb.DELIVERY_STATUS_SUCCEEDED, pb.DELIVERY_STATUS_FAILED, pb.DELIVERY_STATUS_EXPIRED)


class Setup:
    def __init__(self, settings, grpc_channel, receiver, behaviour: str | None, name: str,
                 event_types: tuple[str, ...] = ("invoice.*",)) -> None:
        self.settings, self.receiver = settings, receiver
        self.tenant_id, self.api_key = new_tenant(grpc_channel, settings)
        self.cp = rpc.ControlPlaneStub(grpc_channel)
        self.path = f"/ep/{self.tenant_id}/{name}"
        if behaviour is not None:
            receiver.set_behaviour(self.path, behaviour)
        created = self.cp.CreateEndpoint(
            pb.CreateEndpointRequest(url=receiver.base_url + self.path, event_types=list(event_types)),
            metadata=auth(self.api_key))
        self.endpoint_id = created.endpoint.endpoint_id

    def send(self, body: bytes = b'{"id":"inv_1"}') -> str:
        ev = event(self.tenant_id, "invoice.paid", body)
        produce(self.settings, [ev.to_json()], keys=[ev.event_id])
        return delivery_id_for(ev.event_id, self.endpoint_id)

    def get(self, delivery_id: str):
        return self.cp.GetDelivery(pb.GetDeliveryRequest(delivery_id=delivery_id), metadata=auth(self.api_key))

    def final(self, delivery_id: str, attempts: int, timeout: float = 90):
        """The delivery once it is final and all ``attempts`` attempt rows are visible."""
        def done():
            try:
                d = self.get(delivery_id)
            except Exception:  # not written yet (NOT_FOUND)
                return None
            if d.delivery.status in FINAL and len(d.attempts) >= attempts:
                return d
            return None
        return eventually(done, timeout=timeout, what=f"{delivery_id} final with {attempts} attempts")


def _table(detail) -> list[tuple[int, int, str]]:
    return [(a.attempt_number, a.http_status, a.outcome) for a in detail.attempts]


def test_500_then_200_retries_with_same_id_and_body(settings, grpc_channel, receiver, delivery_job,
                                                    cassandra_session):
    s = Setup(settings, grpc_channel, receiver, "500 then 200", "retry5xx")
    body = b'{"id":"inv_5xx", "exact": "bytes"}'
    did = s.send(body)

    first, second = receiver.wait_for(s.path, 2, timeout=90)
    d = s.final(did, 2)
    assert d.delivery.status == pb.DELIVERY_STATUS_SUCCEEDED
    assert d.delivery.attempt_count == 2
    assert _table(d) == [(1, 500, "retry"), (2, 200, "succeeded")]
    assert d.auto_retry_active is False
    rows = [(r.attempt_number, r.http_status, r.outcome) for r in cassandra_session.execute(
        "SELECT attempt_number, http_status, outcome FROM delivery_history WHERE delivery_id=%s"
        " AND attempt_number > 0 ORDER BY attempt_number ASC", (did,))]
    assert rows == [(1, 500, "retry"), (2, 200, "succeeded")]

    assert first.headers["webhook-id"] == second.headers["webhook-id"] == did
    assert first.body == second.body == body
    assert first.headers["webhook-timestamp"] != second.headers["webhook-timestamp"]
    assert int(second.headers["webhook-timestamp"]) > int(first.headers["webhook-timestamp"])
    time.sleep(2)
    assert len(receiver.requests(s.path)) == 2, "no try after success"


@pytest.mark.parametrize("seconds", [1, 3])
def test_429_retry_after_is_honoured(settings, grpc_channel, receiver, delivery_job, seconds):
    # 3 s is above the backoff cap (2 s): only honouring the header can explain such a wait.
    s = Setup(settings, grpc_channel, receiver, f"retry_after 429 {seconds} then 200", f"ra{seconds}")
    did = s.send()

    first, second = receiver.wait_for(s.path, 2, timeout=90)
    waited = second.received_monotonic - first.received_monotonic
    assert waited >= seconds - 0.15, f"retried {waited:.2f}s after a 429 asking for {seconds}s"
    d = s.final(did, 2)
    assert d.delivery.status == pb.DELIVERY_STATUS_SUCCEEDED
    assert _table(d) == [(1, 429, "retry"), (2, 200, "succeeded")]


def test_404_is_permanent(settings, grpc_channel, receiver, delivery_job):
    s = Setup(settings, grpc_channel, receiver, "404", "notfound")
    did = s.send()

    receiver.wait_for(s.path, 1, timeout=90)
    d = s.final(did, 1)
    assert d.delivery.status == pb.DELIVERY_STATUS_FAILED
    assert _table(d) == [(1, 404, "failed")]
    assert d.auto_retry_active is False
    time.sleep(QUIET_S)
    assert len(receiver.requests(s.path)) == 1, "a 404 must not be retried"
    assert len(s.get(did).attempts) == 1


def test_301_is_not_followed_and_fails(settings, grpc_channel, receiver, delivery_job):
    s = Setup(settings, grpc_channel, receiver, None, "moved")
    target = f"/ep/{s.tenant_id}/moved-to"
    receiver.set_behaviour(s.path, f"redirect 301 {receiver.base_url}{target}")
    did = s.send()

    (rec,) = receiver.wait_for(s.path, 1, timeout=90)
    d = s.final(did, 1)
    assert d.delivery.status == pb.DELIVERY_STATUS_FAILED
    assert _table(d) == [(1, 301, "failed")]
    time.sleep(QUIET_S)
    assert receiver.requests(target) == [], "the redirect must not be followed"
    assert len(receiver.requests(s.path)) == 1


def test_410_fails_and_disables_the_endpoint(settings, grpc_channel, receiver, delivery_job):
    s = Setup(settings, grpc_channel, receiver, "gone", "gone")
    did = s.send()

    receiver.wait_for(s.path, 1, timeout=90)
    d = s.final(did, 1)
    assert d.delivery.status == pb.DELIVERY_STATUS_FAILED
    assert _table(d) == [(1, 410, "failed")]

    # The control plane turns the dispatcher's signal into a real, audited disable.
    def disabled():
        ep = s.cp.GetEndpoint(pb.GetEndpointRequest(endpoint_id=s.endpoint_id), metadata=auth(s.api_key))
        return ep if ep.status == pb.ENDPOINT_STATUS_DISABLED else None

    eventually(disabled, timeout=30, what="endpoint disabled after 410")
    versions = s.cp.ListEndpointVersions(pb.GetEndpointRequest(endpoint_id=s.endpoint_id),
                                         metadata=auth(s.api_key)).versions
    assert versions[0].status == pb.ENDPOINT_STATUS_DISABLED and versions[0].changed_by == "dispatcher"

    receiver.set_behaviour(s.path, "200")  # would succeed, if anything were still sent
    later = s.send(b'{"id":"after_gone"}')
    time.sleep(QUIET_S)
    assert len(receiver.requests(s.path)) == 1, "no delivery may be attempted to an endpoint that said 410"
    try:
        attempts = list(s.get(later).attempts)
    except Exception:  # not even recorded: certainly not attempted
        attempts = []
    assert [a for a in attempts if a.http_status] == []


def test_always_500_stops_after_max_attempts(settings, grpc_channel, receiver, delivery_job):
    s = Setup(settings, grpc_channel, receiver, "500", "always500")
    did = s.send()
    max_attempts = settings.dispatch.max_attempts
    assert max_attempts == 4

    d = s.final(did, max_attempts)
    assert d.delivery.status == pb.DELIVERY_STATUS_FAILED
    assert d.delivery.attempt_count == max_attempts
    assert _table(d) == [(1, 500, "retry"), (2, 500, "retry"), (3, 500, "retry"), (4, 500, "failed")]
    assert d.auto_retry_active is False
    time.sleep(QUIET_S)
    assert len(receiver.requests(s.path)) == max_attempts, "no try after max_attempts"


@pytest.mark.parametrize("first, error_class", [("hang", "timeout"), ("reset", "reset")])
def test_transport_failure_then_200_is_retried(first, error_class, settings, grpc_channel, receiver, delivery_job):
    """A hang past the total timeout, or a connection reset, is an unknown outcome: retried."""
    s = Setup(settings, grpc_channel, receiver, f"{first} then 200", f"transport-{first}")
    did = s.send()
    d = s.final(did, 2)
    assert d.delivery.status == pb.DELIVERY_STATUS_SUCCEEDED
    first_try, second_try = d.attempts
    assert (first_try.outcome, first_try.error_class, first_try.http_status) == ("retry", error_class, 0)
    assert (second_try.outcome, second_try.http_status) == ("succeeded", 200)
    if first == "hang":
        # Cut at the job's total timeout (2 s in the test settings), not left hanging.
        assert 1_500 <= first_try.latency_ms <= 4_000, first_try.latency_ms


def test_repeated_failures_open_the_breaker_and_hold_the_backlog(settings, grpc_channel, receiver, delivery_job):
    """20 deliveries to an endpoint that always fails: the breaker opens after the configured
    consecutive failures, so most first attempts are held (visible as pending) instead of sent."""
    s = Setup(settings, grpc_channel, receiver, "500", "breaker")
    threshold = settings.dispatch.breaker_failure_threshold
    in_flight = settings.dispatch.default_max_in_flight
    dids = [s.send(f'{{"n":{i}}}'.encode()) for i in range(20)]
    receiver.wait_for(s.path, threshold, timeout=90)
    time.sleep(1.0)  # well inside the breaker's open period (2 s in the test settings)
    sent = len(receiver.requests(s.path))
    # Without a breaker all 20 first attempts would go out at once; with it at most the failures
    # that opened it plus what was already in flight.
    assert sent <= threshold + in_flight < 20, sent
    pending = [s.get(d).delivery.status for d in dids[-5:]]
    assert all(st == pb.DELIVERY_STATUS_PENDING for st in pending), pending


def test_open_breaker_sends_one_probe_then_closes_and_drains(settings, grpc_channel, receiver, delivery_job):
    """Once the failing endpoint recovers, the open breaker lets exactly one probe through after
    its open period (2 s here); the probe is answered slowly, so anything else sent while it is in
    flight would be seen. Its success closes the breaker and the whole held backlog is delivered."""
    s = Setup(settings, grpc_channel, receiver, "500", "probe")
    threshold = settings.dispatch.breaker_failure_threshold
    dids = [s.send(f'{{"n":{i}}}'.encode()) for i in range(20)]
    receiver.wait_for(s.path, threshold, timeout=90)
    time.sleep(1.0)  # the breaker is open now; stragglers that were in flight have arrived
    receiver.set_behaviour(s.path, "slow 1.5")  # recovered, answering 200 after 1.5 s
    before = len(receiver.requests(s.path))
    assert before < len(dids), f"the breaker did not hold anything back: {before} sent"
    opened_at = receiver.requests(s.path)[threshold - 1].received_at

    probe = receiver.wait_for(s.path, before + 1, timeout=30)[before]
    assert probe.received_at - opened_at >= settings.dispatch.breaker_open_s * 0.9, \
        "the probe went before the open period ended"
    time.sleep(1.0)  # the probe is still being answered
    assert len(receiver.requests(s.path)) == before + 1, "more than one request while half-open"

    for did in dids:
        assert s.final(did, attempts=1).delivery.status == pb.DELIVERY_STATUS_SUCCEEDED, did
    retried = [d for d in dids if len(s.get(d).attempts) > 1]
    assert retried, "no delivery was failed before the breaker opened"
