"""Production mode refuses every development default, naming the setting, and
the master key can come from a file each machine reads itself (item 9)."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from core.settings import DEV_MASTER_KEY, REPO_ROOT, Settings

KEY = base64.b64encode(b"p" * 32).decode()


@pytest.fixture
def production(tmp_path: Path) -> dict[str, object]:
    """Everything a production deployment sets; each test takes one thing away."""
    key_file = tmp_path / "master.key"
    key_file.write_text(KEY + "\n")
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    cert.write_text("cert"), key.write_text("key")
    return {"mode": "production", "master_key_file": key_file,
            "control_plane": {"admin_token": "a-long-random-admin-token", "tls_cert_file": cert, "tls_key_file": key}}


def test_a_complete_production_configuration_starts(production: dict[str, object]) -> None:
    s = Settings(**production)  # type: ignore[arg-type]
    assert s.production_problems() == []
    assert s.master_key_bytes() == b"p" * 32


def _without(production: dict[str, object], field: str) -> dict[str, object]:
    cp = dict(production["control_plane"])  # type: ignore[call-overload]
    out = {**production, "control_plane": cp}
    if field == "master_key_file":
        del out["master_key_file"]
    elif field == "admin_token":
        del cp["admin_token"]
    elif field == "tls":
        del cp["tls_cert_file"], cp["tls_key_file"]
    elif field == "dev_allow_cidrs":
        out["egress"] = {"dev_allow_cidrs": ["127.0.0.0/8"]}
    return out


@pytest.mark.parametrize(("missing", "named"), [
    ("master_key_file", "master_key_file is unset"),
    ("admin_token", "control_plane.admin_token is the development token"),
    ("tls", "control_plane.tls_cert_file/tls_key_file are unset"),
    ("dev_allow_cidrs", "egress.dev_allow_cidrs is set"),
])
def test_each_development_default_is_refused_by_name(production: dict[str, object], missing: str, named: str) -> None:
    with pytest.raises(ValidationError, match="mode=production refuses development defaults") as err:
        Settings(**_without(production, missing))  # type: ignore[arg-type]
    assert named in str(err.value)
    # ...and only that one: the message is a to-do list, not noise.
    assert str(err.value).count(";") == 0


def test_the_dev_key_in_a_file_is_refused(production: dict[str, object], tmp_path: Path) -> None:
    dev = tmp_path / "dev.key"
    dev.write_text(DEV_MASTER_KEY)
    with pytest.raises(ValidationError, match="holds the development key"):
        Settings(**{**production, "master_key_file": dev})  # type: ignore[arg-type]


def test_an_empty_admin_token_is_refused_too(production: dict[str, object]) -> None:
    cp = {**production["control_plane"], "admin_token": ""}  # type: ignore[dict-item]
    with pytest.raises(ValidationError, match="admin_token"):
        Settings(**{**production, "control_plane": cp})  # type: ignore[arg-type]


def test_dev_mode_allows_the_defaults() -> None:
    s = Settings()
    assert s.mode == "dev" and len(s.production_problems()) == 3


@pytest.mark.parametrize(("content", "error"), [
    (None, "No such file"), ("not base64!", "must hold base64"),
    (base64.b64encode(b"short").decode(), "must decode to 32 bytes, got 5")])
def test_a_bad_master_key_file_fails_at_start_naming_it(tmp_path: Path, content: str | None, error: str) -> None:
    f = tmp_path / "k"
    if content is not None:
        f.write_text(content)
    with pytest.raises(ValidationError, match=error) as err:
        Settings(master_key_file=f)
    assert str(f) in str(err.value)


def test_tls_files_go_together(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="set both or neither"):
        Settings(control_plane={"tls_cert_file": tmp_path / "c.pem"})  # type: ignore[arg-type]


def test_the_key_file_wins_over_the_environment_key(tmp_path: Path) -> None:
    f = tmp_path / "k"
    f.write_text(KEY)
    s = Settings(master_key=SecretStr(base64.b64encode(b"e" * 32).decode()), master_key_file=f)
    assert s.master_key_bytes() == b"p" * 32


@pytest.mark.parametrize("module", ["control_plane.server", "jobs.delivery_job"])
def test_the_processes_refuse_to_start_with_a_clear_message(module: str) -> None:
    """The real entry points, not only the settings object: exit status 2, every problem named,
    no traceback, before any connection is attempted."""
    env = {"WEBHOOKS_MODE": "production", "PATH": "/usr/bin:/bin", "HOME": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", module], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "refusing to start" in proc.stderr and "Traceback" not in proc.stderr
    for name in ("master_key_file", "control_plane.admin_token", "control_plane.tls_cert_file"):
        assert name in proc.stderr
