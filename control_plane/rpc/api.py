"""The generated protobuf and gRPC modules of the control plane's API, imported from one place.

They are generated into the package :mod:`protogen` (``make proto``), which generates them on first
import if a checkout has none.
"""

from __future__ import annotations

from protogen.webhooks.v1 import control_plane_pb2 as pb
from protogen.webhooks.v1 import control_plane_pb2_grpc as rpc

__all__ = ["pb", "rpc"]
