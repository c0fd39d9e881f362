"""stack.certs: the local test CA and server certificate, created once and then left alone."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509

from stack.certs import SERVER_NAMES, ensure_certs


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_creates_ca_and_server_cert_for_every_local_name(tmp_path: Path) -> None:
    paths, done = ensure_certs(tmp_path)
    assert done[0] == "created CA"
    leaf = x509.load_pem_x509_certificates(paths.server_chain.read_bytes())[0]
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(paths.ca_cert.read_bytes()))
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = {str(n) for n in sans.get_values_for_type(x509.DNSName)}
    names |= {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    assert names == set(SERVER_NAMES)
    assert paths.server_key.stat().st_mode & 0o077 == 0


def test_second_run_changes_nothing(tmp_path: Path) -> None:
    ensure_certs(tmp_path)
    before = _snapshot(tmp_path)
    _, done = ensure_certs(tmp_path)
    assert done == ["certificates already present"]
    assert _snapshot(tmp_path) == before


def test_missing_server_key_is_reissued_under_the_same_ca(tmp_path: Path) -> None:
    paths, _ = ensure_certs(tmp_path)
    ca_before = paths.ca_cert.read_bytes()
    paths.server_key.unlink()
    _, done = ensure_certs(tmp_path)
    assert done == ["issued server cert for " + ", ".join(SERVER_NAMES)]
    assert paths.ca_cert.read_bytes() == ca_before
