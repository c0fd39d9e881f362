"""stack/local_receivers.sh: `make run LOCAL_RECEIVERS=1`, the one switch that lets the local stack
deliver to `webhookctl listen` on 127.0.0.1:8443. Runs the shell functions the control plane's
and the job's scripts call, in a run directory of its own, and judges the environment they export
with the project's own Settings and egress policy."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from control_plane.errors import InvalidArgument
from control_plane.validation import DestinationValidator
from core.egress import EgressPolicy
from core.settings import REPO_ROOT, Settings
from stack.isolation import settings_with

LISTENER_URL = "https://127.0.0.1:8443/webhookctl-listen"


def shell(run_dir: Path, function: str, **env: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Call ``function "control plane" <part dir>`` as control_plane.sh does; the WEBHOOKS_*
    variables it leaves exported."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("WEBHOOKS_") and k != "LOCAL_RECEIVERS"}
    script = (f'source "{REPO_ROOT}/stack/lib.sh"; source "{REPO_ROOT}/stack/local_receivers.sh"; '
              f'{function} "control plane" "{run_dir}/control-plane"; env -0 > "{run_dir}/env"')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30,
                         env={**base, "WEBHOOKS_RUN_DIR": str(run_dir), **env})
    exported: dict[str, str] = {}
    if out.returncode == 0:
        pairs = (item.split("=", 1) for item in (run_dir / "env").read_text().split("\0") if "=" in item)
        exported = {k: v for k, v in pairs if k.startswith(("WEBHOOKS_EGRESS", "WEBHOOKS_DISPATCH"))}
    return out, exported


def accepts_listener(exported: dict[str, str]) -> bool:
    policy = EgressPolicy.from_settings(settings_with(exported).egress)
    try:
        DestinationValidator(policy)(LISTENER_URL)
    except InvalidArgument:
        return False
    return True


def test_the_switch_allows_the_listener_trusts_the_dev_ca_and_warns(tmp_path: Path) -> None:
    out, exported = shell(tmp_path, "local_receivers_apply", LOCAL_RECEIVERS="1")
    assert out.returncode == 0, out.stderr
    assert exported == {
        "WEBHOOKS_EGRESS__DEV_ALLOW_CIDRS": '["127.0.0.1/32"]',
        "WEBHOOKS_EGRESS__ALLOWED_PORTS": "[443, 8443]",
        "WEBHOOKS_DISPATCH__CA_BUNDLE": f"{tmp_path}/certs/ca.pem",
    }
    assert accepts_listener(exported)
    assert "WARNING: control plane: LOCAL_RECEIVERS is on" in out.stderr
    assert (tmp_path / "control-plane" / "local-receivers").exists()


def test_without_the_switch_the_policy_stays_strict_and_the_marker_goes(tmp_path: Path) -> None:
    (tmp_path / "control-plane").mkdir()
    (tmp_path / "control-plane" / "local-receivers").touch()  # from an earlier start with the switch
    out, exported = shell(tmp_path, "local_receivers_apply")
    assert out.returncode == 0, out.stderr
    assert exported == {} and not accepts_listener(exported)
    assert out.stderr == ""
    assert not (tmp_path / "control-plane" / "local-receivers").exists()


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"LOCAL_RECEIVERS": "1", "WEBHOOKS_MODE": "production"}, "production mode refuses deliveries to 127.0.0.1"),
        ({"LOCAL_RECEIVERS": "yes"}, "LOCAL_RECEIVERS must be 1 (on) or 0 (off), not 'yes'"),
    ],
)
def test_refused(tmp_path: Path, env: dict[str, str], says: str) -> None:
    out, _ = shell(tmp_path, "local_receivers_apply", **env)
    assert out.returncode == 1 and says in out.stderr
    assert not (tmp_path / "control-plane" / "local-receivers").exists()


def test_production_settings_refuse_what_the_switch_exports_too(tmp_path: Path) -> None:
    """The second line of defence (core.settings.production_problems), should the variables be set
    by hand: a production process refuses to start with them."""
    _, exported = shell(tmp_path, "local_receivers_apply", LOCAL_RECEIVERS="1")
    with pytest.raises(ValidationError, match="egress.dev_allow_cidrs is set"):
        settings_with({**exported, "WEBHOOKS_MODE": "production"})
    assert Settings.model_fields["mode"].default == "dev"


@pytest.mark.parametrize(
    ("started_with_switch", "asked", "rc", "says"),
    [
        (True, "", 0, "WARNING: control plane: LOCAL_RECEIVERS is on"),  # plain `make run`: still on, said so
        (True, "1", 0, "WARNING: control plane: LOCAL_RECEIVERS is on"),
        (False, "1", 1, "control plane already runs without LOCAL_RECEIVERS; to turn it on: make down, "
                        "then make run LOCAL_RECEIVERS=1"),
        (False, "", 0, ""),
    ],
)
def test_a_running_part_says_whether_it_has_the_switch(tmp_path: Path, started_with_switch: bool, asked: str,
                                                      rc: int, says: str) -> None:
    (tmp_path / "control-plane").mkdir()
    if started_with_switch:
        (tmp_path / "control-plane" / "local-receivers").touch()
    out, _ = shell(tmp_path, "local_receivers_check", **({"LOCAL_RECEIVERS": asked} if asked else {}))
    assert out.returncode == rc
    assert says in out.stderr and (says or out.stderr == "")
