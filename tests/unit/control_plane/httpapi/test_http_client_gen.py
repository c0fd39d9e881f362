"""The client generation step of the build (control_plane.httpapi.client_gen), with a stand-in for
openapi-python-client that records its arguments: it runs on the current document, only when the
document changed, and says what is missing when the generator is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from control_plane.httpapi import client_gen as http_client_gen
from control_plane.httpapi import openapi_doc
from control_plane.httpapi.transcoding import routes


def _stand_in(tmp_path: Path) -> Path:
    script = tmp_path / "openapi-python-client"
    script.write_text("#!/bin/sh\n"
                      f"echo \"$@\" >> {tmp_path}/calls\n"
                      'while [ "$1" != "--output-path" ]; do shift; done\n'
                      'mkdir -p "$2" && touch "$2/__init__.py"\n')
    script.chmod(0o755)
    return script


def test_generates_from_the_current_document_and_again_only_when_it_changes(tmp_path: Path) -> None:
    generator, out = _stand_in(tmp_path), tmp_path / "out"
    assert http_client_gen.generate(out, generator=generator)
    assert (out / http_client_gen.PACKAGE / "__init__.py").exists()
    assert json.loads((out / "openapi.json").read_text()) == openapi_doc.document(routes(openapi_doc.services()))
    call = (tmp_path / "calls").read_text().split()
    assert call[:3] == ["generate", "--path", str(out / "openapi.json")] and "--meta" in call
    assert not http_client_gen.generate(out, generator=generator)  # unchanged: not run again
    (out / "openapi.json").write_text("{}")
    assert http_client_gen.generate(out, generator=generator)
    assert len((tmp_path / "calls").read_text().splitlines()) == 2


def test_a_missing_generator_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="make setup installs it"):
        http_client_gen.generate(tmp_path / "out", generator=tmp_path / "nowhere")
