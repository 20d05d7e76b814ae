"""Certificates for the emulator's TLS: a private CA and server certificates, made with ``cryptography``.

Tests and local setups need a certificate the client can verify without a public CA:
``make_pki`` writes a CA (``ca.pem``, what a client trusts through ``tlsCAFile``) and a server
certificate with its key (``server.pem``, what ``--tls-certificate-key-file`` serves) for the host
names and addresses given. A certificate for other names shows a hostname mismatch; a second CA
shows an untrusted certificate.

    python -m mongocdc_devstack.tls DIR [--host localhost] [--ip 127.0.0.1]

``cryptography`` is a development dependency (the ``dev`` extra); the emulator itself only needs
the PEM files.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pki:
    """Paths of a CA certificate and of a server's certificate+key PEM signed by it."""

    ca_file: str
    server_file: str


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mongocdc devstack"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])  # fmt: skip


def make_pki(directory: str, hosts: Sequence[str] = ("localhost",), ips: Sequence[str] = ("127.0.0.1",),
             ca_name: str | None = None) -> Pki:  # fmt: skip
    """Write ``ca.pem`` and ``server.pem`` (certificate for ``hosts``/``ips`` and its key) into ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    os.makedirs(directory, exist_ok=True)
    ca_name = ca_name or f"mongocdc test CA {os.urandom(4).hex()}"  # distinct CAs never share a name
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    later = now + datetime.timedelta(days=365)
    ca_key = _key()
    ca_cert = (
        x509.CertificateBuilder().subject_name(_name(ca_name)).issuer_name(_name(ca_name))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(later)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    server_key = _key()
    names: list[x509.GeneralName] = [x509.DNSName(h) for h in hosts]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    server_cert = (
        x509.CertificateBuilder().subject_name(_name(hosts[0] if hosts else ips[0])).issuer_name(ca_cert.subject)
        .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(later)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    ca_file = os.path.join(directory, "ca.pem")
    server_file = os.path.join(directory, "server.pem")
    with open(ca_file, "wb") as handle:
        handle.write(ca_cert.public_bytes(pem))
    with open(server_file, "wb") as handle:
        handle.write(server_cert.public_bytes(pem))
        handle.write(server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return Pki(ca_file, server_file)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mongocdc_devstack.tls",
                                     description="Write a private CA (ca.pem) and a server certificate+key (server.pem).")  # fmt: skip
    parser.add_argument("directory")
    parser.add_argument("--host", action="append", help="DNS name of the server (repeatable; default localhost)")
    parser.add_argument("--ip", action="append", help="IP address of the server (repeatable; default 127.0.0.1)")
    args = parser.parse_args(argv)
    pki = make_pki(args.directory, args.host or ["localhost"], args.ip or ["127.0.0.1"])
    print(f"CA certificate (tlsCAFile): {pki.ca_file}\nserver certificate and key (--tls-certificate-key-file): {pki.server_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
