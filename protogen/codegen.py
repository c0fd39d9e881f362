"""Generate the Python protobuf and gRPC code of proto/ into the package protogen (git-ignored).

`python -m protogen` (protogen/__main__.py) is what `make proto` and `make setup` run before
anything imports the API. It only runs protoc when a .proto (or this file) is newer than its generated module, so
calling it before every test run costs nothing.

protoc writes absolute imports of the proto package (``from webhooks.v1 import common_pb2``),
which only resolve with the output directory on ``sys.path``. The generated modules are rewritten
to import inside this package instead (``from . import common_pb2`` within one proto package,
``from protogen.webhooks...`` across), and their message classes name the module they are in, so
``protogen.webhooks.v1.control_plane_pb2`` imports from anywhere with no path set up.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
GEN_DIR = Path(__file__).resolve().parent
PACKAGE = GEN_DIR.name
# The proto packages under proto/ (webhooks.v1, and the vendored google.api of the HTTP
# annotations): their imports are rewritten; others (google.protobuf) come from the protobuf
# runtime as they are.
_IMPORT = re.compile(r"^from (?P<package>[\w.]+) import (?P<rest>.*)$", re.MULTILINE)
_BUILD = re.compile(r"BuildTopDescriptorsAndMessages\(DESCRIPTOR, '[\w.]+', _globals\)")


def _outputs(proto: Path) -> list[Path]:
    rel = proto.relative_to(PROTO_DIR).with_suffix("")
    return [GEN_DIR / f"{rel}_pb2.py", GEN_DIR / f"{rel}_pb2_grpc.py", GEN_DIR / f"{rel}_pb2.pyi"]


def _stale(proto: Path) -> bool:
    newest_input = max(proto.stat().st_mtime, Path(__file__).stat().st_mtime)
    return any(not out.exists() or out.stat().st_mtime < newest_input for out in _outputs(proto))


def package_relative(source: str, module_package: str, proto_roots: set[str]) -> str:
    """``source``, a module generated into ``module_package`` (``webhooks.v1``), with its imports
    of the protos' own packages (``proto_roots`` and the packages under them) made to resolve
    inside this package."""

    def rewrite(m: re.Match[str]) -> str:
        package = m.group("package")
        if not any(package == root or package.startswith(root + ".") for root in proto_roots):
            return m.group(0)
        if package == module_package:
            return f"from . import {m.group('rest')}"
        return f"from {PACKAGE}.{package} import {m.group('rest')}"

    source = _IMPORT.sub(rewrite, source)
    return _BUILD.sub("BuildTopDescriptorsAndMessages(DESCRIPTOR, __name__, _globals)", source)


def _rewrite(proto: Path, proto_roots: set[str]) -> None:
    module_package = ".".join(proto.relative_to(PROTO_DIR).parent.parts)
    for out in _outputs(proto):
        out.write_text(package_relative(out.read_text(), module_package, proto_roots))


def _ensure_packages() -> None:
    # Namespace packages would work too, but explicit __init__.py files keep tools (mypy,
    # pytest's rootdir logic) from guessing.
    for directory in (p for p in GEN_DIR.rglob("*") if p.is_dir()):
        init = directory / "__init__.py"
        if directory.name != "__pycache__" and not init.exists():
            init.touch()


def generate() -> list[Path]:
    """Regenerate stale modules; returns the protos that were compiled."""
    protos = sorted(PROTO_DIR.rglob("*.proto"))
    stale = [p for p in protos if _stale(p)]
    if stale:
        include = str(Path(protoc.__file__).resolve().parent / "_proto")  # google/protobuf/*.proto
        args = [
            "protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={GEN_DIR}",
            f"--pyi_out={GEN_DIR}",
            f"--grpc_python_out={GEN_DIR}",
            *(str(p) for p in stale),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed for {', '.join(map(str, stale))}")
        # Whole package paths: google.api is ours (vendored), google.protobuf the runtime's.
        roots = {".".join(p.relative_to(PROTO_DIR).parent.parts) for p in protos}
        for proto in stale:
            _rewrite(proto, roots)
    _ensure_packages()
    return stale


def main() -> int:
    try:
        compiled = generate()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"protogen: {len(compiled)} proto(s) compiled into {GEN_DIR}")
    return 0
