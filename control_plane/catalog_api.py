"""The generated modules of proto/webhooks/v1/catalog.proto, imported from one place (as api.py)."""

from __future__ import annotations

from control_plane import api as _api  # puts gen/ on sys.path (and generates it if missing)

try:
    from webhooks.v1 import catalog_pb2 as cpb
    from webhooks.v1 import catalog_pb2_grpc as crpc
except ImportError:
    _api.codegen.generate()
    from webhooks.v1 import catalog_pb2 as cpb
    from webhooks.v1 import catalog_pb2_grpc as crpc

__all__ = ["cpb", "crpc"]
