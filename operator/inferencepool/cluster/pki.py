"""The cluster's certificates, generated in Python with the same layout kwokctl uses.

One CA, and one admin certificate (CN kwok-admin, O system:masters, server and client usage) that serves as
the API server's serving certificate, every component's client certificate and the service-account signing
key. That is one trust domain on loopback, which is all a throwaway test cluster needs.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ADMIN_USER = "kwok-admin"
SERVER_DNS_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "localhost",
)


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    def complete(self) -> bool:
        return all(path.is_file() for path in (self.ca_cert, self.ca_key, self.admin_cert, self.admin_key))


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write(cert_path: Path, key_path: Path, cert: x509.Certificate, key: rsa.RSAPrivateKey) -> None:
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    # PKCS#1 ("RSA PRIVATE KEY"): the form kube-apiserver accepts for --service-account-key-file as well.
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    key_path.touch(mode=0o600)
    key_path.write_bytes(key_bytes)


def _certificate(
    subject: x509.Name,
    issuer: x509.Name,
    key: rsa.RSAPrivateKey,
    validity: tuple[datetime.datetime, datetime.datetime],
    is_ca: bool,
) -> x509.CertificateBuilder:
    """What the CA and the admin certificate share; the caller adds the extensions that differ and signs."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=is_ca,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def generate(directory: Path, service_ip: str, valid_days: int = 3650) -> Pki:
    """Write ca.{crt,key} and admin.{crt,key}; `service_ip` is the `kubernetes` Service's cluster IP."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    now = datetime.datetime.now(datetime.UTC)
    validity = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=valid_days))

    ca_key = _new_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kwok-ca")])
    ca = (
        _certificate(ca_name, ca_name, ca_key, validity, is_ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    admin_key = _new_key()
    admin_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, ADMIN_USER),
        ]
    )
    ips = ["127.0.0.1", "::1", service_ip]
    admin = (
        _certificate(admin_name, ca_name, admin_key, validity, is_ca=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(name) for name in SERVER_DNS_NAMES]
                + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(pki.ca_cert, pki.ca_key, ca, ca_key)
    _write(pki.admin_cert, pki.admin_key, admin, admin_key)
    return pki
