"""Test-time certificates: a CA, an etcd server certificate and a client certificate; and a CA that issues one
certificate per gRPC principal (``Authority``: the coordinator, query and stream nodes, users).

Made fresh for each test run with ``cryptography`` so that no key material is
checked in and nothing expires in the repository. The server certificate
carries SAN IP 127.0.0.1 (a single endpoint is dialled by address) and DNS
localhost (several endpoints need one name to verify, see ``EtcdClient``).
A second, unrelated CA (``other_ca``) lets tests present a certificate that
the server must refuse. ``make_authority`` writes a CA whose ``issue(name)``
writes a certificate with common name ``name`` (the principal it names, e.g.
``streamnode-7``), usable as server and client certificate.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meta.ops.etcd_server import TlsFiles


@dataclass(frozen=True)
class CertFiles:
    """PEM files written by ``make_certs``."""

    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # Signed by a CA the server does not trust.
    rogue_cert: Path
    rogue_key: Path
    other_ca_file: Path


def _key() -> ec.EllipticCurvePrivateKey:
    # P-256 keys are generated in milliseconds (RSA would slow every run down).
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    common_name: str,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    server: bool,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:
        # etcd also dials its own client URL with the server certificate (grpc-gateway),
        # so the server certificate needs both usages.
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(ca_key, hashes.SHA256()), key


def make_certs(directory: Path) -> CertFiles:
    """Write a CA, a server and a client certificate (plus a rogue pair) as PEM files in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca("querycoord test CA")
    server, server_key = _leaf("etcd-server", ca, ca_key, server=True)
    client, client_key = _leaf("querycoord-client", ca, ca_key, server=False)
    other_ca, other_ca_key = _ca("untrusted test CA")
    rogue, rogue_key = _leaf("rogue-client", other_ca, other_ca_key, server=False)

    files = CertFiles(
        ca_file=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
        rogue_cert=directory / "rogue.pem",
        rogue_key=directory / "rogue-key.pem",
        other_ca_file=directory / "other-ca.pem",
    )
    _write_cert(files.ca_file, ca)
    _write_cert(files.server_cert, server)
    _write_key(files.server_key, server_key)
    _write_cert(files.client_cert, client)
    _write_key(files.client_key, client_key)
    _write_cert(files.rogue_cert, rogue)
    _write_key(files.rogue_key, rogue_key)
    _write_cert(files.other_ca_file, other_ca)
    return files


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    """A throwaway CA in ``directory`` that issues one certificate per principal (``issue``)."""

    directory: Path
    ca_file: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def issue(self, common_name: str) -> Issued:
        """A certificate for ``common_name`` (server and client usage; SAN localhost and 127.0.0.1)."""
        cert, key = _leaf(common_name, self.cert, self.key, server=True)
        files = Issued(self.directory / f"{common_name}.pem", self.directory / f"{common_name}-key.pem")
        _write_cert(files.cert, cert)
        _write_key(files.key, key)
        return files


def make_authority(directory: Path, name: str = "querycoord test gRPC CA") -> Authority:
    """A new CA written to ``directory/ca.pem``."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = _ca(name)
    ca_file = directory / "ca.pem"
    _write_cert(ca_file, cert)
    return Authority(directory, ca_file, cert, key)


def server_tls(certs: CertFiles) -> TlsFiles:
    """What an embedded etcd member needs to serve TLS with ``certs``' server pair and require client certificates
    signed by their CA."""
    return TlsFiles(ca_file=certs.ca_file, cert_file=certs.server_cert, key_file=certs.server_key)
