"""SSL contexts built from certificate files, rebuilt when the files change.

Kubernetes renews a mounted Secret by swapping a symlink, so a certificate file changes under
a running process. :class:`ReloadingContext` keeps the context built from its files and, at
most every :data:`CHECK_SECONDS` when a new connection asks for it, compares the files' stat
(inode, size, modification time, following symlinks) with the ones it was built from. A change
builds a new context for the connections opened from then on (open connections keep theirs,
as Kafka's own clients and brokers do). A rebuild that fails (a file caught half-written, a
key that does not match its certificate) is logged and the previous context stays in use.

:func:`client_context` and :func:`server_context` say what each side checks: the broker's (or
the fleet peer's) chain against a CA bundle and its host name (unless turned off), and, with a
CA on the server side, a client certificate signed by it (mTLS).
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from proxy.security.tlsstream import TlsStream

log = logging.getLogger("groupgate.security")

CHECK_SECONDS = 5.0
"""How often, at most, the certificate files are looked at again (on a new connection)."""

Stat = tuple[int, int, int]


def _stat(path: Path) -> Stat:
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def client_context(*, ca_file: Path | None, cert_file: Path | None = None,
                   key_file: Path | None = None, verify_hostname: bool = True) -> ssl.SSLContext:
    """A context for connecting out: the peer's chain is checked against ``ca_file`` (the
    system's trust store without one), its name against the address unless
    ``verify_hostname`` is off; ``cert_file``/``key_file`` are presented when asked (mTLS)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH,
                                         cafile=str(ca_file) if ca_file else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = verify_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    if cert_file is not None:
        context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
    return context


def server_context(*, cert_file: Path, key_file: Path, ca_file: Path | None = None
                   ) -> ssl.SSLContext:
    """A context for a listener presenting ``cert_file``; with ``ca_file`` every client must
    present a certificate signed by it (mTLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert_file), str(key_file))
    if ca_file is not None:
        context.load_verify_locations(cafile=str(ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ReloadingContext:
    """The current SSL context built from ``files`` by ``build``; see the module docstring."""

    def __init__(self, name: str, build: Callable[[], ssl.SSLContext], files: Sequence[Path],
                 *, check_seconds: float = CHECK_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._build = build
        self._files = tuple(files)
        self._check_seconds = check_seconds
        self._clock = clock
        self._stats = self._read_stats()
        self._context = build()  # a bad file at start is a configuration error: let it raise
        self._checked = clock()
        self.reloads = 0

    def _read_stats(self) -> tuple[Stat, ...]:
        return tuple(_stat(path) for path in self._files)

    def current(self) -> ssl.SSLContext:
        """The context for a new connection (rebuilt first if a file changed)."""
        now = self._clock()
        if now - self._checked >= self._check_seconds:
            self._checked = now
            self._maybe_reload()
        return self._context

    def _maybe_reload(self) -> None:
        try:
            stats = self._read_stats()
        except OSError as exc:
            log.warning("%s: cannot read its certificate files (%s); still using the ones "
                        "loaded before", self.name, exc)
            return
        if stats == self._stats:
            return
        try:
            context = self._build()
        except (OSError, ssl.SSLError, ValueError) as exc:
            log.warning("%s: certificate files changed but cannot be loaded (%s); still using "
                        "the ones loaded before, trying again in %.0f s", self.name, exc,
                        self._check_seconds)
            return
        self._context, self._stats = context, stats
        self.reloads += 1
        log.info("%s: certificate files changed; new connections use them", self.name)


async def handshake_client(stream: trio.abc.Stream, context: ssl.SSLContext,
                           server_hostname: str | None) -> TlsStream:
    """TLS over ``stream`` as the client; raises :class:`TlsError` if the handshake fails."""
    return await _handshake(TlsStream(stream, context, server_hostname=server_hostname))


async def handshake_server(stream: trio.abc.Stream, context: ssl.SSLContext) -> TlsStream:
    """TLS over ``stream`` as the server; raises :class:`TlsError` if the handshake fails."""
    return await _handshake(TlsStream(stream, context, server_side=True))


async def _handshake(tls: TlsStream) -> TlsStream:
    try:
        await tls.do_handshake()
    except (trio.BrokenResourceError, ssl.SSLError, OSError) as exc:
        await trio.aclose_forcefully(tls.transport)
        raise TlsError(describe_failure(exc)) from exc
    return tls


class TlsError(Exception):
    """A TLS handshake failed; the message says why (certificate, name, protocol)."""


def describe_failure(exc: BaseException) -> str:
    """The most specific reason in a handshake failure (trio wraps the SSL error)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return f"certificate verification failed: {cause.verify_message}"
        if isinstance(cause, ssl.SSLError):
            return f"TLS handshake failed: {cause.reason or cause}"
        cause = cause.__cause__ or cause.__context__
    return f"TLS handshake failed: {exc!r}"


def peer_subject(stream: trio.abc.Stream) -> str | None:
    """The subject of the certificate the peer of a TLS stream presented, as Kafka writes a
    principal's distinguished name (``CN=app,O=example``), or None."""
    if not isinstance(stream, TlsStream):
        return None
    try:
        cert = stream.getpeercert()
    except (ValueError, AttributeError):
        return None
    if not cert:
        return None
    parts = [f"{_RDN_NAMES.get(key, key)}={value}"
             for rdn in reversed(cert.get("subject", ())) for key, value in rdn]
    return ",".join(parts) or None


_RDN_NAMES = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
              "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
              "emailAddress": "EMAILADDRESS", "domainComponent": "DC"}
