"""gRPC servicers: authenticate, convert proto -> domain, call the service, convert back.

No business rule lives here. Domain errors become status codes with the domain's message; any
other exception is logged with its traceback and answered INTERNAL with a generic message, so a
caller never sees a stack trace or internals.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from control_plane import errors, validation
from control_plane.admin import AdminService
from control_plane.auth import Authenticator
from control_plane.domain import (
    Attempt,
    BlockedKey,
    DeliveryDetail,
    DeliveryStatus,
    DeliverySummary,
    Endpoint,
    EndpointSpec,
    EndpointVersion,
    StoredKey,
    Tenant,
)
from control_plane.endpoints.service import EndpointService
from control_plane.history.deliveries import DeliveryService
from control_plane.history.ordering import OrderingService
from control_plane.history.reconcile import Reconciler
from control_plane.rpc.api import pb, rpc
from core import custom_headers
from core.custom_headers import HeaderInput, SealedHeader
from core.records import EndpointStatus
from core.secrets import redact

log = logging.getLogger(__name__)

_CODES: dict[type[errors.ControlPlaneError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.StaleVersion: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}

_STATUS_TO_PB = {
    EndpointStatus.ACTIVE: pb.ENDPOINT_STATUS_ACTIVE,
    EndpointStatus.DISABLED: pb.ENDPOINT_STATUS_DISABLED,
    EndpointStatus.PENDING_VERIFICATION: pb.ENDPOINT_STATUS_PENDING_VERIFICATION,
}
_DELIVERY_TO_PB = {
    DeliveryStatus.PENDING: pb.DELIVERY_STATUS_PENDING,
    DeliveryStatus.SUCCEEDED: pb.DELIVERY_STATUS_SUCCEEDED,
    DeliveryStatus.FAILED: pb.DELIVERY_STATUS_FAILED,
    DeliveryStatus.EXPIRED: pb.DELIVERY_STATUS_EXPIRED,
    DeliveryStatus.SKIPPED: pb.DELIVERY_STATUS_SKIPPED,
}
_DELIVERY_FROM_PB = {v: k for k, v in _DELIVERY_TO_PB.items()}

F = TypeVar("F", bound=Callable[..., Any])


# Trailing metadata naming the domain error's class (``StaleVersion``): a code can stand for more
# than one class, and the HTTP API answers each class with its own problem type and status.
ERROR_CLASS_KEY = "webhooks-error-class"


def _abort(context: grpc.ServicerContext, exc: Exception) -> None:
    if isinstance(exc, errors.ControlPlaneError):
        context.set_trailing_metadata(((ERROR_CLASS_KEY, type(exc).__name__),))
        context.abort(_CODES[type(exc)], redact(exc.message))
    log.error("unexpected error in %s", type(exc).__name__, exc_info=exc)
    context.abort(grpc.StatusCode.INTERNAL, "internal error; it has been logged")


def mapped(method: F) -> F:
    """Unary method: domain errors -> status codes."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Exception as exc:  # noqa: BLE001 -- the one place every error is translated
            _abort(context, exc)

    return wrapper  # type: ignore[return-value]


def mapped_stream(method: F) -> F:
    """Server-streaming method: the same mapping, for errors raised while streaming too."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from method(self, request, context)
        except Exception as exc:  # noqa: BLE001
            _abort(context, exc)

    return wrapper  # type: ignore[return-value]


# -- conversions -------------------------------------------------------------------------------


def ts(ms: int | None) -> Timestamp | None:
    if ms is None:
        return None
    stamp = Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


def ms_of(message: Any, field: str) -> int | None:
    return getattr(message, field).ToMilliseconds() if message.HasField(field) else None


def key_pb(key: StoredKey) -> Any:
    return pb.SigningKeyInfo(
        version=key.version, created_at=ts(key.created_at_ms), not_after=ts(key.not_after_ms),
        signature_scheme=key.scheme, public_key=key.public_key,
    )


def endpoint_pb(e: Endpoint, now_ms: int, schema_majors: Sequence[int] = ()) -> Any:
    return pb.Endpoint(
        endpoint_id=e.endpoint_id,
        url=e.spec.url,
        description=e.spec.description,
        event_types=list(e.spec.event_types),
        rate_limit_per_s=e.spec.rate_limit_per_s,
        max_in_flight=e.spec.max_in_flight,
        metadata=dict(e.spec.metadata),
        status=_STATUS_TO_PB.get(e.status, pb.ENDPOINT_STATUS_UNSPECIFIED),
        config_version=e.config_version,
        published_version=e.published_version,
        signing_keys=[key_pb(k) for k in e.live_keys(now_ms)],
        created_at=ts(e.created_at_ms),
        updated_at=ts(e.updated_at_ms),
        payload_mode=e.spec.payload_mode,
        payload_fields=list(e.spec.payload_fields),
        ordering_key=e.spec.ordering_key,
        challenge_event_id=e.challenge.event_id if e.challenge else "",
        challenge_expires_at=ts(e.challenge.expires_at_ms) if e.challenge else None,
        schema_majors=list(schema_majors),
        headers=headers_pb(e.spec.headers),
    )


def headers_pb(headers: Sequence[SealedHeader]) -> list[Any]:
    """What answers show of custom headers: a secret value never (not even sealed)."""
    return [pb.CustomHeader(name=v.name, value=v.value, secret=v.secret) for v in custom_headers.views(headers)]


def headers_of(messages: Sequence[Any]) -> tuple[HeaderInput, ...]:
    return tuple(HeaderInput(m.name, m.value, m.secret) for m in messages)


def tenant_pb(t: Tenant) -> Any:
    return pb.Tenant(tenant_id=t.tenant_id, name=t.name, created_at=ts(t.created_at_ms),
                     event_types_restricted=t.allowed_event_types is not None,
                     allowed_event_types=list(t.allowed_event_types or ()), verify_endpoints=t.verify_endpoints)


def spec_of(message: Any) -> EndpointSpec:
    return EndpointSpec(
        url=message.url,
        description=message.description,
        event_types=tuple(message.event_types),
        rate_limit_per_s=message.rate_limit_per_s if message.HasField("rate_limit_per_s") else None,
        max_in_flight=message.max_in_flight if message.HasField("max_in_flight") else None,
        metadata=dict(message.metadata),
        payload_mode=message.payload_mode,
        payload_fields=tuple(message.payload_fields),
        ordering_key=message.ordering_key,
    )


def version_pb(v: EndpointVersion) -> Any:
    message = pb.EndpointVersion(
        config_version=v.config_version,
        url=v.spec.url,
        event_types=list(v.spec.event_types),
        status=_STATUS_TO_PB.get(v.status, pb.ENDPOINT_STATUS_UNSPECIFIED),
        rate_limit_per_s=v.spec.rate_limit_per_s,
        max_in_flight=v.spec.max_in_flight,
        signing_key_versions=list(v.key_versions),
        changed_at=ts(v.changed_at_ms),
        changed_by=v.changed_by,
        change=v.change,
        deleted=v.status is EndpointStatus.DELETED,
        description=v.spec.description,
        headers=headers_pb(v.spec.headers),
    )
    # A version recorded before its delivery settings were kept leaves them unset: not known.
    if v.delivery_settings_known:
        message.payload_mode = v.spec.payload_mode
        message.payload_fields.extend(v.spec.payload_fields)
        message.ordering_key = v.spec.ordering_key  # set even when "": ordering off, and known
    return message


def summary_pb(d: DeliverySummary) -> Any:
    return pb.DeliverySummary(
        delivery_id=d.delivery_id,
        event_id=d.event_id,
        endpoint_id=d.endpoint_id,
        event_type=d.event_type,
        status=_DELIVERY_TO_PB[d.status],
        attempt_count=d.attempt_count,
        last_http_status=d.last_http_status or 0,
        created_at=ts(d.created_at_ms),
        updated_at=ts(d.updated_at_ms),
    )


def attempt_pb(a: Attempt) -> Any:
    return pb.Attempt(
        attempt_number=a.attempt_number,
        attempt_id=a.attempt_id,
        started_at=ts(a.started_at_ms),
        finished_at=ts(a.finished_at_ms),
        http_status=a.http_status or 0,
        latency_ms=a.latency_ms or 0,
        outcome=a.outcome,
        error_class=a.error_class,
        manual=a.manual,
        endpoint_config_version=a.endpoint_config_version or 0,
        url=a.url,
        signing_key_versions=list(a.signing_key_versions),
        response_sha256=a.response_sha256,
        response_prefix=a.response_prefix,
    )


def detail_pb(d: DeliveryDetail, replay_refusal: str = "") -> Any:
    return pb.DeliveryDetail(
        delivery=summary_pb(d.summary),
        endpoint_config_version=d.endpoint_config_version or 0,
        auto_retry_active=d.auto_retry_active,
        expires_at=ts(d.expires_at_ms),
        next_attempt_at=ts(d.next_attempt_at_ms),
        last_error_class=d.last_error_class,
        attempts=[attempt_pb(a) for a in d.attempts],
        replays=[pb.ReplayAudit(request_id=r.request_id, requested_by=r.requested_by,
                                requested_at=ts(r.requested_at_ms), reason=r.reason, action=r.action)
                 for r in d.replays],
        tier=d.tier,
        replay_refusal=replay_refusal,
    )


def blocked_key_pb(k: BlockedKey) -> Any:
    return pb.BlockedKey(
        ordering_key=k.ordering_key,
        head_delivery_id=k.head_delivery_id,
        head_event_id=k.head_event_id,
        head_object_version=k.head_object_version or 0,
        attempts=k.attempts,
        last_http_status=k.last_http_status or 0,
        last_error_class=k.last_error_class,
        next_attempt_at=ts(k.next_attempt_at_ms),
        waiting=k.waiting,
        blocked_since=ts(k.blocked_since_ms),
        updated_at=ts(k.updated_at_ms),
    )


# -- services ----------------------------------------------------------------------------------


class ControlPlaneServicer(rpc.ControlPlaneServicer):
    def __init__(
        self,
        auth: Authenticator,
        endpoints: EndpointService,
        deliveries: DeliveryService,
        ordering: OrderingService,
        now_ms: Callable[[], int],
    ) -> None:
        self._auth = auth
        self._endpoints = endpoints
        self._deliveries = deliveries
        self._ordering = ordering
        self._now_ms = now_ms

    def _principal(self, context: grpc.ServicerContext) -> Any:
        return self._auth.tenant(context.invocation_metadata())

    def _endpoint(self, e: Endpoint) -> Any:
        return self._endpoints_pb([e])[0]

    def _endpoints_pb(self, endpoints: Sequence[Endpoint]) -> list[Any]:
        pins = self._endpoints.schema_majors(endpoints)  # kept beside the endpoint's row: one read
        return [endpoint_pb(e, self._now_ms(), pins.get(e.endpoint_id, ())) for e in endpoints]

    @mapped
    def CreateEndpoint(self, request: Any, context: grpc.ServicerContext) -> Any:
        created = self._endpoints.create(self._principal(context), spec_of(request), request.request_id,
                                         request.signature_scheme, list(request.schema_majors),
                                         headers_of(request.headers))
        return pb.CreateEndpointResponse(
            endpoint=self._endpoint(created.endpoint), signing_secret=created.signing_secret,
            public_key=created.public_key,
        )

    @mapped
    def GetEndpoint(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._endpoint(self._endpoints.get(self._principal(context), request.endpoint_id))

    @mapped
    def ListEndpoints(self, request: Any, context: grpc.ServicerContext) -> Any:
        page = self._endpoints.list(self._principal(context), request.page_size, request.cursor)
        return pb.ListEndpointsResponse(
            endpoints=self._endpoints_pb(page.items), next_cursor=page.next_cursor
        )

    @mapped
    def UpdateEndpoint(self, request: Any, context: grpc.ServicerContext) -> Any:
        updated = self._endpoints.update(
            self._principal(context),
            request.endpoint_id,
            spec_of(request.endpoint),
            list(request.update_mask.paths),
            list(request.endpoint.schema_majors),
            headers_of(request.endpoint.headers),
            expected_version=(request.expected_config_version
                              if request.HasField("expected_config_version") else None),
        )
        return self._endpoint(updated)

    @mapped
    def DisableEndpoint(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._endpoint(
            self._endpoints.set_enabled(self._principal(context), request.endpoint_id, enabled=False)
        )

    @mapped
    def EnableEndpoint(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._endpoint(
            self._endpoints.set_enabled(self._principal(context), request.endpoint_id, enabled=True)
        )

    @mapped
    def DeleteEndpoint(self, request: Any, context: grpc.ServicerContext) -> Any:
        deleted = self._endpoints.delete(self._principal(context), request.endpoint_id)
        return pb.DeleteEndpointResponse(
            endpoint_id=deleted.endpoint_id, config_version=deleted.config_version
        )

    @mapped
    def ListEndpointVersions(self, request: Any, context: grpc.ServicerContext) -> Any:
        versions = self._endpoints.versions(self._principal(context), request.endpoint_id)
        return pb.ListEndpointVersionsResponse(versions=[version_pb(v) for v in versions])

    @mapped
    def RotateSecret(self, request: Any, context: grpc.ServicerContext) -> Any:
        rotated = self._endpoints.rotate_secret(
            self._principal(context),
            request.endpoint_id,
            revoke_immediately=request.mode == pb.RotateSecretRequest.MODE_REVOKE_IMMEDIATELY,
            overlap_s=request.overlap_seconds,
            signature_scheme=request.signature_scheme,
        )
        return pb.RotateSecretResponse(
            endpoint=self._endpoint(rotated.endpoint),
            signing_secret=rotated.signing_secret,
            public_key=rotated.public_key,
            new_key_version=rotated.new_key_version,
            live_keys=[key_pb(k) for k in rotated.live_keys],
        )

    @mapped
    def VerifyEndpoint(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._endpoint(self._endpoints.verify(self._principal(context), request.endpoint_id))

    @mapped
    def ResendChallenge(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._endpoint(self._endpoints.resend_challenge(self._principal(context), request.endpoint_id))

    @mapped
    def SendTestEvent(self, request: Any, context: grpc.ServicerContext) -> Any:
        sent = self._endpoints.send_test_event(self._principal(context), request.endpoint_id)
        return pb.SendTestEventResponse(event_id=sent.event_id, delivery_id=sent.delivery_id)

    @mapped
    def ListDeliveries(self, request: Any, context: grpc.ServicerContext) -> Any:
        unknown = [s for s in request.statuses if s not in _DELIVERY_FROM_PB]
        if unknown:
            raise errors.InvalidArgument("statuses must be PENDING, SUCCEEDED, FAILED, EXPIRED or SKIPPED")
        page = self._deliveries.list(
            self._principal(context),
            request.endpoint_id,
            [_DELIVERY_FROM_PB[s] for s in request.statuses],
            ms_of(request, "start_time"),
            ms_of(request, "end_time"),
            request.page_size,
            request.cursor,
        )
        # The endpoint index a list reads stays in Cassandra for the whole window (only attempts
        # and events expire early: docs/archive.md), so Cassandra answers every list.
        return pb.ListDeliveriesResponse(
            deliveries=[summary_pb(d) for d in page.items], next_cursor=page.next_cursor, tier="hot"
        )

    @mapped
    def GetDelivery(self, request: Any, context: grpc.ServicerContext) -> Any:
        principal = self._principal(context)
        detail = self._deliveries.get(principal, request.delivery_id)
        return detail_pb(detail, self._deliveries.replay_refusal(principal, detail))

    @mapped
    def ReplayDelivery(self, request: Any, context: grpc.ServicerContext) -> Any:
        replayed = self._deliveries.replay(
            self._principal(context), request.delivery_id, request.request_id, request.reason
        )
        return pb.ReplayDeliveryResponse(
            delivery_id=replayed.delivery_id, request_id=replayed.request_id
        )

    @mapped
    def ListBlockedKeys(self, request: Any, context: grpc.ServicerContext) -> Any:
        page = self._ordering.blocked_keys(self._principal(context), request.endpoint_id, request.page_size,
                                           request.page_token)
        return pb.ListBlockedKeysResponse(keys=[blocked_key_pb(k) for k in page.items],
                                          next_page_token=page.next_cursor)

    @mapped
    def SkipOrderingHead(self, request: Any, context: grpc.ServicerContext) -> Any:
        skipped = self._ordering.skip_head(self._principal(context), request.endpoint_id, request.ordering_key,
                                           request.delivery_id, request.reason, request.request_id)
        return pb.SkipOrderingHeadResponse(delivery_id=skipped.delivery_id, request_id=skipped.request_id)

    @mapped_stream
    def RecoverFailedDeliveries(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        progress = self._deliveries.recover(
            self._principal(context),
            request.endpoint_id,
            ms_of(request, "start_time"),
            ms_of(request, "end_time"),
            request.reason,
        )
        for p in progress:
            yield pb.RecoverProgress(
                total=p.total,
                replayed=p.replayed,
                skipped=p.skipped,
                done=p.done,
                last_delivery_id=p.last_delivery_id,
                not_allowed=p.not_allowed,
                not_allowed_by_rule=dict(p.not_allowed_by_rule),
            )


class AdminServicer(rpc.AdminServicer):
    def __init__(self, auth: Authenticator, admin: AdminService, reconciler: Reconciler,
                 endpoints: EndpointService) -> None:
        self._auth = auth
        self._admin = admin
        self._reconciler = reconciler
        self._endpoints = endpoints

    @mapped
    def Reconcile(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._auth.admin(context.invocation_metadata())
        out = self._reconciler.run(ms_of(request, "start_time"), ms_of(request, "end_time"),
                                   request.tenant_id or None, request.repair, "admin",
                                   request.overdue_after_seconds)
        r = out.report
        return pb.ReconcileReport(
            start_time=ts(r.since_ms), end_time=ts(r.until_ms), tenant_id=r.tenant_id or "",
            counts=dict(r.counts), clean=r.clean,
            gaps=[pb.ReconcileGap(kind=g.kind, id=g.id, tenant_id=g.tenant_id, detail=g.detail) for g in r.gaps],
            repairs=[pb.ReconcileRepair(kind=x.kind, id=x.id, action=x.action, detail=x.detail)
                     for x in out.repairs])

    @mapped
    def ReencryptSigningKeys(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._auth.admin(context.invocation_metadata())
        if request.tenant_id:
            validation.identifier("tenant_id", request.tenant_id)
        r = self._endpoints.reencrypt_keys(request.tenant_id or None, request.dry_run)
        return pb.ReencryptSigningKeysReport(
            current_master_key_id=r.current_id, endpoints_scanned=r.endpoints_scanned,
            endpoints_reencrypted=r.endpoints_reencrypted, keys_reencrypted=r.keys_reencrypted,
            keys_by_master_key=r.keys_by_master_key, unpublished=r.unpublished)

    @mapped
    def CreateTenant(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._auth.admin(context.invocation_metadata())
        verify = request.verify_endpoints if request.HasField("verify_endpoints") else None
        return tenant_pb(self._admin.create_tenant(request.tenant_id, request.name, verify))

    @mapped
    def SetTenantEventTypes(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._auth.admin(context.invocation_metadata())
        tenant, outside = self._admin.set_event_types(request.tenant_id, list(request.allowed_event_types),
                                                      request.unrestricted)
        return pb.SetTenantEventTypesResponse(tenant=tenant_pb(tenant), endpoints_outside=outside)

    @mapped
    def CreateApiKey(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._auth.admin(context.invocation_metadata())
        issued = self._admin.create_api_key(request.tenant_id, request.description, request.read_only)
        return pb.CreateApiKeyResponse(key_id=issued.key.key_id, api_key=issued.plaintext)

    @mapped
    def RevokeApiKey(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._auth.admin(context.invocation_metadata())
        self._admin.revoke_api_key(request.tenant_id, request.key_id)
        return pb.RevokeApiKeyResponse()
