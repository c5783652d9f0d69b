"""A throwaway certificate authority and a server certificate for 127.0.0.1 and localhost (and the names and
addresses a test serves the emulator under: a host name in a test's network namespace), made in memory: the
forge emulator serves HTTPS as the forges do, and clients trust it only through the CA file they are given
(nothing is added to the machine's trust store)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certificates:
    ca_pem: bytes
    cert_pem: bytes  # the leaf, then the CA: the chain the server presents
    key_pem: bytes


def make_certificates(names: Iterable[str] = ()) -> Certificates:
    """The CA and a leaf for localhost, 127.0.0.1 and `names` (host names, or addresses)."""
    # EC keys: made in a millisecond where RSA takes tens, and every client of ours speaks them.
    now = dt.datetime.now(dt.UTC)
    valid = (now - dt.timedelta(minutes=5), now + dt.timedelta(days=2))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mm forge emulator CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign and crl_sign: what OpenSSL 3's strict mode asks of a CA
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.SubjectAlternativeName(_alt_names(("localhost", "127.0.0.1", *names))), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return Certificates(
        ca_pem=ca.public_bytes(pem),
        cert_pem=leaf.public_bytes(pem) + ca.public_bytes(pem),
        key_pem=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def _alt_names(names: Iterable[str]) -> list[x509.GeneralName]:
    """subjectAltName entries: an address as an address (a client checks an IP URL against those only)."""
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return entries


def server_context(certs: Certificates) -> ssl.SSLContext:
    """A server-side context presenting `certs`. ssl loads a chain from files only: they live a moment in a
    directory of this process's own."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory(prefix="mm-forge-tls-") as tmp:
        cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
        cert.write_bytes(certs.cert_pem)
        key.write_bytes(certs.key_pem)
        context.load_cert_chain(cert, key)
    return context
