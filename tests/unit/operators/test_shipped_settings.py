"""What the delivery job ships to its TaskManagers: the dispatcher, pickled
into the job graph as PyFlink does, carries the master key it needs and no admin token or
producer-database credential."""

from __future__ import annotations

import base64

import cloudpickle
from pydantic import SecretStr

from core.settings import Settings, for_taskmanagers
from operators.dispatcher import Dispatcher

ADMIN = "admin-token-that-must-stay-home"
DSN_PASSWORD = "pg-password-that-must-stay-home"
MASTER = base64.b64encode(b"k" * 32).decode()


def settings() -> Settings:
    s = Settings()
    return s.model_copy(update={
        "master_key": SecretStr(MASTER),
        "control_plane": s.control_plane.model_copy(update={"admin_token": SecretStr(ADMIN)}),
        "outbox": s.outbox.model_copy(update={"dsn": f"host=db user=app password={DSN_PASSWORD}"}),
    })


def test_the_shipped_dispatcher_carries_the_master_key_and_no_other_secret() -> None:
    shipped = cloudpickle.dumps(Dispatcher(for_taskmanagers(settings())))
    assert ADMIN.encode() not in shipped
    assert DSN_PASSWORD.encode() not in shipped
    assert MASTER.encode() in shipped  # the dispatcher decrypts signing secrets with it


def test_the_whole_settings_would_have_leaked_them() -> None:
    """The check above can fail: shipping the settings as they are carries both secrets."""
    shipped = cloudpickle.dumps(Dispatcher(settings()))
    assert ADMIN.encode() in shipped and DSN_PASSWORD.encode() in shipped


def test_nothing_else_changes() -> None:
    s = settings()
    t = for_taskmanagers(s)
    assert t.dispatch == s.dispatch and t.cassandra == s.cassandra and t.kafka == s.kafka
    assert t.master_key_bytes() == s.master_key_bytes()


def test_with_a_key_file_the_job_graph_carries_no_master_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Production reads the key from a file on each machine: the pickled dispatcher holds the
    file's path and not the key, and the unpickled side gets the key from the file."""
    key_file = tmp_path / "master.key"
    key_file.write_text(MASTER)
    s = settings().model_copy(update={"master_key_file": key_file})
    shipped = cloudpickle.dumps(Dispatcher(for_taskmanagers(s)))
    assert MASTER.encode() not in shipped and base64.b64decode(MASTER) not in shipped
    assert ADMIN.encode() not in shipped
    arrived: Dispatcher = cloudpickle.loads(shipped)
    assert arrived._settings.master_key_bytes() == base64.b64decode(MASTER)
