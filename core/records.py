"""Every Kafka record the platform reads or writes: versioned, documented, in one module.

Topics and their records (all JSON, UTF-8):

* ``webhooks.events`` (key: event_id) -- :class:`EventRecord`, one committed business fact.
  Plain form, schema ``webhooks.event/v1``::

      {"schema": "webhooks.event/v1", "event_id": "evt_1", "tenant_id": "t_1",
       "event_type": "invoice.paid", "schema_version": "2026-01-01",
       "object_id": "inv_9", "object_version": 3, "occurred_at": "2026-11-29T19:00:00Z",
       "payload": "{\\"id\\":\\"inv_9\\"}"}

  ``payload`` is a string whose UTF-8 encoding is the exact body every attempt sends;
  ``payload_base64`` may carry the same bytes instead (the platform's own records do). Either way
  they must be one strict JSON document in UTF-8 (core.strict_json). ``object_id`` and
  ``object_version`` are optional (ordering hints for receivers); ``target_endpoint_id`` (with
  ``target_proof``) is only set by the control plane's test ("ping") events. ``traceparent``
  (optional) is the W3C trace context the event continues (core.trace_context); an invalid one is
  ignored, never refused. See :mod:`core.ingest` for the Debezium outbox envelope, which is also
  accepted.
* ``webhooks.endpoints`` (key: endpoint_id, compacted) -- :class:`EndpointConfig`, the latest
  config of each endpoint, plus :class:`ConfigClock` heartbeats under the key ``__clock__``.
  Deletion is a config with status ``deleted`` (see :class:`EndpointStatus`).
  The event-type catalog rides the same topic, so fan-out reads it in order with configs and
  ticks: :class:`CatalogTypeRecord` (key ``__catalog__/TENANT/TYPE``: the type's enforcement
  and every version's schema), :class:`CatalogSettingsRecord` (key ``__catalog__/TENANT``: what
  an uncatalogued type or version gets) and :class:`SchemaPinsRecord` (key
  ``__schema_pins__/ENDPOINT``: the majors an endpoint accepts). Each carries a ``revision``, and
  fan-out keeps the highest per key whatever order they come in (core.schema_check.supersedes).
* ``webhooks.replays`` (key: delivery_id) -- :class:`ReplayRequest`, a manual re-send (with the
  closing time of its replay window, if the delivery's type has one).
* ``webhooks.events.dlq`` -- :class:`DeadLetter`, a record the job refused (value only: the job
  reads values, so the original key is not carried).
* ``webhooks.endpoint-signals`` (key: endpoint_id) -- :class:`EndpointSignal`, what the dispatcher
  learned about an endpoint that the control plane must act on (a 410 Gone disables it; a
  breaker that opens or closes, a delivery that ends without success become operational events).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from core.custom_headers import SealedHeader

EVENT_SCHEMA_V1 = "webhooks.event/v1"
ENDPOINT_SCHEMA_V1 = "webhooks.endpoint/v1"
CLOCK_SCHEMA_V1 = "webhooks.clock/v1"
REPLAY_SCHEMA_V1 = "webhooks.replay/v1"
DLQ_SCHEMA_V1 = "webhooks.dlq/v1"
SIGNAL_SCHEMA_V1 = "webhooks.endpoint-signal/v1"
REDRIVE_SCHEMA_V1 = "webhooks.redrive/v1"
CLOCK_KEY = "__clock__"
CATALOG_TYPE_SCHEMA_V1 = "webhooks.catalog-type/v1"
CATALOG_SETTINGS_SCHEMA_V1 = "webhooks.catalog-settings/v1"
SCHEMA_PINS_SCHEMA_V1 = "webhooks.schema-pins/v1"


def delivery_id_for(event_id: str, endpoint_id: str) -> str:
    """The stable identity of one event going to one endpoint.

    Deterministic, so re-processing an event (duplicate publish, checkpoint restore, topic replay)
    names the same delivery; it is the ``webhook-id`` receivers dedupe on. The length prefix keeps
    ("a:b", "c") and ("a", "b:c") apart.
    """
    digest = hashlib.sha256(
        f"{len(event_id)}:{event_id}:{endpoint_id}".encode()
    ).hexdigest()
    return "dlv_" + digest[:32]


@dataclass(frozen=True)
class EventRecord:
    event_id: str
    tenant_id: str
    event_type: str
    schema_version: str
    object_id: str
    object_version: int
    occurred_at_ms: int
    payload: bytes
    # Set only on control-plane test events (`webhook.ping`): fan-out sends the event to this one
    # endpoint of the tenant, whatever its filter, instead of matching subscriptions. Honoured only
    # with the control plane's ``target_proof`` (core.target_proof); otherwise dead-lettered.
    target_endpoint_id: str | None = None
    target_proof: str | None = None
    # The W3C traceparent the producer wrote with the event (core.trace_context), as ingest
    # normalised it; None when it gave none or an invalid one.
    traceparent: str | None = None

    @property
    def payload_sha256(self) -> str:
        return hashlib.sha256(self.payload).hexdigest()

    def to_json(self) -> bytes:
        from core.timeutil import ms_to_iso

        return json.dumps(
            {
                "schema": EVENT_SCHEMA_V1,
                "event_id": self.event_id,
                "tenant_id": self.tenant_id,
                "event_type": self.event_type,
                "schema_version": self.schema_version,
                "object_id": self.object_id,
                "object_version": self.object_version,
                "occurred_at": ms_to_iso(self.occurred_at_ms),
                "payload_base64": base64.b64encode(self.payload).decode(),
                **({"target_endpoint_id": self.target_endpoint_id} if self.target_endpoint_id else {}),
                **({"target_proof": self.target_proof} if self.target_proof else {}),
                **({"traceparent": self.traceparent} if self.traceparent else {}),
            },
            separators=(",", ":"),
        ).encode()


class EndpointStatus(enum.StrEnum):
    ACTIVE = "active"
    DISABLED = "disabled"  # by a person, or by a 410 Gone from the endpoint
    DELETED = "deleted"
    # Created for a tenant that requires an ownership challenge: it receives only the control
    # plane's `webhook.challenge` event until the challenge is answered (control_plane.endpoints.service).
    PENDING_VERIFICATION = "pending_verification"

    @staticmethod
    def tolerant(raw: object) -> EndpointStatus:
        """A status a newer control plane may publish and this job does not know is "not active":
        nothing is sent and nothing is cancelled (deleted is the only status that ends deliveries),
        so the endpoint waits, visibly, until a status the job knows arrives."""
        try:
            return EndpointStatus(str(raw))
        except ValueError:
            return EndpointStatus.DISABLED


@dataclass(frozen=True)
class SigningKey:
    """One signing secret as published: encrypted with the master key, never in plaintext."""

    version: int
    ciphertext_b64: str
    # Unix ms after which this key no longer signs (end of a rotation overlap); None = no end.
    not_after_ms: int | None = None


@dataclass(frozen=True)
class EndpointConfig:
    endpoint_id: str
    tenant_id: str
    config_version: int
    url: str
    status: EndpointStatus
    event_types: tuple[str, ...]
    signing_keys: tuple[SigningKey, ...]
    published_at_ms: int
    rate_limit_per_s: float | None = None
    max_in_flight: int | None = None
    # What the endpoint is sent of each event (core.minimise); absent in records published
    # before it existed, which means "full".
    payload_mode: str = "full"
    payload_fields: tuple[str, ...] = ()
    # Ordering key (core.ordering): "" (none, default), "object_id" or a JSON Pointer; absent in
    # records published before it existed.
    ordering_key: str = ""
    # Custom headers sent with every request (core.custom_headers): secret values sealed, opened
    # by the job at send time. Absent in records without any.
    headers: tuple[SealedHeader, ...] = ()
    # Set by the dispatcher when a later record for this endpoint could not be read: sends wait
    # until a readable config replaces it. Never published (the control plane never sets it).
    refused: str | None = None

    def to_json(self) -> bytes:
        d = asdict(self)
        del d["refused"]
        if self.payload_mode == "full":  # records stay as they were for endpoints that do not minimise
            del d["payload_mode"], d["payload_fields"]
        else:
            d["payload_fields"] = list(self.payload_fields)
        if not self.ordering_key:
            del d["ordering_key"]
        if self.headers:
            d["headers"] = [h.to_dict() for h in self.headers]
        else:
            del d["headers"]
        d["status"] = self.status.value
        d["event_types"] = list(self.event_types)
        d["signing_keys"] = [asdict(k) for k in self.signing_keys]
        d["schema"] = ENDPOINT_SCHEMA_V1
        return json.dumps(d, separators=(",", ":")).encode()

    @staticmethod
    def from_dict(d: dict[str, Any]) -> EndpointConfig:
        return EndpointConfig(
            endpoint_id=str(d["endpoint_id"]),
            tenant_id=str(d["tenant_id"]),
            config_version=int(d["config_version"]),
            url=str(d["url"]),
            status=EndpointStatus.tolerant(d["status"]),
            event_types=tuple(str(t) for t in d["event_types"]),
            signing_keys=tuple(
                SigningKey(
                    version=int(k["version"]),
                    ciphertext_b64=str(k["ciphertext_b64"]),
                    not_after_ms=None if k.get("not_after_ms") is None else int(k["not_after_ms"]),
                )
                for k in d["signing_keys"]
            ),
            published_at_ms=int(d["published_at_ms"]),
            rate_limit_per_s=None if d.get("rate_limit_per_s") is None else float(d["rate_limit_per_s"]),
            max_in_flight=None if d.get("max_in_flight") is None else int(d["max_in_flight"]),
            payload_mode=str(d.get("payload_mode") or "full"),
            payload_fields=tuple(str(f) for f in d.get("payload_fields") or ()),
            ordering_key=str(d.get("ordering_key") or ""),
            headers=tuple(SealedHeader.from_dict(h) for h in d.get("headers") or ()),
        )


@dataclass(frozen=True)
class ConfigClock:
    """Tick on the endpoints topic (key ``__clock__``), schema ``webhooks.clock/v1``::

        {"schema": "webhooks.clock/v1", "published_at_ms": 1767225600000, "lease_ms": 1000}

    The promise: every config change that is not on the (single-partition) topic before this tick
    is acknowledged by the control plane's API no earlier than ``published_at_ms + lease_ms``
    (:attr:`horizon_ms`). Fan-out releases an event that arrived before the horizon of a tick it
    has read (:mod:`core.fanout`), so an endpoint acknowledged before an event is never missed.
    ``lease_ms`` was added to v1 as an optional field: a tick without it (a control plane from
    before leases, which acknowledged at once) promises only configs stored before
    ``published_at_ms``, which is a lease of 0; a job from before leases ignores the field and
    applies that stricter reading."""

    published_at_ms: int
    lease_ms: int = 0

    @property
    def horizon_ms(self) -> int:
        return self.published_at_ms + self.lease_ms

    def to_json(self) -> bytes:
        return json.dumps({"schema": CLOCK_SCHEMA_V1, "published_at_ms": self.published_at_ms,
                           "lease_ms": self.lease_ms}).encode()

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ConfigClock:
        lease = int(d.get("lease_ms") or 0)
        if lease < 0:
            raise ValueError(f"clock lease_ms must not be negative, got {lease}")
        return ConfigClock(published_at_ms=int(d["published_at_ms"]), lease_ms=lease)


@dataclass(frozen=True)
class UnreadableConfig:
    """An endpoints-topic record under an endpoint's key that this job cannot read. It is not
    dropped: it is counted, logged, and holds the endpoint's sends until a readable config for
    the same key arrives (the topic keeps per-key order)."""

    endpoint_id: str
    reason: str


def json_object(raw: bytes | str) -> dict[str, Any]:
    """The JSON object ``raw`` holds, or ValueError (also for an array or a scalar)."""
    # A JSON array or scalar would fail later with AttributeError, which the operators do not
    # expect: refuse it here with the ValueError they skip.
    d = json.loads(raw)
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object, got {type(d).__name__}")
    return d


@dataclass(frozen=True)
class CatalogTypeRecord:
    """One catalogued event type of a tenant, schema ``webhooks.catalog-type/v1``::

        {"schema": "webhooks.catalog-type/v1", "tenant_id": "acme", "event_type": "invoice.paid",
         "enforcement": "reject", "revision": 4, "published_at_ms": 1767225600000,
         "versions": {"1.0": {<JSON Schema>}, "2.0": {<JSON Schema>}}}

    ``versions`` holds every version the catalog has, deprecated ones included (events of a
    deprecated version are still validated and sent until its producers stop). ``enforcement``:
    what a payload failing its schema gets -- dead-lettered (``reject``) or sent and counted
    (``warn``)."""

    tenant_id: str
    event_type: str
    enforcement: str
    revision: int
    versions: dict[str, dict[str, Any]]
    published_at_ms: int

    @property
    def key(self) -> str:
        return catalog_type_key(self.tenant_id, self.event_type)

    def to_json(self) -> bytes:
        d = asdict(self)
        d["schema"] = CATALOG_TYPE_SCHEMA_V1
        return json.dumps(d, separators=(",", ":"), sort_keys=True).encode()

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CatalogTypeRecord:
        versions = d["versions"]
        if not isinstance(versions, dict) or not all(isinstance(v, dict) for v in versions.values()):
            raise ValueError("catalog versions must map version ids to schema objects")
        return CatalogTypeRecord(str(d["tenant_id"]), str(d["event_type"]), str(d["enforcement"]),
                                 int(d["revision"]), {str(k): v for k, v in versions.items()},
                                 int(d["published_at_ms"]))


@dataclass(frozen=True)
class CatalogSettingsRecord:
    """A tenant's catalog settings, schema ``webhooks.catalog-settings/v1``: ``unknown_types``
    (``reject`` | ``warn``) for an event whose type or version is not in its catalog.
    ``revision`` orders the records of one tenant: the write time (µs) of the stored row, which is
    also what Cassandra orders its writes by; 0 in records from before it was published."""

    tenant_id: str
    unknown_types: str
    published_at_ms: int
    revision: int = 0

    @property
    def key(self) -> str:
        return catalog_settings_key(self.tenant_id)

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "schema": CATALOG_SETTINGS_SCHEMA_V1}, separators=(",", ":")).encode()

    @staticmethod
    def from_dict(d: dict[str, Any]) -> CatalogSettingsRecord:
        return CatalogSettingsRecord(str(d["tenant_id"]), str(d["unknown_types"]), int(d["published_at_ms"]),
                                     int(d.get("revision", 0)))


@dataclass(frozen=True)
class SchemaPinsRecord:
    """The schema majors an endpoint accepts, schema ``webhooks.schema-pins/v1``; empty: all.
    Events of other majors are not sent to it (fan-out counts them as skipped_schema_major).
    ``revision`` orders the records of one endpoint, as CatalogSettingsRecord's does."""

    tenant_id: str
    endpoint_id: str
    schema_majors: tuple[int, ...]
    published_at_ms: int
    revision: int = 0

    @property
    def key(self) -> str:
        return schema_pins_key(self.endpoint_id)

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "schema_majors": list(self.schema_majors),
                           "schema": SCHEMA_PINS_SCHEMA_V1}, separators=(",", ":")).encode()

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SchemaPinsRecord:
        return SchemaPinsRecord(str(d["tenant_id"]), str(d["endpoint_id"]),
                                tuple(sorted(int(m) for m in d["schema_majors"])), int(d["published_at_ms"]),
                                int(d.get("revision", 0)))


CatalogRecord = CatalogTypeRecord | CatalogSettingsRecord | SchemaPinsRecord


def catalog_type_key(tenant_id: str, event_type: str) -> str:
    return f"__catalog__/{tenant_id}/{event_type}"


def catalog_settings_key(tenant_id: str) -> str:
    return f"__catalog__/{tenant_id}"


def schema_pins_key(endpoint_id: str) -> str:
    return f"__schema_pins__/{endpoint_id}"


def parse_endpoint_topic_value(raw: bytes | str) -> EndpointConfig | ConfigClock | CatalogRecord:
    """Parse a value from the endpoints topic. Raises ValueError on anything unknown."""
    d = json_object(raw)
    schema = d.get("schema")
    if schema == CLOCK_SCHEMA_V1:
        return ConfigClock.from_dict(d)
    if schema == ENDPOINT_SCHEMA_V1:
        return EndpointConfig.from_dict(d)
    if schema == CATALOG_TYPE_SCHEMA_V1:
        return CatalogTypeRecord.from_dict(d)
    if schema == CATALOG_SETTINGS_SCHEMA_V1:
        return CatalogSettingsRecord.from_dict(d)
    if schema == SCHEMA_PINS_SCHEMA_V1:
        return SchemaPinsRecord.from_dict(d)
    raise ValueError(f"unknown endpoints-topic schema {schema!r}")


REPLAY = "replay"
SKIP = "skip"


def _replay_action(raw: object) -> str:
    if raw not in (REPLAY, SKIP):
        raise ValueError(f"unknown replay action {raw!r}")
    return str(raw)


@dataclass(frozen=True)
class ReplayRequest:
    """A person's request about an existing delivery: ``replay`` (a manual re-send, a new attempt
    on the same delivery_id) or ``skip`` (end an ordering key's head as failed, core.ordering)::

        {"schema": "webhooks.replay/v1", "delivery_id": "dlv_..", "tenant_id": "acme",
         "endpoint_id": "ep_..", "requested_by": "key_..", "requested_at_ms": 1767225600000,
         "request_id": "rpl_..", "replay_closes_at_ms": 1767229200000,
         "replay_rule": "catalog user.disabled: replay window 1h"}

    ``action`` is present for a skip only; ``replay_closes_at_ms``/``replay_rule`` only when a
    replay window governs the delivery (additive: a job that predates them ignores them)."""

    delivery_id: str
    tenant_id: str
    endpoint_id: str
    requested_by: str
    requested_at_ms: int
    request_id: str = ""
    action: str = "replay"
    # The replay window the control plane found for the delivery when it queued the request
    # (core/replay_policy.py): the job refuses the request if it reads it at or after this
    # time. None: no window but the 30-day history.
    replay_closes_at_ms: int | None = None
    replay_rule: str = ""

    def to_json(self) -> bytes:
        d = asdict(self)
        if self.action == REPLAY:
            del d["action"]  # replays stay as they were: an older job reads them
        if self.replay_closes_at_ms is None:
            del d["replay_closes_at_ms"], d["replay_rule"]  # as above; an older job ignores them
        d["schema"] = REPLAY_SCHEMA_V1
        return json.dumps(d, separators=(",", ":")).encode()

    @staticmethod
    def from_json(raw: bytes | str) -> ReplayRequest:
        d = json_object(raw)
        if d.get("schema") != REPLAY_SCHEMA_V1:
            raise ValueError(f"unknown replay schema {d.get('schema')!r}")
        return ReplayRequest(
            delivery_id=str(d["delivery_id"]),
            tenant_id=str(d["tenant_id"]),
            endpoint_id=str(d["endpoint_id"]),
            requested_by=str(d["requested_by"]),
            requested_at_ms=int(d["requested_at_ms"]),
            request_id=str(d.get("request_id", "")),
            action=_replay_action(d.get("action", REPLAY)),
            replay_closes_at_ms=None if d.get("replay_closes_at_ms") is None else int(d["replay_closes_at_ms"]),
            replay_rule=str(d.get("replay_rule", "")),
        )


@dataclass(frozen=True)
class DeadLetter:
    """What the DLQ holds: why the record was refused, and its original bytes (base64). A refusal
    made after parsing (fan-out's ``event_id_conflict``) carries the event as parsed, re-encoded
    in the plain form, and says so in ``extra["original"]``."""

    reason: str
    detail: str
    original_base64: str
    source_topic: str
    refused_at_ms: int
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        d = asdict(self)
        d["schema"] = DLQ_SCHEMA_V1
        return json.dumps(d, separators=(",", ":")).encode()


@dataclass(frozen=True)
class EndpointSignal:
    """The dispatcher saw something about an endpoint that the control plane acts on. ``signal``:

    * ``gone`` -- the receiver answered 410 under ``config_version``: disable it;
    * ``failing`` -- its breaker opened from closed, failing episode ``sequence``;
    * ``recovered`` -- a success closed its breaker, ending episode ``sequence``;
    * ``exhausted`` -- delivery ``delivery_id`` ended without success (``detail``: failed or
      expired), after ``attempts`` attempts, the last answered ``http_status``.

    ``event_type`` is the type of the delivery that caused it (the no-loop rule of
    core.operational_events reads it). Fields after ``at_ms`` are optional in the JSON: a signal
    written before they existed reads with their defaults."""

    endpoint_id: str
    tenant_id: str
    config_version: int
    signal: str
    detail: str
    at_ms: int
    event_type: str = ""
    sequence: int = 0
    delivery_id: str = ""
    event_id: str = ""
    http_status: int | None = None
    attempts: int = 0

    def to_json(self) -> bytes:
        d = asdict(self)
        d["schema"] = SIGNAL_SCHEMA_V1
        return json.dumps(d, separators=(",", ":")).encode()

    @staticmethod
    def from_json(raw: bytes | str) -> EndpointSignal:
        d = json.loads(raw)
        if d.get("schema") != SIGNAL_SCHEMA_V1:
            raise ValueError(f"unknown endpoint-signal schema {d.get('schema')!r}")
        return EndpointSignal(
            endpoint_id=str(d["endpoint_id"]),
            tenant_id=str(d["tenant_id"]),
            config_version=int(d["config_version"]),
            signal=str(d["signal"]),
            detail=str(d["detail"]),
            at_ms=int(d["at_ms"]),
            event_type=str(d.get("event_type", "")),
            sequence=int(d.get("sequence", 0)),
            delivery_id=str(d.get("delivery_id", "")),
            event_id=str(d.get("event_id", "")),
            http_status=None if d.get("http_status") is None else int(d["http_status"]),
            attempts=int(d.get("attempts", 0)),
        )


@dataclass(frozen=True)
class RedriveRequest:
    """Reconciliation's repair of one delivery: re-create it in the dispatcher from the stored
    fan-out snapshot (or the stored delivery row), whatever the event-level dedupe remembers.
    The dispatcher reads the delivery's durable record before anything is sent, so a redrive of
    a delivery that is already final sends nothing, and one already held is ignored."""

    delivery_id: str
    tenant_id: str
    endpoint_id: str
    endpoint_config_version: int
    created_at_ms: int
    expires_at_ms: int
    event: EventRecord
    reason: str
    requested_by: str

    def to_json(self) -> bytes:
        d = {k: v for k, v in asdict(self).items() if k != "event"}
        d["event"] = json.loads(self.event.to_json())
        d["schema"] = REDRIVE_SCHEMA_V1
        return json.dumps(d, separators=(",", ":")).encode()


def record_schema(raw: bytes | str) -> str:
    """The ``schema`` field of a JSON record ('' when absent or unreadable): which parser to use."""
    try:
        value = json_object(raw).get("schema")
    except ValueError:
        return ""
    return value if isinstance(value, str) else ""
