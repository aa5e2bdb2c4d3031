"""A throwaway certificate authority for tests and benchmarks of TLS links (node/tls.py): a CA
and node certificates made in the process, written as PEM files into a directory.

Needs the `cryptography` package (the dev extra); nothing in node/ imports it. Keys are
ECDSA P-256 (fast to make), certificates valid for a day. A node certificate names
127.0.0.1 and localhost (the addresses tests and benches use) and serves for both server and
client authentication, as a node's certificate does on its links."""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class NodeTls:
    """PEM files for one node: its certificate chain and key, and the CA it trusts."""
    cert_file: str
    key_file: str
    ca_file: str

    def flags(self, client_auth: bool = False) -> list[str]:
        """`replog serve` flags for these files."""
        out = ["--tls-cert-file", self.cert_file, "--tls-key-file", self.key_file, "--tls-ca-file", self.ca_file]
        return out + (["--tls-client-auth"] if client_auth else [])


class ThrowawayCA:
    def __init__(self, directory: str, name: str = "replog test CA"):
        os.makedirs(directory, exist_ok=True)
        self.dir = directory
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self._cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                      .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                      .not_valid_before(now - datetime.timedelta(minutes=5))
                      .not_valid_after(now + datetime.timedelta(days=1))
                      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                      .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                   content_commitment=False, key_encipherment=False,
                                                   data_encipherment=False, key_agreement=False,
                                                   encipher_only=False, decipher_only=False), critical=True)
                      .sign(self._key, hashes.SHA256()))
        self.ca_file = self._write(f"{_slug(name)}-ca.pem", self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> NodeTls:
        """A node certificate for `hosts` (IPs and DNS names), signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(self._cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(self._key, hashes.SHA256()))
        cert_file = self._write(f"{_slug(name)}.pem", cert.public_bytes(serialization.Encoding.PEM))
        key_file = self._write(f"{_slug(name)}-key.pem", key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return NodeTls(cert_file, key_file, self.ca_file)

    def _write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)
        return path


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").lower()
