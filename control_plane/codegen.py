"""Generate the Python gRPC code from proto/ into control_plane/gen/ (git-ignored).

`python -m control_plane.codegen` is what the Makefile runs before anything imports the API.
It only runs protoc when a .proto is newer than its generated module, so calling it before
every test run costs nothing. protoc writes `from webhooks.v1 import ...` imports, so
control_plane/api.py puts gen/ on sys.path rather than us rewriting generated files.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
GEN_DIR = Path(__file__).resolve().parent / "gen"


def _stale(proto: Path) -> bool:
    rel = proto.relative_to(PROTO_DIR).with_suffix("")
    outputs = [GEN_DIR / f"{rel}_pb2.py", GEN_DIR / f"{rel}_pb2_grpc.py", GEN_DIR / f"{rel}_pb2.pyi"]
    newest_input = max(proto.stat().st_mtime, Path(__file__).stat().st_mtime)
    return any(not out.exists() or out.stat().st_mtime < newest_input for out in outputs)


def _ensure_packages() -> None:
    # Namespace packages would work too, but explicit __init__.py files keep tools (mypy,
    # pytest's rootdir logic) from guessing.
    for directory in [GEN_DIR, *(p for p in GEN_DIR.rglob("*") if p.is_dir())]:
        init = directory / "__init__.py"
        if directory.name != "__pycache__" and not init.exists():
            init.touch()


def generate() -> list[Path]:
    """Regenerate stale modules; returns the protos that were compiled."""
    protos = sorted(PROTO_DIR.rglob("*.proto"))
    stale = [p for p in protos if _stale(p)]
    GEN_DIR.mkdir(exist_ok=True)
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
    _ensure_packages()
    return stale


def main() -> int:
    try:
        compiled = generate()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"control_plane.codegen: {len(compiled)} proto(s) compiled into {GEN_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
