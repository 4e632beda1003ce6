"""Certificates for the TLS tests, made fresh in a temporary directory: a CA, a server
certificate for 127.0.0.1 and localhost and a client certificate signed by it, and a
second CA the server does not trust, with a client certificate of its own."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Key = ec.EllipticCurvePrivateKey


class Pair(NamedTuple):
    cert: str
    key: str


class Certs(NamedTuple):
    ca: str  # the trusted CA's certificate
    server: Pair  # for IP 127.0.0.1 and DNS localhost, signed by `ca`
    client: Pair  # signed by `ca`
    untrusted_ca: str
    untrusted_client: Pair  # signed by `untrusted_ca`


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _sign(
    subject: str, key: Key, issuer: tuple[x509.Certificate, Key] | None, extensions: list[x509.ExtensionType]
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer[0].subject if issuer else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    for extension in extensions:
        builder = builder.add_extension(extension, critical=isinstance(extension, x509.BasicConstraints))
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _write(dir: Path, stem: str, cert: x509.Certificate, key: Key | None = None) -> Pair:
    cert_path = dir / f"{stem}.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path = dir / f"{stem}-key.pem"
    if key is not None:
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_path.chmod(0o600)
    return Pair(str(cert_path), str(key_path))


def _ca(dir: Path, stem: str) -> tuple[x509.Certificate, Key]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(
        f"fusee test {stem}",
        key,
        None,
        [
            x509.BasicConstraints(ca=True, path_length=0),
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
        ],
    )
    _write(dir, stem, cert)
    return cert, key


def _leaf(dir: Path, stem: str, ca: tuple[x509.Certificate, Key], server: bool) -> Pair:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    extensions: list[x509.ExtensionType] = [
        x509.BasicConstraints(ca=False, path_length=None),
        x509.KeyUsage(True, False, False, False, False, False, False, False, False),
        x509.ExtendedKeyUsage([usage]),
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca[1].public_key()),
    ]
    if server:
        extensions.append(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            )
        )
    return _write(dir, stem, _sign(f"fusee test {stem}", key, ca, extensions), key)


def make(dir: Path) -> Certs:
    """Every file of `Certs`, PEM, in `dir` (created if missing)."""
    dir.mkdir(parents=True, exist_ok=True)
    ca = _ca(dir, "ca")
    other = _ca(dir, "untrusted-ca")
    return Certs(
        ca=str(dir / "ca.pem"),
        server=_leaf(dir, "server", ca, server=True),
        client=_leaf(dir, "client", ca, server=False),
        untrusted_ca=str(dir / "untrusted-ca.pem"),
        untrusted_client=_leaf(dir, "untrusted-client", other, server=False),
    )
