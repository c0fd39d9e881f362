"""The generated API code is one importable package: no module puts anything on ``sys.path``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from protogen import codegen

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("core", "operators", "outbox", "control_plane", "jobs", "bench", "stack", "protogen")


def test_imports_of_the_protos_own_packages_are_made_package_relative() -> None:
    generated = ("from google.protobuf import timestamp_pb2 as _timestamp_pb2\n"
                 "from webhooks.v1 import control_plane_pb2 as webhooks_dot_v1_dot_control__plane__pb2\n"
                 "from webhooks.v2 import common_pb2 as webhooks_dot_v2_dot_common__pb2\n"
                 "_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'webhooks.v1.control_plane_pb2', _globals)\n")
    assert codegen.package_relative(generated, "webhooks.v1", {"webhooks"}).splitlines() == [
        "from google.protobuf import timestamp_pb2 as _timestamp_pb2",
        "from . import control_plane_pb2 as webhooks_dot_v1_dot_control__plane__pb2",
        "from protogen.webhooks.v2 import common_pb2 as webhooks_dot_v2_dot_common__pb2",
        "_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, __name__, _globals)",
    ]


def test_the_vendored_google_api_package_is_ours_and_google_protobuf_stays_the_runtimes() -> None:
    generated = ("from google.api import http_pb2 as google_dot_api_dot_http__pb2\n"
                 "from google.protobuf import descriptor_pb2 as google_dot_protobuf_dot_descriptor__pb2\n")
    assert codegen.package_relative(generated, "webhooks.v1", {"webhooks.v1", "google.api"}).splitlines() == [
        "from protogen.google.api import http_pb2 as google_dot_api_dot_http__pb2",
        "from google.protobuf import descriptor_pb2 as google_dot_protobuf_dot_descriptor__pb2",
    ]


def test_the_stubs_import_with_nothing_added_to_the_path() -> None:
    probe = ("import sys; before = list(sys.path)\n"
             "from protogen.webhooks.v1 import catalog_pb2_grpc, control_plane_pb2, portal_pb2\n"
             "from protogen.webhooks.v1 import control_plane_pb2_grpc\n"
             "assert sys.path == before, set(sys.path) ^ set(before)\n"
             "assert 'webhooks' not in sys.modules\n"
             "assert control_plane_pb2.Endpoint.__module__ == 'protogen.webhooks.v1.control_plane_pb2'\n"
             "assert control_plane_pb2_grpc.ControlPlaneStub and catalog_pb2_grpc.EventCatalogStub\n"
             "assert portal_pb2.DESCRIPTOR.name == 'webhooks/v1/portal.proto'\n")
    subprocess.run([sys.executable, "-c", probe], cwd=REPO, check=True)


def test_no_module_of_the_project_edits_sys_path() -> None:
    edits = [f"{p.relative_to(REPO)}:{n}" for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
             if "protogen/webhooks" not in p.as_posix()
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if "sys.path." in line or "sys.path =" in line or "sys.path[" in line]
    assert edits == []
