"""The generated modules of proto/webhooks/v1/catalog.proto, imported from one place (as api.py)."""

from __future__ import annotations

from protogen.webhooks.v1 import catalog_pb2 as cpb
from protogen.webhooks.v1 import catalog_pb2_grpc as crpc

__all__ = ["cpb", "crpc"]
