"""Endpoint management: create, read, list, update, enable/disable, delete, rotate, ping.

Rules that hold for every method:

* Tenancy: an endpoint is read with the caller's tenant_id as the partition key, so another
  tenant's id is simply not found (NotFound; existence is not leaked). Deleted endpoints are
  not found either.
* Every change is one conditional write of the endpoint row (IF config_version = the version
  read) producing config_version + 1; the row records who made the change and what it was,
  the audit row of each version is written before that version is published, and a lost race
  is retried on fresh data. Nothing is ever half-applied: validation happens before the write,
  and the write is the single commit point.
* Publishing to Kafka happens after the commit (control_plane.publishing.configs); a publish failure
  does not fail the call, the response shows published_version lagging and the republisher
  catches up.
* A person's enable, disable and rotation record their operational event before the write
  (:class:`ChangeListener`) and tell it whether the write applied, so the event is published even
  if Kafka refuses it or the process dies after the write (control_plane.endpoints.operational_events).
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from control_plane import validation
from control_plane.cursor import Cursors
from control_plane.domain import (
    Challenge,
    Endpoint,
    EndpointSpec,
    EndpointVersion,
    IdempotencyRecord,
    Page,
    Principal,
    StoredKey,
    Tenant,
)
from control_plane.endpoints.schema_pins import SchemaPins, pinned_majors
from control_plane.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    StaleVersion,
    Unavailable,
)
from control_plane.publishing.configs import ConfigPublication
from control_plane.publishing.publisher import Publisher, PublishError
from control_plane.store import EndpointStore, HistoryStore
from core import custom_headers, minimise, signing, target_proof
from core.custom_headers import HeaderInput, SealedHeader
from core.fanout import filter_covered
from core.records import EndpointSignal, EndpointStatus, EventRecord, delivery_id_for
from core.secrets import NONCE_BYTES, Keyring, decrypt_secret, derive_key, encrypt_secret, sealed_with
from core.signing import ED25519, HMAC_SHA256, SECRET_BYTES, generate_key
from core.timeutil import ms_to_iso

log = logging.getLogger(__name__)

PING_EVENT_TYPE = "webhook.ping"
# Who the audit trail names for changes the platform makes itself (410 Gone -> disabled).
DISPATCHER_ACTOR = "dispatcher"
ADMIN_ACTOR = "admin"  # changed_by of changes made with the admin credential
AUTO_DISABLE_ACTOR = "auto-disable"  # changed_by of an auto-disable (control_plane.endpoints.operational_events)
PING_SCHEMA_VERSION = "2026-01-01"
CHALLENGE_EVENT_TYPE = "webhook.challenge"
UPDATABLE_FIELDS = frozenset(
    {"url", "description", "event_types", "rate_limit_per_s", "max_in_flight", "metadata", "payload_mode",
     "payload_fields", "ordering_key", "schema_majors", "headers"}
)
MAX_OVERLAP_S = 7 * 24 * 3600
# A rotation adds a key and an overlap keeps old ones signing; every live key adds a signature
# to each request, so repeated rotations inside one overlap are bounded.
MAX_LIVE_KEYS = 4
CONFLICT_RETRIES = 3
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100


@dataclass(frozen=True)
class Created:
    endpoint: Endpoint
    signing_secret: str  # whsec_ (HMAC), shown once; "" for ed25519 and for a retried create
    public_key: str = ""  # whpk_ (ed25519): what the receiver verifies with


@dataclass(frozen=True)
class Rotated:
    endpoint: Endpoint
    signing_secret: str
    new_key_version: int
    live_keys: tuple[StoredKey, ...]
    public_key: str = ""


@dataclass(frozen=True)
class Reencrypted:
    """One pass of `master-key reencrypt`. ``keys_by_master_key``: every key and secret
    custom-header value of a live (not deleted) endpoint by the id of the master key that seals it
    after the pass ("(none)": sealed before ids); a retired id that no longer appears, with
    ``unpublished`` at 0, can be removed. ``keys_reencrypted`` counts signing keys only."""

    current_id: str
    endpoints_scanned: int
    endpoints_reencrypted: int
    keys_reencrypted: int
    keys_by_master_key: dict[str, int]
    unpublished: int


@dataclass(frozen=True)
class TestEventSent:
    event_id: str
    delivery_id: str


@dataclass(frozen=True)
class Deps:
    """Everything the service reaches outside itself; tests pass fakes and a fixed clock."""

    store: EndpointStore
    publication: ConfigPublication
    publisher: Publisher
    destination: validation.DestinationValidator
    master_key: Keyring
    now_ms: Callable[[], int]
    random_bytes: Callable[[int], bytes]
    default_overlap_s: int
    # Fault injection for the crash tests (control_plane.faults); a no-op unless configured.
    fault: Callable[[str], None] = lambda point: None
    # Where ownership-challenge answers are read (the delivery history); how long one stays open.
    history: HistoryStore | None = None
    challenge_ttl_s: int = 3600
    # Subscription filters against the tenant's event-type catalog (control_plane.catalog.service.FilterCheck):
    # raises InvalidArgument for a filter that matches no catalogued type.
    check_filters: Callable[[str, Sequence[str]], None] = lambda tenant_id, filters: None
    # The schema majors endpoints accept, kept by the event-type catalog (control_plane.endpoints.schema_pins);
    # None where the catalog is not wired (unit tests of other features): no endpoint is pinned.
    schema_pins: SchemaPins | None = None


def require_write(principal: Principal) -> None:
    if principal.read_only:
        raise PermissionDenied("this API key is read-only; use a read-write key to make changes")


def load_endpoint(store: EndpointStore, principal: Principal, endpoint_id: str,
                  include_deleted: bool = False) -> Endpoint:
    """The caller's tenant's endpoint; NOT_FOUND for another tenant's, as for one that does not
    exist (or is deleted, unless ``include_deleted``)."""
    validation.identifier("endpoint_id", endpoint_id)
    endpoint = store.get_endpoint(principal.tenant_id, endpoint_id)
    if endpoint is None or (endpoint.status is EndpointStatus.DELETED and not include_deleted):
        raise NotFound(f"endpoint {endpoint_id} not found")
    return endpoint


def page_size(requested: int, default: int = DEFAULT_PAGE_SIZE, maximum: int = MAX_PAGE_SIZE) -> int:
    if requested < 0 or requested > maximum:
        raise InvalidArgument(f"page_size must be between 1 and {maximum} (0 = {default})")
    return requested or default


class Announcement(Protocol):
    """The operational event of one write, recorded as pending before it; told whether it applied."""

    def committed(self) -> None: ...
    def not_committed(self) -> None: ...


class ChangeListener(Protocol):
    """Told of a person's changes that make operational events (control_plane.endpoints.operational_events),
    with the endpoint as about to be written, before the write: the event is recorded first, so a
    process dying after the write leaves it to be published. Raises Unavailable to refuse the change."""

    def enabling(self, endpoint: Endpoint, by: str) -> Announcement: ...
    def disabling_by_operator(self, endpoint: Endpoint, by: str) -> Announcement: ...
    def rotating_secret(self, endpoint: Endpoint) -> Announcement: ...


# Records the operational event of the write about to be made (a ChangeListener's method, bound).
Announce = Callable[[Endpoint], Announcement]


class EndpointService:
    def __init__(self, deps: Deps) -> None:
        self._d = deps
        self._listener: ChangeListener | None = None
        self._cursors = Cursors.from_keyring(deps.master_key)
        self._target_key = target_proof.target_key(deps.master_key.current)
        self._challenge_key = derive_key(deps.master_key.current, b"webhooks.endpoint-challenge/v1")
        # Secret header values enter an idempotency fingerprint only through this keyed hash.
        self._header_print_key = derive_key(deps.master_key.current, b"webhooks.header-fingerprint/v1")

    # -- reads ------------------------------------------------------------------------------

    def get(self, principal: Principal, endpoint_id: str) -> Endpoint:
        return self._load(principal, endpoint_id)

    def schema_majors(self, endpoints: Sequence[Endpoint]) -> dict[str, tuple[int, ...]]:
        """The pins of those of ``endpoints`` (one tenant's) that are pinned."""
        if self._d.schema_pins is None or not endpoints:
            return {}
        return self._d.schema_pins.of(endpoints[0].tenant_id, [e.endpoint_id for e in endpoints])

    def list(self, principal: Principal, size: int, page_cursor: str) -> Page[Endpoint]:
        limit = page_size(size)
        after = ""
        if page_cursor:
            after = str(self._cursors.decode("endpoints", page_cursor)["after"])
        items: list[Endpoint] = []
        # Deleted rows stay in the table (their deletion must still be published), so skip them
        # and keep reading until the page is full or the partition ends.
        while len(items) < limit:
            batch = self._d.store.list_endpoints(principal.tenant_id, after, limit)
            items.extend(e for e in batch if e.status is not EndpointStatus.DELETED)
            if len(batch) < limit:
                return Page(tuple(items[:limit]), "")
            after = batch[-1].endpoint_id
        items = items[:limit]
        return Page(tuple(items), self._cursors.encode("endpoints", after=items[-1].endpoint_id))

    # `builtins.list`: this class defines a method named `list`, which shadows the builtin here.
    def versions(self, principal: Principal, endpoint_id: str) -> builtins.list[EndpointVersion]:
        endpoint = self._load(principal, endpoint_id, include_deleted=True)
        stored = {v.config_version: v for v in self._d.store.list_versions(
            principal.tenant_id, endpoint.endpoint_id)}
        # The current version's audit row may not be written yet (publish pending): show it
        # from the row itself, which is exactly what the republisher will write.
        stored.setdefault(endpoint.config_version, EndpointVersion.of(endpoint))
        return [stored[v] for v in sorted(stored, reverse=True)]

    # -- create -----------------------------------------------------------------------------

    def create(self, principal: Principal, raw: EndpointSpec, request_id: str,
               signature_scheme: str = "", schema_majors: Sequence[int] = (),
               headers: Sequence[HeaderInput] = ()) -> Created:
        require_write(principal)
        scheme = validation.signature_scheme(signature_scheme)
        spec = validation.spec(raw, self._d.destination)
        headers = validation.headers(headers)
        headers_print = self._headers_print(headers)
        pinned = pinned_majors(schema_majors)
        pins = self._pins() if pinned else None
        tenant = self._d.store.get_tenant(principal.tenant_id)
        _authorise_event_types(tenant, spec.event_types)
        self._d.check_filters(principal.tenant_id, spec.event_types)
        endpoint_id = "ep_" + uuid.UUID(bytes=self._d.random_bytes(16)).hex
        if request_id:
            validation.identifier("request_id", request_id)
            claim = self._d.store.claim_request(
                IdempotencyRecord(
                    tenant_id=principal.tenant_id,
                    request_id=request_id,
                    fingerprint=_fingerprint(spec, scheme, pinned, headers_print),
                    endpoint_id=endpoint_id,
                    created_at_ms=self._d.now_ms(),
                )
            )
            if claim.fingerprint != _fingerprint(spec, scheme, pinned, headers_print):
                raise AlreadyExists(
                    f"request_id {request_id!r} was already used for a different endpoint; use a "
                    "new request_id for a new endpoint"
                )
            endpoint_id = claim.endpoint_id
            existing = self._d.store.get_endpoint(principal.tenant_id, endpoint_id)
            if existing is not None:
                return self._created_again(self._published(existing))
        if pins is not None:
            # Before the endpoint reaches the delivery job, so no event of another major is ever
            # sent to it. A create that fails after this leaves pins for an id no endpoint has
            # (they only ever narrow); its retry with the request_id sets them again.
            pins.set(principal.tenant_id, endpoint_id, pinned, principal.key_id)
        now = self._d.now_ms()
        secret = generate_key(scheme, self._d.random_bytes(SECRET_BYTES))
        key = self._seal(principal.tenant_id, endpoint_id, 1, secret, now)
        spec = replace(spec, headers=self._sealed_headers(principal.tenant_id, endpoint_id, headers, ()))
        challenge = self._new_challenge(now) if tenant is not None and tenant.verify_endpoints else None
        endpoint = Endpoint(
            tenant_id=principal.tenant_id,
            endpoint_id=endpoint_id,
            spec=spec,
            status=EndpointStatus.PENDING_VERIFICATION if challenge else EndpointStatus.ACTIVE,
            challenge=challenge,
            config_version=1,
            published_version=0,
            signing_keys=(key,),
            created_at_ms=now,
            updated_at_ms=now,
            changed_by=principal.key_id,
            change="create",
        )
        hold = self._d.publication.watermark.hold(principal.tenant_id, endpoint_id, 1, now)
        inserted = False
        try:
            inserted = self._d.store.insert_endpoint(endpoint)
        finally:
            if not inserted:
                self._d.publication.watermark.release(hold)
        if not inserted:
            # Only a concurrent retry of the same request_id can get here: answer as it did.
            existing = self._d.store.get_endpoint(principal.tenant_id, endpoint_id)
            if existing is None:
                raise Aborted("a concurrent create with this request_id is in progress; retry")
            return self._created_again(self._published(existing))
        log.info("endpoint %s created for tenant %s", endpoint_id, principal.tenant_id)
        self._d.fault("create.stored")  # stored, not yet published: the dual write's gap
        published = self._published(endpoint)
        if challenge is not None:
            # Never fails the create (its secret is shown only now): ResendChallenge recovers.
            self._send_challenge(published, raise_unavailable=False)
        return _created(published, secret, key)

    def _created_again(self, endpoint: Endpoint) -> Created:
        """The answer to a retried create: the same endpoint, and no secret. A secret is shown
        once: whoever can replay a create request (a proxy's log, a retrying client's store)
        must not be able to read it back. A client whose first answer was lost rotates."""
        if endpoint.status is EndpointStatus.DELETED:
            raise AlreadyExists("request_id was used for an endpoint that has since been deleted")
        return Created(endpoint, "")

    # -- changes ----------------------------------------------------------------------------

    def update(
        self, principal: Principal, endpoint_id: str, values: EndpointSpec, mask: Sequence[str],
        schema_majors: Sequence[int] = (), headers: Sequence[HeaderInput] = (),
        expected_version: int | None = None,
    ) -> Endpoint:
        """``expected_version``: apply only to that config version (checked against the row the
        conditional write replaces, so a concurrent change in between is never overwritten)."""
        require_write(principal)
        paths = set(mask)
        if not paths:
            raise InvalidArgument(
                f"update_mask is empty; name the fields to change: {', '.join(sorted(UPDATABLE_FIELDS))}"
            )
        unknown = paths - UPDATABLE_FIELDS
        if unknown:
            raise InvalidArgument(
                f"update_mask has unknown or read-only paths {sorted(unknown)}; updatable: "
                f"{', '.join(sorted(UPDATABLE_FIELDS))}"
            )
        # Validate only what changes: an unchanged URL is not re-resolved.
        tenant = self._d.store.get_tenant(principal.tenant_id) if paths & {"url", "event_types"} else None
        changes: dict[str, object] = {}
        if "url" in paths:
            changes["url"] = self._d.destination(values.url)
        if "description" in paths:
            changes["description"] = validation.description(values.description)
        if "event_types" in paths:
            changes["event_types"] = validation.event_types(values.event_types)
            _authorise_event_types(tenant, changes["event_types"])  # type: ignore[arg-type]
            self._d.check_filters(principal.tenant_id, changes["event_types"])  # type: ignore[arg-type]
        if "rate_limit_per_s" in paths:
            changes["rate_limit_per_s"] = validation.rate_limit(values.rate_limit_per_s)
        if "max_in_flight" in paths:
            changes["max_in_flight"] = validation.max_in_flight(values.max_in_flight)
        if "metadata" in paths:
            changes["metadata"] = validation.metadata(values.metadata)
        if "ordering_key" in paths:
            # Any time: the job keeps each delivery's key as fanned out, and "" releases held ones.
            changes["ordering_key"] = validation.ordering_key(values.ordering_key)
        pinned, pins = (pinned_majors(schema_majors), self._pins()) if "schema_majors" in paths else ((), None)
        if "headers" in paths:
            # Checked before anything is read; an empty secret value is checked against the
            # endpoint's current headers in apply.
            headers = validation.headers(headers, keep_allowed=frozenset(h.name.lower() for h in headers if h.secret))

        verifies = "url" in changes and tenant is not None and tenant.verify_endpoints
        issued: list[Challenge] = []  # the challenge this update made (apply may run more than once)

        def apply(current: Endpoint) -> Endpoint | None:
            issued.clear()
            if expected_version is not None and current.config_version != expected_version:
                raise StaleVersion(
                    f"the endpoint is at config_version {current.config_version}, not {expected_version}: "
                    "read it again and apply the change to what it is now")
            payload: dict[str, object] = {}
            if paths & {"payload_mode", "payload_fields"}:
                # Checked together: a mode and the allow-list it needs (or must not have).
                mode = (values.payload_mode or minimise.FULL) if "payload_mode" in paths else current.spec.payload_mode
                fields = values.payload_fields if "payload_fields" in paths else current.spec.payload_fields
                payload = {"payload_mode": mode, "payload_fields": validation.payload_fields(mode, fields)}
            if "headers" in paths:
                payload["headers"] = self._sealed_headers(current.tenant_id, current.endpoint_id, headers,
                                                          current.spec.headers)
            spec = replace(current.spec, **changes, **payload)  # type: ignore[arg-type]
            if spec == current.spec:
                return None
            changed = sorted(f for f in {**changes, **payload} if getattr(spec, f) != getattr(current.spec, f))
            extra: dict[str, object] = {}
            if spec.url != current.spec.url and verifies:
                # Ownership was proven for the old URL only: the new one answers a challenge first.
                issued.append(self._new_challenge(self._d.now_ms()))
                extra = {"status": EndpointStatus.PENDING_VERIFICATION, "challenge": issued[0]}
            return self._next(current, principal, "update " + ",".join(changed), spec=spec, **extra)

        updated = self._change(principal, endpoint_id, apply)
        if issued and updated.challenge == issued[0]:
            self._send_challenge(updated, raise_unavailable=False)
        if pins is not None:
            # After the endpoint's own change (checked in full, applied or not needed): a failure
            # here is answered as an error, and the retried update completes it.
            pins.set(principal.tenant_id, updated.endpoint_id, pinned, principal.key_id)
        return updated

    def set_enabled(self, principal: Principal, endpoint_id: str, enabled: bool) -> Endpoint:
        require_write(principal)
        target = EndpointStatus.ACTIVE if enabled else EndpointStatus.DISABLED

        def apply(current: Endpoint) -> Endpoint | None:
            if current.status is EndpointStatus.PENDING_VERIFICATION:
                raise FailedPrecondition("the endpoint awaits its ownership challenge: answer it, then VerifyEndpoint")
            if current.status is target:
                return None  # idempotent: enabling an active endpoint changes nothing, announces nothing
            return self._next(current, principal, "enable" if enabled else "disable", status=target)

        announce: Announce | None = None
        if self._listener is not None:
            listener = self._listener
            announce = functools.partial(listener.enabling if enabled else listener.disabling_by_operator,
                                         by=principal.key_id)
        return self._change(principal, endpoint_id, apply, announce)

    def listen(self, listener: ChangeListener) -> None:
        self._listener = listener

    def auto_disable(self, tenant_id: str, endpoint_id: str, detail: str) -> Endpoint | None:
        """Disable an endpoint failing for its tenant's whole auto-disable window (a new, audited
        config version); None when it is not active any more (disabled, deleted)."""
        principal = Principal(tenant_id=tenant_id, key_id=AUTO_DISABLE_ACTOR, read_only=False)

        def apply(current: Endpoint) -> Endpoint | None:
            if current.status is not EndpointStatus.ACTIVE:
                return None
            return self._next(current, principal, f"disable: {detail}", status=EndpointStatus.DISABLED)

        try:
            after = self._change(principal, endpoint_id, apply)
        except NotFound:
            return None
        return after if after.status is EndpointStatus.DISABLED and after.changed_by == AUTO_DISABLE_ACTOR else None

    def disable_gone(self, signal: EndpointSignal) -> Endpoint | None:
        """The receiver answered 410 Gone under config ``signal.config_version``: disable the
        endpoint (a new, audited config version by the dispatcher). A signal about an older
        version is stale -- a person changed or re-enabled the endpoint since -- and is ignored."""
        principal = Principal(tenant_id=signal.tenant_id, key_id=DISPATCHER_ACTOR, read_only=False)

        def apply(current: Endpoint) -> Endpoint | None:
            if current.status is not EndpointStatus.ACTIVE or current.config_version != signal.config_version:
                return None
            return self._next(current, principal, f"disable: {signal.detail}", status=EndpointStatus.DISABLED)

        try:
            return self._change(principal, signal.endpoint_id, apply)
        except NotFound:
            return None  # deleted since: nothing to disable

    def delete(self, principal: Principal, endpoint_id: str) -> Endpoint:
        """Marks the endpoint deleted; the job learns it from a config with status deleted."""
        require_write(principal)
        return self._change(
            principal,
            endpoint_id,
            lambda current: self._next(current, principal, "delete", status=EndpointStatus.DELETED),
        )

    def rotate_secret(
        self, principal: Principal, endpoint_id: str, revoke_immediately: bool, overlap_s: int,
        signature_scheme: str = "",
    ) -> Rotated:
        """A new key, in ``signature_scheme`` (default: the newest key's), old keys revoked or
        kept signing through the overlap -- across schemes too, so an endpoint moves from HMAC to
        ed25519 (or back) without a request its receiver cannot verify."""
        require_write(principal)
        wanted = validation.signature_scheme(signature_scheme) if signature_scheme else None
        if revoke_immediately and overlap_s:
            raise InvalidArgument("overlap_seconds cannot be combined with immediate revocation")
        if not 0 <= overlap_s <= MAX_OVERLAP_S:
            raise InvalidArgument(f"overlap_seconds must be between 1 and {MAX_OVERLAP_S} (0 = default)")
        overlap_ms = (overlap_s or self._d.default_overlap_s) * 1000
        secret_box: list[tuple[int, str]] = []

        def apply(current: Endpoint) -> Endpoint:
            now = self._d.now_ms()
            version = max((k.version for k in current.signing_keys), default=0) + 1
            newest = max(current.signing_keys, key=lambda k: k.version, default=None)
            scheme = wanted or (newest.scheme if newest is not None else HMAC_SHA256)
            secret = generate_key(scheme, self._d.random_bytes(SECRET_BYTES))
            new_key = self._seal(current.tenant_id, current.endpoint_id, version, secret, now)
            if revoke_immediately:
                kept: tuple[StoredKey, ...] = ()
                change = f"rotate secret to v{version}, old keys revoked"
            else:
                end = now + overlap_ms
                kept = tuple(
                    replace(k, not_after_ms=end if k.not_after_ms is None else min(k.not_after_ms, end))
                    for k in current.live_keys(now)
                )
                change = f"rotate secret to v{version}, overlap {overlap_ms // 1000} s"
            if len(kept) + 1 > MAX_LIVE_KEYS:
                raise FailedPrecondition(
                    f"{len(kept)} keys are still live from earlier rotations (max {MAX_LIVE_KEYS}); "
                    "wait for an overlap to end or rotate with immediate revocation"
                )
            secret_box[:] = [(version, secret)]
            return self._next(current, principal, change, signing_keys=(new_key, *kept))

        announce = self._listener.rotating_secret if self._listener is not None else None
        endpoint = self._change(principal, endpoint_id, apply, announce)
        version, secret = secret_box[0]
        created = _created(endpoint, secret, next(k for k in endpoint.signing_keys if k.version == version))
        return Rotated(endpoint, created.signing_secret, version, endpoint.live_keys(self._d.now_ms()),
                       created.public_key)

    # -- master-key rotation ----------------------------------------------------------------

    def reencrypt_keys(self, tenant_id: str | None, dry_run: bool) -> Reencrypted:
        """Seal every signing key not under the current master key again under it (same key
        version, same plaintext: receivers notice nothing), as an audited config change that is
        published to the job like any other -- the job opens both until the retired key goes."""
        ring = self._d.master_key
        scanned = changed = moved = unpublished = 0
        by_key: dict[str, int] = {}
        tenants = [tenant_id] if tenant_id else self._d.store.iter_tenant_ids()
        for tenant in tenants:
            admin = Principal(tenant, ADMIN_ACTOR, read_only=False)
            after = ""
            while batch := self._d.store.list_endpoints(tenant, after, MAX_PAGE_SIZE):
                after = batch[-1].endpoint_id
                for endpoint in batch:
                    if endpoint.status is EndpointStatus.DELETED:
                        continue  # never signs again
                    scanned += 1
                    stale = [k for k in endpoint.signing_keys if sealed_with(k.ciphertext_b64) != ring.current_id]
                    stale_headers = custom_headers.stale(endpoint.spec.headers, ring)
                    if (stale or stale_headers) and not dry_run:
                        endpoint = self._change(admin, endpoint.endpoint_id, self._resealed)
                        changed, moved = changed + 1, moved + len(stale)
                    # Secret header values count with the keys: a retired master key can go only
                    # when neither needs it.
                    sealed = [k.ciphertext_b64 for k in endpoint.signing_keys]
                    sealed += [h.sealed for h in endpoint.spec.headers if h.secret]
                    for ciphertext in sealed:
                        label = sealed_with(ciphertext) or "(none)"
                        by_key[label] = by_key.get(label, 0) + 1
                    unpublished += endpoint.published_version < endpoint.config_version
        log.info("master-key reencrypt%s: %d endpoints scanned, %d re-encrypted (%d keys) under %s",
                 " (dry run)" if dry_run else "", scanned, changed, moved, ring.current_id)
        return Reencrypted(ring.current_id, scanned, changed, moved, by_key, unpublished)

    def _resealed(self, current: Endpoint) -> Endpoint | None:
        ring = self._d.master_key
        if (all(sealed_with(k.ciphertext_b64) == ring.current_id for k in current.signing_keys)
                and not custom_headers.stale(current.spec.headers, ring)):
            return None  # done meanwhile (another replica, an earlier pass)
        keys = []
        for k in current.signing_keys:
            if sealed_with(k.ciphertext_b64) == ring.current_id:
                keys.append(k)
                continue
            secret = decrypt_secret(ring, k.ciphertext_b64, tenant_id=current.tenant_id,
                                    endpoint_id=current.endpoint_id, key_version=k.version)
            resealed = self._seal(current.tenant_id, current.endpoint_id, k.version, secret, k.created_at_ms)
            keys.append(replace(k, ciphertext_b64=resealed.ciphertext_b64))
        principal = Principal(current.tenant_id, ADMIN_ACTOR, read_only=False)
        headers = custom_headers.reseal(current.spec.headers, ring, tenant_id=current.tenant_id,
                                        endpoint_id=current.endpoint_id, random_bytes=self._d.random_bytes)
        return self._next(current, principal, f"re-encrypt signing keys under master key {ring.current_id}",
                          signing_keys=tuple(keys), spec=replace(current.spec, headers=headers))

    # -- ownership challenge ------------------------------------------------------------------

    def verify(self, principal: Principal, endpoint_id: str) -> Endpoint:
        """Activate an endpoint whose URL answered its challenge: a 2xx whose body (its first 256
        bytes, as history keeps them) holds the token. Proves who controlled the URL then only."""
        require_write(principal)
        endpoint = self._load(principal, endpoint_id)
        if endpoint.status is not EndpointStatus.PENDING_VERIFICATION:
            return endpoint  # verified already (or never asked to be): nothing to do
        c = endpoint.challenge
        if c is None:
            raise FailedPrecondition("no open ownership challenge; ResendChallenge sends one")
        if self._d.now_ms() >= c.expires_at_ms:
            raise FailedPrecondition(f"the ownership challenge expired at {ms_to_iso(c.expires_at_ms)}; "
                                     "ResendChallenge sends a new one")
        detail = self._d.history.get_delivery(delivery_id_for(c.event_id, endpoint_id)) if self._d.history else None
        token = self._token(endpoint_id, c.event_id)
        attempts = detail.attempts if detail is not None else ()
        if not any(a.http_status is not None and 200 <= a.http_status < 300 and token in a.response_prefix
                   for a in attempts):
            last = attempts[-1] if attempts else None
            seen = f"{len(attempts)} attempt(s), the last answered {last.http_status or last.error_class or '-'}" \
                if last else "no attempt yet"
            raise FailedPrecondition(f"the endpoint has not answered its challenge: it must answer 2xx with the "
                                     f"challenge token in its body ({seen})")

        def apply(current: Endpoint) -> Endpoint | None:
            if current.status is not EndpointStatus.PENDING_VERIFICATION or current.challenge != c:
                return None  # verified meanwhile, or a new challenge replaced this one
            return self._next(current, principal, f"verified ownership (challenge {c.event_id})",
                              status=EndpointStatus.ACTIVE, challenge=None)

        return self._change(principal, endpoint_id, apply)

    def resend_challenge(self, principal: Principal, endpoint_id: str) -> Endpoint:
        """A new challenge (new token, new expiry) for an endpoint awaiting verification."""
        require_write(principal)

        def apply(current: Endpoint) -> Endpoint | None:
            if current.status is not EndpointStatus.PENDING_VERIFICATION:
                raise FailedPrecondition("the endpoint is not awaiting an ownership challenge")
            return self._next(current, principal, "new ownership challenge",
                              challenge=self._new_challenge(self._d.now_ms()))

        endpoint = self._change(principal, endpoint_id, apply)
        self._send_challenge(endpoint, raise_unavailable=True)
        return endpoint

    def _new_challenge(self, now: int) -> Challenge:
        event_id = "evt_challenge_" + uuid.UUID(bytes=self._d.random_bytes(16)).hex
        return Challenge(event_id, now + self._d.challenge_ttl_s * 1000)

    def _token(self, endpoint_id: str, event_id: str) -> str:
        # Derived, never stored: a copy of the endpoints table cannot answer a challenge.
        return hmac.new(self._challenge_key, f"{endpoint_id}\n{event_id}".encode(), hashlib.sha256).hexdigest()[:40]

    def _send_challenge(self, endpoint: Endpoint, raise_unavailable: bool) -> None:
        c = endpoint.challenge
        assert c is not None
        payload = json.dumps({"type": CHALLENGE_EVENT_TYPE, "challenge": self._token(endpoint.endpoint_id, c.event_id),
                              "endpoint_id": endpoint.endpoint_id, "expires_at": ms_to_iso(c.expires_at_ms)},
                             separators=(",", ":")).encode()
        event = EventRecord(
            event_id=c.event_id, tenant_id=endpoint.tenant_id, event_type=CHALLENGE_EVENT_TYPE,
            schema_version=PING_SCHEMA_VERSION, object_id=endpoint.endpoint_id, object_version=endpoint.config_version,
            occurred_at_ms=self._d.now_ms(), payload=payload, target_endpoint_id=endpoint.endpoint_id,
            target_proof=target_proof.prove(self._target_key, endpoint.tenant_id, c.event_id, endpoint.endpoint_id))
        try:
            self._d.publisher.publish_event(event)
        except PublishError as exc:
            log.warning("challenge %s for endpoint %s not queued: %s", c.event_id, endpoint.endpoint_id, exc)
            if raise_unavailable:
                raise Unavailable("could not queue the challenge (Kafka unavailable); retry") from exc

    # -- test events ------------------------------------------------------------------------

    def send_test_event(self, principal: Principal, endpoint_id: str) -> TestEventSent:
        """Publish a `webhook.ping` event that fan-out sends to this endpoint only
        (EventRecord.target_endpoint_id), whatever its event-type filter."""
        require_write(principal)
        endpoint = self._load(principal, endpoint_id)
        if endpoint.status is not EndpointStatus.ACTIVE:
            raise FailedPrecondition("endpoint is disabled; enable it before sending a test event")
        now = self._d.now_ms()
        event_id = "evt_ping_" + uuid.UUID(bytes=self._d.random_bytes(16)).hex
        payload = json.dumps(
            {"type": PING_EVENT_TYPE, "event_id": event_id, "endpoint_id": endpoint.endpoint_id},
            separators=(",", ":"),
        ).encode()
        event = EventRecord(
            event_id=event_id,
            tenant_id=principal.tenant_id,
            event_type=PING_EVENT_TYPE,
            schema_version=PING_SCHEMA_VERSION,
            object_id=endpoint.endpoint_id,
            object_version=endpoint.config_version,
            occurred_at_ms=now,
            payload=payload,
            target_endpoint_id=endpoint.endpoint_id,
            # The job honours the target only with this proof: no other producer can aim events.
            target_proof=target_proof.prove(self._target_key, principal.tenant_id, event_id, endpoint.endpoint_id),
        )
        try:
            self._d.publisher.publish_event(event)
        except PublishError as exc:
            raise Unavailable("could not queue the test event (Kafka unavailable); retry") from exc
        return TestEventSent(event_id, delivery_id_for(event_id, endpoint.endpoint_id))

    # -- helpers ----------------------------------------------------------------------------

    def _pins(self) -> SchemaPins:
        if self._d.schema_pins is None:
            raise FailedPrecondition("schema_majors needs the event-type catalog, which this control plane lacks")
        return self._d.schema_pins

    def _load(self, principal: Principal, endpoint_id: str, include_deleted: bool = False) -> Endpoint:
        return load_endpoint(self._d.store, principal, endpoint_id, include_deleted)

    def _next(self, current: Endpoint, principal: Principal, change: str, **fields: object) -> Endpoint:
        return replace(
            current,
            config_version=current.config_version + 1,
            updated_at_ms=self._d.now_ms(),
            changed_by=principal.key_id,
            change=change,
            **fields,  # type: ignore[arg-type]
        )

    def _change(
        self,
        principal: Principal,
        endpoint_id: str,
        apply: Callable[[Endpoint], Endpoint | None],
        announce: Announce | None = None,
    ) -> Endpoint:
        """Read, apply, conditionally write, publish; re-read and re-apply on a lost race.
        ``announce``: the change's operational event, recorded before each write it makes and told
        whether that write applied (a write whose outcome is unknown leaves it recorded)."""
        for _ in range(CONFLICT_RETRIES):
            current = self._load(principal, endpoint_id)
            new = apply(current)
            if new is None:
                return current
            if current.published_version < current.config_version:
                # The version being replaced may never have been audited (its publish is still
                # pending): audit it now, before it is overwritten.
                self._d.store.put_version(EndpointVersion.of(current))
            announced = announce(new) if announce is not None else None
            hold = self._d.publication.watermark.hold(new.tenant_id, endpoint_id, new.config_version,
                                                      self._d.now_ms())
            committed = False
            try:
                committed = self._d.store.replace_endpoint(new, current.config_version)
            finally:
                if not committed:
                    self._d.publication.watermark.release(hold)
            if committed:
                log.info("endpoint %s: %s (v%d)", endpoint_id, new.change, new.config_version)
                published = self._published(new)
                if announced is not None:
                    announced.committed()
                return published
            if announced is not None:
                announced.not_committed()
        raise Aborted("endpoint is being changed concurrently; retry the request")

    def _published(self, endpoint: Endpoint) -> Endpoint:
        confirmed = self._d.publication.try_publish(endpoint.tenant_id, endpoint.endpoint_id)
        return replace(endpoint, published_version=max(endpoint.published_version, confirmed))

    def _sealed_headers(self, tenant_id: str, endpoint_id: str, headers: Sequence[HeaderInput],
                        current: Sequence[SealedHeader]) -> tuple[SealedHeader, ...]:
        try:
            return custom_headers.seal(headers, current, self._d.master_key, tenant_id=tenant_id,
                                       endpoint_id=endpoint_id, random_bytes=self._d.random_bytes)
        except custom_headers.InvalidHeaders as exc:
            raise InvalidArgument(str(exc)) from None

    def _headers_print(self, headers: Sequence[HeaderInput]) -> tuple[tuple[str, str, bool], ...]:
        """What a create's fingerprint holds of its headers: a secret value only as a keyed hash."""
        return tuple((h.name, hmac.new(self._header_print_key, h.value.encode(), hashlib.sha256).hexdigest()
                      if h.secret else h.value, h.secret) for h in headers)

    def _seal(self, tenant_id: str, endpoint_id: str, version: int, secret: str, now: int) -> StoredKey:
        ciphertext = encrypt_secret(
            self._d.master_key,
            secret,
            tenant_id=tenant_id,
            endpoint_id=endpoint_id,
            key_version=version,
            nonce=self._d.random_bytes(NONCE_BYTES),
        )
        public = signing.public_key(secret) if signing.scheme_of(secret) == ED25519 else ""
        return StoredKey(version=version, ciphertext_b64=ciphertext, created_at_ms=now, public_key=public)


def _authorise_event_types(tenant: Tenant | None, filters: Sequence[str]) -> None:
    """Subscription authorisation: a tenant the admin restricted subscribes only within its
    allow-list (`*` only where `*` is allowed)."""
    allowed = tenant.allowed_event_types if tenant is not None else None
    if allowed is None:
        return
    refused = [f for f in filters if not filter_covered(f, allowed)]
    if refused:
        raise PermissionDenied(f"event types {', '.join(refused)} are not allowed for this tenant "
                               f"(allowed: {', '.join(allowed)})")


def _created(endpoint: Endpoint, secret: str, key: StoredKey) -> Created:
    """What a create or rotation shows: an HMAC secret once; for ed25519 only the public key --
    the private key never leaves the platform."""
    if key.scheme == ED25519:
        return Created(endpoint, "", key.public_key)
    return Created(endpoint, secret)


def _fingerprint(spec: EndpointSpec, scheme: str = HMAC_SHA256, schema_majors: tuple[int, ...] = (),
                 headers_print: Sequence[tuple[str, str, bool]] = ()) -> str:
    fields: list[object] = [spec.url, spec.description, list(spec.event_types), spec.rate_limit_per_s,
                            spec.max_in_flight, sorted(spec.metadata.items())]
    if scheme != HMAC_SHA256:  # HMAC keeps the fingerprints stored before schemes existed
        fields.append(scheme)
    if spec.payload_mode != minimise.FULL:  # likewise: full keeps the fingerprints stored before
        fields.append([spec.payload_mode, list(spec.payload_fields)])
    if spec.ordering_key:  # likewise: unordered keeps them
        fields.append(["ordering_key", spec.ordering_key])
    if schema_majors:  # likewise: unpinned keeps them
        fields.append(["schema_majors", list(schema_majors)])
    if headers_print:  # likewise: no custom headers keeps them
        fields.append(["headers", [list(h) for h in headers_print]])
    canonical = json.dumps(fields, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
