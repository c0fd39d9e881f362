"""The control plane's catalog for :class:`outbox.schemas.SchemaGuard`, over gRPC.

Kept apart from outbox.schemas so an application that passes its own CatalogSource does not
import gRPC.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from core.event_schemas import SchemaVersion
from outbox.schemas import CatalogType, CatalogUnavailable, TenantCatalog
from protogen.webhooks.v1 import catalog_pb2 as cpb
from protogen.webhooks.v1 import catalog_pb2_grpc as crpc


class GrpcCatalog:
    """The control plane's EventCatalog.GetCatalog with the tenant's API key."""

    def __init__(self, target: str, api_key: str, *, ca_file: str | None = None, insecure: bool = False,
                 timeout_s: float = 5.0) -> None:
        if insecure:
            self._channel = grpc.insecure_channel(target)
        else:
            roots = Path(ca_file).read_bytes() if ca_file else None
            self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots))
        self._stub = crpc.EventCatalogStub(self._channel)
        self._md = (("authorization", f"Bearer {api_key}"),)
        self._timeout_s = timeout_s

    def fetch(self, tenant_id: str) -> TenantCatalog:
        try:
            answer = self._stub.GetCatalog(cpb.GetCatalogRequest(tenant_id=tenant_id), metadata=self._md,
                                           timeout=self._timeout_s)
        except grpc.RpcError as exc:
            status = f"{exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
            raise CatalogUnavailable(f"GetCatalog: {status}") from exc
        return TenantCatalog(
            types={t.name: CatalogType(t.enforcement, {SchemaVersion.parse(v.version): json.loads(v.schema_json)
                                                       for v in t.versions})
                   for t in answer.event_types},
            unknown_types=answer.settings.unknown_types or "reject",
            published=bool(answer.event_types) or not answer.settings.is_default)

    def close(self) -> None:
        self._channel.close()
