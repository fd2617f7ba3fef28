"""Certificates for the kit's test servers to serve TLS: a private CA and one server certificate.

Production traffic to Pub/Sub and Service Bus is TLS; a test server that
speaks plain text only leaves a producer's TLS path (its trust settings,
its channel or connection options) untested. :func:`make_certificates`
makes, in a directory, a certificate authority of its own (``ca.pem``) and
a server certificate signed by it (``server.pem``, key ``server.key``) for
the loopback names. A client trusts the server by being given ``ca.pem``;
a client given anything else (its system store, another CA) refuses it,
as it would refuse an impostor.

Invariants:

1. The files are made once per directory: a server restarted on the same
   directory serves the same certificate, so clients keep trusting it.
2. Nothing here is secret: the key is written unencrypted and readable,
   the certificates are valid for a day either side of now. For tests only.

Uses ``cryptography`` (a dependency of sharedstream itself).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["LOOPBACK_NAMES", "ServerCertificates", "kit_tls_dir", "make_certificates"]

LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")
"""The names the server certificate is valid for, unless others are asked for."""

_VALIDITY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class ServerCertificates:
    """Where the PEM files are: the CA a client trusts, the server's certificate and key."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def in_directory(cls, directory: Path) -> ServerCertificates:
        """The files' places in ``directory`` (made or not)."""
        return cls(directory / "ca.pem", directory / "server.pem", directory / "server.key")

    def exist(self) -> bool:
        """Whether all three files are there."""
        return all(path.is_file() for path in (self.ca_file, self.cert_file, self.key_file))


def kit_tls_dir(workdir: Path) -> Path:
    """Where a kit server started with ``tls`` in ``workdir`` keeps its certificates.

    ``ServerCertificates.in_directory(kit_tls_dir(workdir)).ca_file`` is the
    CA a client trusts (:func:`sharedstream.testing.brokers.pubsub.start_pubsub`,
    :func:`sharedstream.testing.brokers.servicebus.start_servicebus`).
    """
    return workdir / "tls"


def make_certificates(directory: Path,
                      names: tuple[str, ...] = LOOPBACK_NAMES) -> ServerCertificates:
    """Make a CA and a server certificate for ``names`` in ``directory``; reuse them if there.

    ``names``: IP addresses and DNS names the server certificate is valid
    for. Returns the files' paths. The directory is created if missing.
    """
    files = ServerCertificates.in_directory(directory)
    if files.exist():
        return files
    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
                    signer: ec.EllipticCurvePrivateKey, *, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - _VALIDITY).not_valid_after(now + _VALIDITY)
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        else:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [_general_name(name) for name in names]), critical=False).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sharedstream test CA")])
    ca_cert = certificate("sharedstream test CA", ca_key, ca_name, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = certificate(names[0], server_key, ca_name, ca_key, ca=False)

    directory.mkdir(parents=True, exist_ok=True)
    files.key_file.write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    files.cert_file.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    files.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))  # last: exist()
    return files


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)
