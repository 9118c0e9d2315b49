"""Per client connection: whether and as whom it authenticated, as far as the proxy can know.

The broker authenticates every client; the proxy passes the SASL exchange through and reads
both sides of it (:mod:`proxy.security.gate`). What it can learn depends on the mechanism:

* PLAIN: the user name (``User:<name>`` with Kafka's default principal builder). The client
  sends it in clear (inside TLS); the broker's success confirms it.
* SCRAM-SHA-256/512: the user name, as above: the client-first message names it, the broker's
  final message confirms it.
* SCRAM with ``tokenauth=true`` (delegation tokens): only that a token was used. The name is
  the token id; the owner's principal is known to the broker alone.
* OAUTHBEARER: only that a token was accepted. The principal is a claim of the token (``sub``
  by default, ``sasl.oauthbearer.sub.claim.name``) that the broker validated with keys the
  proxy does not have; reading the claim unverified would be a guess.
* GSSAPI (Kerberos): only that the broker accepted a ticket. The client's name is inside the
  encrypted ticket, and the broker maps it with ``sasl.kerberos.principal.to.local.rules``.
* A TLS client certificate on the proxy's listener (listener mTLS): the subject the proxy
  verified. The broker never sees that certificate.

A broker with a custom ``principal.builder.class`` may map even a known user name to another
principal. What the proxy always has is the client's own authenticated connection to the
broker, on which a request is authorized exactly as the client's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Session:
    """What one connection's authentication is known to be; read by the routers."""

    listener: str
    """``bootstrap``, ``broker N`` or ``fleet``."""
    tls: bool = False
    """The client reached the proxy over TLS (terminated by the proxy)."""
    tls_subject: str | None = None
    """The subject of the client certificate the listener verified (mTLS), e.g. ``CN=app``."""
    mechanism: str | None = None
    """The SASL mechanism of the last successful authentication."""
    user: str | None = None
    """The SASL user name, when the mechanism reveals it (PLAIN, SCRAM)."""
    authenticated: bool = False
    """The broker accepted the client's SASL authentication."""
    failed: str | None = None
    """Why the broker refused it (the connection is being closed)."""
    expires_at: float | None = None
    """When the broker ends the session unless the client authenticates again (KIP-368;
    trio's clock), counted from when the proxy forwarded the last SaslAuthenticate."""
    reauthentications: int = 0
    delegation_token: bool = False
    fleet_peer: bool = False
    """Another sidecar of the fleet: its SASL user is one of ``fleet-users``, or it presented
    a certificate of the fleet CA (``fleet-auth=mtls``). Only a fleet peer's relay marks (the
    application's client id, host and principal) may be believed."""

    @property
    def principal(self) -> str | None:
        """The Kafka principal the broker uses, when the proxy can know it."""
        if not self.authenticated or self.user is None or self.delegation_token:
            return None
        return f"User:{self.user}"

    def describe(self) -> str:
        """One phrase for log lines."""
        if self.authenticated:
            who = self.principal or f"a principal the proxy cannot see ({self.mechanism})"
            return f"authenticated as {who}"
        if self.tls_subject:
            return f"TLS client {self.tls_subject}"
        return "not authenticated"
