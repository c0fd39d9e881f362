"""Create, if missing, the local test CA and a server certificate for the recording receiver.

    python -m stack.certs --out .run/certs

Writes into DIR:
  ca.pem      the test CA certificate; the dispatcher trusts it through its `ca_bundle` setting
  ca.key      the CA's private key, kept so a missing or stale server cert can be re-issued
              without replacing a CA that running processes already trust
  server.pem  the server certificate chain (leaf first) for localhost, 127.0.0.1, ::1, receiver.test
  server.key  the server's private key

Idempotent: files that exist and still fit together are left alone, so running it twice changes
nothing. The certificates are for tests on 127.0.0.1 only; never trust ca.pem anywhere else.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

SERVER_NAMES: tuple[str, ...] = ("localhost", "127.0.0.1", "::1", "receiver.test")


@dataclass(frozen=True)
class CertPaths:
    ca_cert: Path
    ca_key: Path
    server_chain: Path
    server_key: Path

    @classmethod
    def under(cls, out: Path) -> CertPaths:
        return cls(out / "ca.pem", out / "ca.key", out / "server.pem", out / "server.key")


def ensure_certs(out: Path) -> tuple[CertPaths, list[str]]:
    """Make sure DIR holds a CA and a server cert signed by it; return the paths and what was done."""
    out.mkdir(parents=True, exist_ok=True)
    paths = CertPaths.under(out)
    done: list[str] = []

    ca = _load_ca(paths)
    if ca is None:
        if paths.ca_cert.exists() and _server_fits(paths):
            # No CA key, but the pair on disk is valid: nothing needs signing.
            return paths, ["kept existing ca.pem and server cert (no ca.key; nothing to re-issue)"]
        ca = trustme.CA(organization_name="webhooks local test CA")
        ca.cert_pem.write_to_path(str(paths.ca_cert))
        _write_private(paths.ca_key, ca.private_key_pem.bytes())
        done.append("created CA")

    if done or not _server_fits(paths):
        leaf = ca.issue_cert(*SERVER_NAMES, common_name="localhost")
        with paths.server_chain.open("wb") as f:
            for pem in leaf.cert_chain_pems:
                f.write(pem.bytes())
        _write_private(paths.server_key, leaf.private_key_pem.bytes())
        done.append("issued server cert for " + ", ".join(SERVER_NAMES))
    return paths, done or ["certificates already present"]


def _load_ca(paths: CertPaths) -> trustme.CA | None:
    if not (paths.ca_cert.exists() and paths.ca_key.exists()):
        return None
    return trustme.CA.from_pem(paths.ca_cert.read_bytes(), paths.ca_key.read_bytes())


def _server_fits(paths: CertPaths) -> bool:
    """True when server.pem and server.key are a pair, issued by ca.pem, covering every SERVER_NAME."""
    if not (paths.server_chain.exists() and paths.server_key.exists() and paths.ca_cert.exists()):
        return False
    try:
        leaf = x509.load_pem_x509_certificates(paths.server_chain.read_bytes())[0]
        ca_cert = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
        leaf.verify_directly_issued_by(ca_cert)
        key = serialization.load_pem_private_key(paths.server_key.read_bytes(), password=None)
        if key.public_key() != leaf.public_key():
            return False
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, IndexError, x509.ExtensionNotFound, InvalidSignature):
        return False
    covered = {str(n) for n in sans.get_values_for_type(x509.DNSName)}
    covered |= {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    wanted = {str(ipaddress.ip_address(n)) if _is_ip(n) else n for n in SERVER_NAMES}
    return wanted <= covered


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack.certs", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="directory for ca.pem, ca.key, server.pem, server.key"
    )
    args = parser.parse_args(argv)
    paths, done = ensure_certs(args.out)
    for line in done:
        print(f"[certs] {line}")
    print(f"[certs] ca_bundle={paths.ca_cert} cert={paths.server_chain} key={paths.server_key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
