"""The egress proxy's certificate authority: the proxy adds a credential to a request inside HTTPS, so for the
credentialed hosts it ends the sandbox's TLS itself, with a certificate for the host made here.

One authority per process, made in memory (EC P-256, quick to make, understood by every client); its key never
leaves the process: no file holds it, and the leaves' keys are handed to OpenSSL through an anonymous memory
file. The sandbox trusts it through `bundle_path()`, a PEM file of the system's trusted roots followed by this
authority's certificate (certificates only). It is valid for `LIFETIME` and replaced when less than
`RENEW_BEFORE` remains; the bundle keeps the previous certificate while it is valid, so a command that read the
bundle before the renewal keeps trusting the leaves made for it: each listener of the proxy keeps the authority
that was current when its command started (`authority()`), and the bundle, which the command's later processes
read again, holds the previous authority's certificate too.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import shutil
import ssl
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import certifi
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LIFETIME = dt.timedelta(days=30)
RENEW_BEFORE = dt.timedelta(days=10)
# Clocks of the sandbox and of servers are this machine's: a small margin covers a certificate used at once.
BACKDATE = dt.timedelta(minutes=5)
# The hosts whose server contexts are kept: a command reaches a handful of credentialed hosts.
CACHE_SIZE = 256
# Where Debian and its derivatives keep the system's roots, when Python's own default names no file.
SYSTEM_ROOTS = Path("/etc/ssl/certs/ca-certificates.crt")
NAME = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mm egress proxy CA")])
PEM = serialization.Encoding.PEM


@dataclass(frozen=True)
class Authority:
    """One generation of the authority: its key (never out of this process) and certificate."""

    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    @property
    def expires(self) -> dt.datetime:
        return self.certificate.not_valid_after_utc

    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(PEM)


def make_authority(now: dt.datetime, lifetime: dt.timedelta, name: x509.Name = NAME) -> Authority:
    """A new authority named `name`, valid from a little before `now` for `lifetime`: EC keys, made in a millisecond
    where RSA takes tens, and every client of ours speaks them. (The test kit's forge emulator makes its own with
    it too: playground/forge_tls.py.)"""
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign and crl_sign: what OpenSSL 3's strict mode asks of a CA
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(key, certificate)


def _alt_names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    """A literal address as an address (a client checks an IP URL against those only), else a DNS name."""
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue(authority: Authority, hosts: Sequence[str], now: dt.datetime) -> tuple[bytes, bytes]:
    """A key and a certificate for `hosts` signed by `authority`, valid as long as it is: (key, certificate), PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    # A common name holds 64 characters at most; clients read the subjectAltName anyway.
    first = hosts[0]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, first)] if len(first) <= 64 else [])
    issuer = authority.certificate.subject
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(authority.expires)
        .add_extension(x509.SubjectAlternativeName(_alt_names(hosts)), critical=not subject)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()), critical=False)
        .sign(authority.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return key_pem, certificate.public_bytes(PEM)


def _leaf_chain(authority: Authority, host: str, now: dt.datetime) -> bytes:
    """A leaf for `host` as the proxy's server side loads it: key first, then the chain it presents."""
    key_pem, certificate_pem = issue(authority, [host], now)
    return key_pem + certificate_pem + authority.certificate_pem()


def server_context(chain: bytes) -> ssl.SSLContext:
    """A server-side context presenting `chain` (a key and certificates, PEM), HTTP/1.1 only (the proxy reads
    requests with h11). ssl loads a chain from a file only: an anonymous memory file (memfd) is one, reached
    through /proc, so the key is never written to a disk or a directory another process could list."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    fd = os.memfd_create("mm-egress-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, chain)
        context.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return context


def system_roots() -> Path:
    """The roots this machine trusts: Python's default file (the operator's SSL_CERT_FILE when set), Debian's
    bundle, else certifi's."""
    default = ssl.get_default_verify_paths().cafile
    for candidate in (default, SYSTEM_ROOTS):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return Path(certifi.where())


def _remove_own(directory: Path, pid: int) -> None:
    """Removes the bundle's directory, in the process that made it only (not in a child forked from it)."""
    if os.getpid() == pid:
        shutil.rmtree(directory, ignore_errors=True)


class CertificateAuthority:
    """The authority, its leaves' server contexts (the last CACHE_SIZE used) and the bundle. Thread-safe:
    making a leaf takes a few milliseconds, so the proxy asks for one off its event loop."""

    def __init__(self, lifetime: dt.timedelta = LIFETIME, renew_before: dt.timedelta = RENEW_BEFORE) -> None:
        self.lifetime, self.renew_before = lifetime, renew_before
        self._lock = threading.Lock()
        self._current = make_authority(dt.datetime.now(dt.UTC), lifetime)
        self._previous: Authority | None = None
        self._contexts: OrderedDict[tuple[int, str], ssl.SSLContext] = OrderedDict()
        self._bundle: Path | None = None

    def authority(self) -> Authority:
        """The authority now: a listener keeps it for its command's life."""
        with self._lock:
            self._renew_if_due()
            return self._current

    def context_for(self, host: str, authority: Authority | None = None) -> ssl.SSLContext:
        """The server-side context presenting a certificate for `host` (a normal host: policy.normal_host)
        signed by `authority` (by default the current one)."""
        with self._lock:
            self._renew_if_due()
            signer = authority or self._current
            key = (signer.certificate.serial_number, host)
            context = self._contexts.pop(key, None)
            if context is None:
                context = server_context(_leaf_chain(signer, host, dt.datetime.now(dt.UTC)))
            self._contexts[key] = context
            while len(self._contexts) > CACHE_SIZE:
                self._contexts.popitem(last=False)
            return context

    def bundle_path(self) -> Path:
        """The bundle the sandbox trusts (world-readable, in a directory of this process's own, made on first
        use with a name no other user can have taken beforehand, and removed when the process ends)."""
        with self._lock:
            self._renew_if_due()
            if self._bundle is None:
                directory = Path(tempfile.mkdtemp(prefix=f"mm-egress-{os.getpid()}-"))
                directory.chmod(0o755)  # the sandbox may run as another user
                weakref.finalize(self, _remove_own, directory, os.getpid())
                self._bundle = directory / "ca-bundle.pem"
                self._write_bundle()
            return self._bundle

    def close(self) -> None:
        """Removes the bundle's directory (also done when the authority is collected or the process exits)."""
        with self._lock:
            if self._bundle is not None:
                shutil.rmtree(self._bundle.parent, ignore_errors=True)
                self._bundle = None

    def _renew_if_due(self) -> None:
        now = dt.datetime.now(dt.UTC)
        if self._current.expires - now > self.renew_before:
            return
        self._previous, self._current = self._current, make_authority(now, self.lifetime)
        if self._bundle is not None:
            self._write_bundle()

    def _write_bundle(self) -> None:
        assert self._bundle is not None
        authorities = [self._current, self._previous] if self._previous is not None else [self._current]
        now = dt.datetime.now(dt.UTC)
        ours = b"".join(a.certificate_pem() for a in authorities if a.expires > now)
        roots = system_roots().read_bytes()
        # A file replaced whole: a command reading it meanwhile sees the old bundle or the new one.
        fd, temporary = tempfile.mkstemp(dir=self._bundle.parent, prefix=".bundle-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(roots.rstrip(b"\n") + b"\n" + ours)
            Path(temporary).chmod(0o644)
            Path(temporary).replace(self._bundle)
        except BaseException:
            with contextlib.suppress(OSError):
                Path(temporary).unlink()
            raise
