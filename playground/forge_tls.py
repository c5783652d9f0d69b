"""A throwaway certificate authority and a server certificate for 127.0.0.1 and localhost (and the names and
addresses a test serves the emulator under: a host name in a test's network namespace), made in memory: the
forge emulator serves HTTPS as the forges do, and clients trust it only through the CA file they are given
(nothing is added to the machine's trust store)."""

from __future__ import annotations

import datetime as dt
import ssl
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from mm_core.network.ca import issue, make_authority

EMULATOR_CA = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mm forge emulator CA")])


@dataclass(frozen=True)
class Certificates:
    ca_pem: bytes
    cert_pem: bytes  # the leaf, then the CA: the chain the server presents
    key_pem: bytes


def make_certificates(names: Iterable[str] = ()) -> Certificates:
    """The CA and a leaf for localhost, 127.0.0.1 and `names` (host names, or addresses), made as the egress
    proxy makes its own (mm_core.network.ca)."""
    now = dt.datetime.now(dt.UTC)
    authority = make_authority(now, dt.timedelta(days=2), EMULATOR_CA)
    key_pem, leaf_pem = issue(authority, ["127.0.0.1", "localhost", *names], now)
    ca_pem = authority.certificate_pem()
    return Certificates(ca_pem=ca_pem, cert_pem=leaf_pem + ca_pem, key_pem=key_pem)


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
