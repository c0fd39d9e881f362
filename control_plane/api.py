"""The generated protobuf and gRPC modules, imported from one place.

gen/ is produced by `python -m control_plane.codegen` (the Makefile runs it). A fresh checkout
that skipped it still works: the first import generates the code instead of failing.
"""

from __future__ import annotations

import sys

from control_plane import codegen

if str(codegen.GEN_DIR) not in sys.path:
    # protoc emits absolute imports (`from webhooks.v1 import control_plane_pb2`).
    sys.path.append(str(codegen.GEN_DIR))

try:
    from webhooks.v1 import control_plane_pb2 as pb
    from webhooks.v1 import control_plane_pb2_grpc as rpc
except ImportError:
    codegen.generate()
    from webhooks.v1 import control_plane_pb2 as pb
    from webhooks.v1 import control_plane_pb2_grpc as rpc

__all__ = ["pb", "rpc"]
