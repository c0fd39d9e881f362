"""The gRPC API over TLS: a real control plane serving the locally generated
server certificate on 127.0.0.1, against the real Cassandra and Kafka, and `webhookctl` with
--ca / --insecure against it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from control_plane.cli import main as cli
from control_plane.server import build
from core.settings import Settings
from stack.certs import CertPaths, ensure_certs
from stack.isolation import keyspace_session

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls_server(settings: Settings, certs: Path, kafka_bootstrap: str) -> Iterator[tuple[str, CertPaths]]:
    paths = CertPaths.under(certs)
    cp = settings.control_plane.model_copy(update={"tls_cert_file": paths.server_chain,
                                                   "tls_key_file": paths.server_key})
    cassandra = settings.cassandra.model_copy(update={"keyspace": settings.cassandra.keyspace + "_tls"})
    local = settings.model_copy(update={"control_plane": cp, "cassandra": cassandra})
    with keyspace_session(local) as session:
        server = build(local, session, port=0)
        server.start()
        yield f"127.0.0.1:{server.port}", paths
        server.stop(grace_s=2)


def _serving(channel: grpc.Channel) -> bool:
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.RpcError as err:
        assert err.code() is grpc.StatusCode.UNAVAILABLE, err  # the handshake, not the service
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_client_trusting_the_ca_is_served(tls_server: tuple[str, CertPaths]) -> None:
    address, paths = tls_server
    creds = grpc.ssl_channel_credentials(root_certificates=paths.ca_cert.read_bytes())
    with grpc.secure_channel(address, creds) as ch:
        assert _serving(ch)


def test_plaintext_and_untrusted_clients_are_not(tls_server: tuple[str, CertPaths], tmp_path: Path) -> None:
    address, _ = tls_server
    with grpc.insecure_channel(address) as ch:
        assert not _serving(ch)
    other, _ = ensure_certs(tmp_path / "other-ca")  # a CA that did not sign the server's cert
    creds = grpc.ssl_channel_credentials(root_certificates=other.ca_cert.read_bytes())
    with grpc.secure_channel(address, creds) as ch:
        assert not _serving(ch)


def test_webhookctl_with_ca_and_insecure(tls_server: tuple[str, CertPaths], settings: Settings,
                                         monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    address, paths = tls_server
    monkeypatch.setenv("WEBHOOKCTL_ADMIN_TOKEN", settings.control_plane.admin_token.get_secret_value())
    tenant = "tls-" + uuid.uuid4().hex[:10]
    assert cli.main(["--target", address, "--ca", str(paths.ca_cert), "tenants", "create", "--id", tenant]) == 0
    assert tenant in capsys.readouterr().out
    # Plaintext against the TLS port: the call fails, and says so.
    plain = ["--target", address, "--insecure", "--timeout", "5", "tenants", "create", "--id", tenant + "x"]
    assert cli.main(plain) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err
    assert cli.main(["--target", address, "--ca", "/nonexistent/ca.pem", "tenants", "create"]) == 2
    assert "--ca /nonexistent/ca.pem" in capsys.readouterr().err
