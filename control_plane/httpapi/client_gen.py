"""Generate the Python client of the HTTP API from its OpenAPI document, in the build (git-ignored).

``python -m control_plane.httpapi.client_gen`` (``make http-client``; ``make setup`` runs it) writes the document
(control_plane.httpapi.openapi_doc) to build/http-client/openapi.json and, when it changed, runs
openapi-python-client on it into build/http-client/webhooks_http_client: a package with one
module per operation (``api.control_plane.create_endpoint.sync(client=..., body=...)``) and one
model per schema. Nothing of it is written by hand or committed; the integration test of the tour
imports it from there (tests/integration/test_http_api.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from control_plane.httpapi import openapi_doc
from control_plane.httpapi.transcoding import routes
from core.settings import REPO_ROOT

OUT = REPO_ROOT / "build" / "http-client"
PACKAGE = "webhooks_http_client"
# No post hooks: they would run whichever ruff is on PATH over generated code nobody edits.
_CONFIG = f"project_name_override: webhooks-http-client\npackage_name_override: {PACKAGE}\npost_hooks: []\n"


def generate(out: Path = OUT, force: bool = False, generator: Path | None = None) -> bool:
    """Regenerate when the document changed (or ``force``); True if it ran the generator."""
    out.mkdir(parents=True, exist_ok=True)
    document = out / "openapi.json"
    text = json.dumps(openapi_doc.document(routes(openapi_doc.services())), indent=2) + "\n"
    package = out / PACKAGE
    if not force and package.is_dir() and document.exists() and document.read_text() == text:
        return False
    generator = generator or Path(sys.executable).parent / "openapi-python-client"
    if not generator.exists():
        raise RuntimeError(f"{generator} not found: make setup installs it from requirements.lock")
    document.write_text(text)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(_CONFIG)
        staged = Path(tmp) / PACKAGE
        subprocess.run([str(generator), "generate", "--path", str(document), "--output-path", str(staged),
                        "--meta", "none", "--config", str(config)], check=True, capture_output=True, text=True)
        shutil.rmtree(package, ignore_errors=True)
        shutil.copytree(staged, package)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--force", action="store_true", help="regenerate even if the document did not change")
    parser.add_argument("--generator", type=Path, help="the openapi-python-client to run (default: the venv's)")
    args = parser.parse_args()
    try:
        ran = generate(force=args.force, generator=args.generator)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr if isinstance(exc, subprocess.CalledProcessError) else str(exc)
        print(f"http client: {detail}", file=sys.stderr)
        return 1
    print(f"http client: {OUT / PACKAGE} {'generated' if ran else 'up to date'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
