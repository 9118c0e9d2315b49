"""Every security setting turned into what the server, the connections and the links use.

:class:`Security` is built once from the :class:`~proxy.config.ProxyConfig` (``load`` has
already refused combinations that make no sense) and answers:

* how to open a connection to a broker: TCP, then TLS with the upstream context for
  ``SSL``/``SASL_SSL`` (:meth:`Security.open_upstream`). The proxy's own links present
  ``tls-cert-file``; a client's forwarded connection presents it only with ``SASL_SSL`` (where
  SASL names the principal and the certificate only admits the connection) or when
  ``tls-cert-for-clients`` says so, because with ``SSL`` the certificate *is* the principal;
* whether and how the proxy's own links authenticate (:attr:`Security.identity`);
* how to open a connection to another sidecar's fleet listener (:meth:`Security.open_peer`)
  and whether that link authenticates with SASL (:attr:`Security.peer_sasl`);
* what each listener requires of whoever connects (:meth:`Security.listener`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import trio

from proxy.config import ProxyConfig
from proxy.security.identity import Identity
from proxy.security.tls import (
    ReloadingContext,
    client_context,
    handshake_client,
    server_context,
)

log = logging.getLogger("groupgate.security")

Address = tuple[str, int]

FLEET_AUTH_NONE: Final = "none"
FLEET_AUTH_MTLS: Final = "mtls"
FLEET_AUTH_SASL: Final = "sasl"


@dataclass(frozen=True, slots=True)
class ListenerPolicy:
    """What one listener requires of the connections it accepts."""

    tls: ReloadingContext | None
    """Terminate TLS with this context (None: plaintext only; a TLS ClientHello is refused)."""
    sasl: bool
    """Clients must authenticate (through to the broker) before anything but ApiVersions and
    the SASL APIs is answered."""
    fleet_users: frozenset[str] | None = None
    """Fleet listener with SASL: the user names that may send anything once authenticated
    (None: not such a listener)."""
    fleet_peer: bool = False
    """Fleet listener: every connection it accepts is another sidecar (``mtls``: it proved
    so with its certificate; ``none``: anyone who reaches the port is taken for one). With
    ``sasl`` the gate decides per connection, from the user the broker authenticated."""


def _optional_path(text: str) -> Path | None:
    return Path(text) if text else None


class Security:
    """See the module docstring."""

    def __init__(self, config: ProxyConfig) -> None:
        self.protocol = config.security_protocol
        self.upstream_tls = self.protocol in ("SSL", "SASL_SSL")
        self.verify_hostname = config.tls_verify_hostname
        self.identity: Identity | None = None
        if self.protocol.startswith("SASL_"):
            self.identity = Identity(
                config.sasl_mechanism, config.sasl_username, config.sasl_password,
                _optional_path(config.sasl_username_file),
                _optional_path(config.sasl_password_file))
        ca = _optional_path(config.tls_ca_file)
        cert = _optional_path(config.tls_cert_file)
        key = _optional_path(config.tls_key_file)
        files = [p for p in (ca, cert, key) if p is not None]
        self.link_tls: ReloadingContext | None = None
        self.forwarded_tls: ReloadingContext | None = None
        if self.upstream_tls:
            self.link_tls = ReloadingContext(
                "upstream TLS", lambda: client_context(
                    ca_file=ca, cert_file=cert, key_file=key,
                    verify_hostname=self.verify_hostname), files)
            with_cert = cert is not None and (self.protocol == "SASL_SSL"
                                              or config.tls_cert_for_clients)
            self.forwarded_tls = self.link_tls if with_cert or cert is None else ReloadingContext(
                "upstream TLS (client connections)", lambda: client_context(
                    ca_file=ca, verify_hostname=self.verify_hostname),
                [p for p in (ca,) if p is not None])
        listener_cert = _optional_path(config.listener_tls_cert_file)
        self.listener_tls: ReloadingContext | None = None
        if listener_cert is not None:
            lkey = Path(config.listener_tls_key_file)
            lca = _optional_path(config.listener_tls_ca_file)
            self.listener_tls = ReloadingContext(
                "listener TLS", lambda: server_context(cert_file=listener_cert, key_file=lkey,
                                                       ca_file=lca),
                [p for p in (listener_cert, lkey, lca) if p is not None])
        self.fleet_auth = resolve_fleet_auth(config)
        self.fleet_server_name = config.fleet_tls_server_name or None
        fcert = _optional_path(config.fleet_tls_cert_file)
        self.fleet_server_tls: ReloadingContext | None = None
        self.fleet_client_tls: ReloadingContext | None = None
        if fcert is not None:
            fkey = Path(config.fleet_tls_key_file)
            fca = _optional_path(config.fleet_tls_ca_file)
            require_cert = self.fleet_auth == FLEET_AUTH_MTLS
            self.fleet_server_tls = ReloadingContext(
                "fleet listener TLS", lambda: server_context(
                    cert_file=fcert, key_file=fkey, ca_file=fca if require_cert else None),
                [p for p in (fcert, fkey, fca) if p is not None])
            self.fleet_client_tls = ReloadingContext(
                "fleet links TLS", lambda: client_context(
                    ca_file=fca, cert_file=fcert, key_file=fkey,
                    verify_hostname=self.fleet_server_name is not None),
                [p for p in (fcert, fkey, fca) if p is not None])
        users = [u.strip() for u in config.fleet_users.split(",") if u.strip()]
        self._fleet_users = frozenset(users) if users else None

    # -- what the proxy connects to ---------------------------------------------------------

    @property
    def peer_sasl(self) -> bool:
        """Links to other sidecars authenticate with the proxy's SASL identity."""
        return self.fleet_auth == FLEET_AUTH_SASL

    async def open_upstream(self, address: Address, *, own: bool) -> trio.abc.Stream:
        """A connection to a broker, TLS done when the cluster wants it (``own``: one of the
        proxy's own links, else a client's forwarded connection). Raises OSError, ValueError
        (a malformed host) or :class:`~proxy.security.tls.TlsError`."""
        stream = await trio.open_tcp_stream(*address)
        context = self.link_tls if own else self.forwarded_tls
        if context is None:
            return stream
        return await handshake_client(stream, context.current(),
                                      address[0] if self.verify_hostname else None)

    async def open_peer(self, address: Address) -> trio.abc.Stream:
        """A connection to another sidecar's fleet listener."""
        stream = await trio.open_tcp_stream(*address)
        if self.fleet_client_tls is None:
            return stream
        return await handshake_client(stream, self.fleet_client_tls.current(),
                                      self.fleet_server_name)

    # -- what listeners require -------------------------------------------------------------

    def listener(self, fleet: bool) -> ListenerPolicy:
        """The policy of the fleet listener (``fleet``) or of the client listeners."""
        sasl = self.identity is not None
        if not fleet:
            return ListenerPolicy(self.listener_tls, sasl)
        if self.fleet_auth == FLEET_AUTH_MTLS:
            # the TLS handshake requires a certificate of the fleet CA: it proves a sidecar
            return ListenerPolicy(self.fleet_server_tls, False, fleet_peer=True)
        if self.fleet_auth == FLEET_AUTH_SASL:
            return ListenerPolicy(self.fleet_server_tls, True, fleet_users=self.fleet_users())
        # none (refused on a SASL cluster): whoever the network lets reach the port
        return ListenerPolicy(self.fleet_server_tls, False, fleet_peer=True)

    def fleet_users(self) -> frozenset[str]:
        """The SASL user names other sidecars may authenticate as on the fleet listener."""
        if self._fleet_users is not None:
            return self._fleet_users
        assert self.identity is not None
        return frozenset({self.identity.username_now()})

    def is_fleet_user(self, user: str | None) -> bool:
        return user is not None and self.identity is not None and user in self.fleet_users()


def resolve_fleet_auth(config: ProxyConfig) -> str:
    """``fleet-auth`` with ``auto`` resolved: mTLS when a fleet CA is set, else SASL when the
    cluster wants SASL, else none."""
    if config.fleet_auth != "auto":
        return config.fleet_auth
    if config.fleet_tls_ca_file:
        return FLEET_AUTH_MTLS
    if config.security_protocol.startswith("SASL_"):
        return FLEET_AUTH_SASL
    return FLEET_AUTH_NONE
