"""The router of a connection on a SASL listener: nothing is answered before authentication.

:class:`SaslGate` wraps the connection's own router (:class:`~proxy.connection.Router`) and
lets a request through to it only as a Kafka broker's SASL listener would
(``SaslServerAuthenticator``):

* before the client has authenticated: ApiVersions, SaslHandshake (v1) and then
  SaslAuthenticate; anything else, including the APIs the proxy answers itself
  (ConsumerGroupHeartbeat, ConsumerGroupDescribe, the classic group APIs of coordinated
  groups), closes the connection with one log line;
* after the broker refused the authentication: nothing (the broker closes too);
* after the session the broker granted ended (KIP-368 ``connections.max.reauth.ms``, counted
  from when the proxy forwarded the last SaslAuthenticate, so never later than the broker):
  only a new SaslHandshake; anything else closes, as the broker closes an expired connection.

The SASL requests themselves are forwarded untouched on the client's own broker connection, so
the broker authenticates the client with the client's credentials; the gate reads the
mechanism, the user name when the mechanism shows it (PLAIN, SCRAM; :mod:`.session` says what
is knowable for the others), and from the broker's answers whether and for how long the client
is authenticated. A re-authentication (KIP-368: SaslHandshake again on an authenticated
connection) keeps the earlier session valid until it ends; the broker closes the connection if
the new one fails or names another principal, and the gate stops answering then too.

On the fleet listener the gate also decides whether the authenticated client is another
sidecar (its user is one of ``fleet-users``, :attr:`Session.fleet_peer
<proxy.security.session.Session.fleet_peer>`); nobody else may send anything there but the
SASL exchange, and only a fleet peer's relay marks are believed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.errors import CodecError
from proxy.codec.header import parse_request_header
from proxy.connection import Decision, IncompleteHeader, Payload, RejectRequest, RequestInfo, Router
from proxy.metrics import CLIENT_AUTHENTICATIONS
from proxy.router import body_offset
from proxy.security.session import Session

log = logging.getLogger("groupgate.security")

_HANDSHAKE, _AUTHENTICATE, _API_VERSIONS = (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE,
                                            ApiKey.API_VERSIONS)
SCRAM_STEPS = 2
"""SCRAM's exchange: client-first/server-first, client-final/server-final."""
KNOWN_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER",
                              "GSSAPI"})
"""Mechanisms named as themselves in metric labels; any other name (a client may send any
string before it authenticated) is counted as ``other``, so nothing a client sends becomes
an unbounded set of label values."""


def mechanism_label(mechanism: str | None) -> str:
    """The ``mechanism`` label of a SaslHandshake's mechanism name."""
    if mechanism is None:
        return "-"
    return mechanism if mechanism in KNOWN_MECHANISMS else "other"


class SaslGate:
    """See the module docstring. One per connection."""

    __slots__ = ("_accepted", "_exchange_user", "_fleet_only", "_inner", "_is_fleet_user",
                 "_mechanism", "_sent_at", "_steps", "_token_auth", "name", "session")

    def __init__(self, inner: Router, session: Session, *,
                 is_fleet_user: Callable[[str | None], bool] | None = None,
                 fleet_only: bool = False, name: str = "") -> None:
        """``is_fleet_user``: on the fleet listener, whether a SASL user is another sidecar;
        ``fleet_only``: nobody else may use this connection (the fleet listener)."""
        self._inner = inner
        self.session = session
        self._is_fleet_user = is_fleet_user
        self._fleet_only = fleet_only
        self.name = name
        self._mechanism: str | None = None
        """The mechanism of the exchange in progress (SaslHandshake sent)."""
        self._accepted = False
        """The broker accepted that mechanism: SaslAuthenticate may follow."""
        self._steps = 0
        self._exchange_user: str | None = None
        self._token_auth = False
        self._sent_at = 0.0

    @property
    def inner(self) -> Router:
        return self._inner

    def attach(self, send: Any) -> None:
        """Hand the connection's probes to the router inside (see ``Connection.probe``)."""
        attach = getattr(self._inner, "attach", None)
        if attach is not None:
            attach(send)

    async def aclose(self) -> None:
        closer = getattr(self._inner, "aclose", None)
        if closer is not None:
            await closer()

    # -- requests ---------------------------------------------------------------------------

    def classify(self, request: RequestInfo) -> int:
        key = request.api_key
        session = self.session
        if session.failed is not None:
            raise RejectRequest(f"api key {key} after the broker refused the client's "
                                f"authentication ({session.failed})")
        if key == _HANDSHAKE:
            self._begin(request)
        elif key == _AUTHENTICATE:
            self._authenticate(request)
        else:
            expired = (session.expires_at is not None
                       and trio.current_time() >= session.expires_at)
            if expired:
                raise RejectRequest(f"{_name(key)} after the client's SASL session ended "
                                    "(KIP-368) without a new authentication")
            if key != _API_VERSIONS:
                if not session.authenticated:
                    raise RejectRequest(f"{_name(key)} before the client authenticated (this "
                                        "listener requires SASL: only ApiVersions, "
                                        "SaslHandshake and SaslAuthenticate are answered)")
                if self._fleet_only and not session.fleet_peer:
                    raise RejectRequest(f"{_name(key)} on the fleet listener from "
                                        f"{session.principal or 'a client'}, which is not one "
                                        "of fleet-users")
        return self._inner.classify(request)

    def _begin(self, request: RequestInfo) -> None:
        if not request.complete:
            raise IncompleteHeader
        if self._mechanism is not None and not self._done():
            raise RejectRequest("SaslHandshake in the middle of an authentication")
        mechanism = str(_decode(request)["mechanism"])
        self._mechanism, self._accepted, self._steps = mechanism, False, 0
        self._exchange_user, self._token_auth = None, False

    def _done(self) -> bool:
        return self._steps == -1

    def _authenticate(self, request: RequestInfo) -> None:
        if not request.complete:
            raise IncompleteHeader
        if self._mechanism is None or not self._accepted or self._done():
            raise RejectRequest("SaslAuthenticate without a SaslHandshake the broker accepted")
        if self._steps == 0:
            token = bytes(_decode(request).get("auth_bytes") or b"")
            self._exchange_user, self._token_auth = user_of(self._mechanism, token)
        self._sent_at = trio.current_time()

    def decide(self, request: RequestInfo) -> Decision:
        return self._inner.decide(request)

    def decide_oversized(self, request: RequestInfo) -> int:
        return self._inner.decide_oversized(request)

    # -- responses --------------------------------------------------------------------------

    def response_rewriter(self, api_key: int, api_version: int
                          ) -> Callable[[memoryview], Payload | None] | None:
        if api_key == _HANDSHAKE:
            return lambda payload: self._on_handshake(api_version, payload)
        if api_key == _AUTHENTICATE:
            return lambda payload: self._on_authenticate(api_version, payload)
        return self._inner.response_rewriter(api_key, api_version)

    def _on_handshake(self, version: int, payload: memoryview) -> None:
        value = _decode_response(_HANDSHAKE, version, payload)
        error = value.get("error_code") or 0
        if error:
            offered = ", ".join(value.get("mechanisms") or []) or "none"
            self._fail(f"SaslHandshake error {error}: mechanism {self._mechanism!r:.80} is "
                       f"not enabled (the broker offers {offered})")
        else:
            self._accepted = True
        return None

    def _on_authenticate(self, version: int, payload: memoryview) -> None:
        value = _decode_response(_AUTHENTICATE, version, payload)
        error = value.get("error_code") or 0
        if error:
            self._fail(f"SaslAuthenticate error {error}: "
                       f"{value.get('error_message') or 'no message'}")
            return None
        self._steps += 1
        mechanism = self._mechanism or ""
        token = value.get("auth_bytes") or b""
        complete = (self._steps == SCRAM_STEPS if mechanism.startswith("SCRAM-")
                    else len(token) == 0)
        if complete:
            self._complete(mechanism, int(value.get("session_lifetime_ms") or 0))
        return None

    def _complete(self, mechanism: str, lifetime_ms: int) -> None:
        session = self.session
        again = session.authenticated
        if again and session.user is not None and self._exchange_user != session.user:
            # the broker closes a connection whose principal changes (KIP-368)
            self._fail(f"re-authentication as {self._exchange_user!r}, not {session.user!r}")
            return
        session.authenticated = True
        session.mechanism = mechanism
        session.user = self._exchange_user
        session.delegation_token = self._token_auth
        session.expires_at = (self._sent_at + lifetime_ms / 1000) if lifetime_ms > 0 else None
        if again:
            session.reauthentications += 1
        CLIENT_AUTHENTICATIONS.labels(session.listener, mechanism_label(mechanism),
                                      "reauthenticated" if again else "ok").inc()
        if self._is_fleet_user is not None:
            session.fleet_peer = self._is_fleet_user(session.user)
        self._steps = -1
        log.debug("%s: %s with %s%s", self.name, session.describe(), mechanism,
                  f", session {lifetime_ms} ms" if lifetime_ms else "")

    def _fail(self, reason: str) -> None:
        if self.session.failed is None:
            self.session.failed = reason
            CLIENT_AUTHENTICATIONS.labels(self.session.listener,
                                          mechanism_label(self._mechanism), "failed").inc()
            log.info("%s: the broker refused the client's authentication: %s", self.name, reason)


def user_of(mechanism: str, token: bytes) -> tuple[str | None, bool]:
    """(user name, delegation token) from the first SaslAuthenticate token of ``mechanism``;
    the user name is None where the mechanism does not reveal it. Nothing else of the token
    (a password, a proof) is kept."""
    if mechanism == "PLAIN":
        parts = token.split(b"\0")
        if len(parts) != 3:
            return None, False
        return _text(parts[1]), False
    if mechanism.startswith("SCRAM-"):
        text = _text(token)
        if text is None:
            return None, False
        fields = text.split(",")
        if len(fields) < 3:  # gs2 flag, authzid, then the bare message
            return None, False
        user: str | None = None
        token_auth = False
        for item in fields[2:]:
            name, _, value = item.partition("=")
            if name == "n":
                user = value.replace("=2C", ",").replace("=3D", "=")
            elif name == "tokenauth":
                token_auth = value.lower() == "true"
        return (None if token_auth else user), token_auth
    return None, False


def _text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _name(key: int) -> str:
    try:
        return ApiKey(key).name
    except ValueError:
        return f"api key {key}"


def _decode(request: RequestInfo) -> dict[str, Any]:
    try:
        header = parse_request_header(request.frame)
        value, _ = messages.decode_request(request.api_key, request.api_version, request.frame,
                                           header.header_length)
    except CodecError as exc:
        raise RejectRequest(f"malformed {_name(request.api_key)}: {exc}") from None
    return value


def _decode_response(key: int, version: int, payload: memoryview) -> dict[str, Any]:
    start = body_offset(payload, messages.response_header_version(key, version))
    value, _ = messages.decode_response(key, version, payload, start)
    return value
