"""SASL for the proxy's own broker connections: SaslHandshake v1, then SaslAuthenticate.

PLAIN sends ``\\0user\\0password`` in one SaslAuthenticate; SCRAM-SHA-256/512 (RFC 5802,
without channel binding, as Kafka does) takes two, the client side computed by ``scramp``
(docs/decisions/0015-sasl-and-tls-libraries.md). The broker's answer to the last one carries the
session lifetime (KIP-368, ``connections.max.reauth.ms``): the connection must authenticate
again before it ends, which :class:`~proxy.upstream.UpstreamClient` does at
:data:`REAUTH_FRACTION` of it, on the same connection, between two requests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import scramp

from proxy.codec.api_keys import ApiKey
from proxy.security.identity import CredentialsError, Identity

HANDSHAKE_VERSION: Final = 1
AUTHENTICATE_VERSION: Final = 1
"""v1 adds the session lifetime; v2 only makes the message flexible."""
REAUTH_FRACTION: Final = 0.85
"""Re-authenticate after this share of the session lifetime (Java clients pick 85-95%)."""
SASL_AUTHENTICATION_FAILED: Final = 58
UNSUPPORTED_SASL_MECHANISM: Final = 33
ILLEGAL_SASL_STATE: Final = 34

Exchange = Callable[[int, int, dict[str, Any]], Awaitable[dict[str, Any]]]
"""Sends one request on the connection being authenticated and returns the decoded answer."""


class AuthenticationFailed(Exception):
    """The broker refused the proxy's credentials or mechanism; the message is the broker's."""


async def authenticate(exchange: Exchange, identity: Identity) -> int:
    """Authenticate the connection behind ``exchange``; return the session lifetime in ms (0:
    no limit). Raises :class:`AuthenticationFailed` (credentials, mechanism) or what
    ``exchange`` raises (transport)."""
    mechanism = identity.mechanism
    try:
        username, password = identity.credentials()
    except CredentialsError as exc:
        raise AuthenticationFailed(f"the proxy's credentials: {exc}") from None
    handshake = await exchange(ApiKey.SASL_HANDSHAKE, HANDSHAKE_VERSION,
                               {"mechanism": mechanism})
    if handshake.get("error_code"):
        offered = ", ".join(handshake.get("mechanisms") or []) or "none"
        raise AuthenticationFailed(f"the broker does not accept SASL mechanism {mechanism} "
                                   f"(error {handshake['error_code']}; it offers {offered})")
    if mechanism == "PLAIN":
        token = b"\0" + username.encode() + b"\0" + password.encode()
        answer = await _step(exchange, token)
        return int(answer.get("session_lifetime_ms") or 0)
    client = scramp.ScramClient([mechanism], username, password)
    first = await _step(exchange, client.get_client_first().encode())
    try:
        client.set_server_first(bytes(first["auth_bytes"]).decode())
        final = client.get_client_final().encode()
    except (scramp.ScramException, UnicodeDecodeError) as exc:
        raise AuthenticationFailed(f"{mechanism}: the broker's first message: {exc}") from None
    last = await _step(exchange, final)
    try:
        client.set_server_final(bytes(last["auth_bytes"]).decode())
    except (scramp.ScramException, UnicodeDecodeError) as exc:
        raise AuthenticationFailed(f"{mechanism}: the broker did not prove it knows the "
                                   f"credentials: {exc}") from None
    return int(last.get("session_lifetime_ms") or 0)


async def _step(exchange: Exchange, token: bytes) -> dict[str, Any]:
    answer = await exchange(ApiKey.SASL_AUTHENTICATE, AUTHENTICATE_VERSION,
                            {"auth_bytes": token})
    error = answer.get("error_code") or 0
    if error:
        message = answer.get("error_message") or "no message"
        raise AuthenticationFailed(f"the broker refused the proxy's SASL authentication "
                                   f"(error {error}): {message}")
    return answer
