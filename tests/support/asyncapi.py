"""The official AsyncAPI 3.0 JSON Schema, as a `jsonschema` validator.

`make setup` fetches it from the npm registry (@asyncapi/specs, pinned in stack/setup.sh) into
stack/.specs/asyncapi; the AsyncAPI project publishes it nowhere on PyPI. A test that needs it fails
when it is missing rather than skipping, so a checkout that never ran setup cannot pass unchecked.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema.protocols import Validator  # type: ignore[import-untyped]
from jsonschema.validators import validator_for  # type: ignore[import-untyped]

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "stack" / ".specs" / "asyncapi" / "schemas" / "3.0.0.json"


@functools.cache
def _validator() -> Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    # The bundle declares its own draft (draft-07) and carries every definition it references, each
    # under its own $id, so nothing is resolved over the network.
    return validator_for(schema)(schema)


def asyncapi_3_errors(document: Any) -> list[str]:
    """Every place the document breaks the official AsyncAPI 3.0 schema, as 'path: message'."""
    if not SCHEMA_PATH.is_file():
        pytest.fail(f"{SCHEMA_PATH} is missing: run `make setup` (it fetches the AsyncAPI JSON Schema from npm)")
    return [f"{e.json_path}: {e.message}" for e in _validator().iter_errors(document)]
