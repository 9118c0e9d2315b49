"""FleetControl: the one request type sidecars send each other (decision record 0018, section 5).

API key :data:`FLEET_CONTROL`, version 0, request header v1, a JSON body
``{"type": ..., ...}`` of at most :data:`MAX_BODY_BYTES`; the answer is an error code, and for
some types a JSON body after it. It is answered only on the fleet listener, to peers that
proved they are sidecars (``fleet-auth``); anything else closes the connection.

* :class:`FleetControlRouter` sits in front of a fleet-listener connection's router and
  answers FleetControl from a table of :data:`Handler` s, one per message type: ``MemberGone``
  (pod-local liveness, :mod:`.pod_liveness`), ``GroupConverting``, ``GroupConverted`` and
  ``ConversionAborted`` (the online upgrade across sidecars, :mod:`.upgrade`). ``CommitTicket``,
  ``CommitDone``, ``Remainder`` and ``Heartbeat`` (requests of members behind a follower
  sent under the client's principal, :mod:`.as_the_client`) are answered by the connection's
  own router (``commit_tickets``: they are decided as the relayed requests on that connection
  are), and may carry a whole request (:data:`MAX_TICKET_BODY_BYTES`). A
  type without a handler is answered UNSUPPORTED_VERSION, a malformed body INVALID_REQUEST.
* :func:`send` delivers one message on a connection of its own and returns the answer.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from proxy.codec.header import parse_request_header
from proxy.connection import EXAMINE, Decision, Local, RejectRequest, RequestInfo, Router
from proxy.coordination.fleet import Address
from proxy.security.policy import Security
from proxy.security.session import Session
from proxy.upstream import UpstreamClient, UpstreamError
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.coordination")

FLEET_CONTROL = 32100
"""The fleet's own request type (fleet listener only)."""
FLEET_CONTROL_VERSION = 0
MAX_BODY_BYTES = 64 * 1024
"""Longest body accepted (a ``GroupConverting`` answer lists the members behind a sidecar)."""
MAX_TICKET_BODY_BYTES = 4 << 20
"""A ``CommitTicket`` carries a whole commit (:mod:`.tickets`)."""
TICKET_TYPES = frozenset({"CommitTicket", "CommitDone", "Remainder", "Heartbeat"})
"""Types the connection's own router answers (:mod:`.as_the_client`)."""
_ERROR = struct.Struct(">ih")
_CORRELATION = struct.Struct(">i")

Body = dict[str, Any]
Answer = ErrorCode | tuple[ErrorCode, Body]
Handler = Callable[[Body, str], Answer | Awaitable[Answer]]
"""What answers one message type: the body and the peer's address (for log lines); an error
code, or an error code and a JSON body; awaitable where the answer must wait."""


class FleetControlRouter:
    """The router of a fleet-listener connection with ``FleetControl`` answered in front of
    it (from authenticated peers only; everything else goes to ``inner``)."""

    def __init__(self, inner: Router, handlers: Mapping[str, Handler], session: Session,
                 peer: str) -> None:
        self._inner = inner
        self._handlers = handlers
        self._session = session
        self._peer = peer

    def classify(self, request: RequestInfo) -> int:
        if request.api_key != FLEET_CONTROL:
            return self._inner.classify(request)
        if not self._session.fleet_peer:
            raise RejectRequest("FleetControl from a client that is not a fleet peer")
        return EXAMINE

    def decide(self, request: RequestInfo) -> Decision:
        if request.api_key != FLEET_CONTROL:
            return self._inner.decide(request)
        parsed = self._parse(request)
        if isinstance(parsed, ErrorCode):
            return Local(_encode(request.correlation_id, parsed))
        handler, body = parsed
        if handler is None:  # a commit ticket: the connection's own router answers it
            tickets = getattr(self._inner, "commit_tickets", None)
            if tickets is None:
                return Local(_encode(request.correlation_id, ErrorCode.UNSUPPORTED_VERSION))
            encoded = tickets(body)
            if isinstance(encoded, bytes):
                return Local(_CORRELATION.pack(request.correlation_id) + encoded)
            return Local(_prefixed(request.correlation_id, encoded))
        answer = handler(body, f"the sidecar at {self._peer}")
        if isinstance(answer, (ErrorCode, tuple)):
            return Local(_encode(request.correlation_id, answer))
        return Local(_later(request.correlation_id, answer))

    def decide_oversized(self, request: RequestInfo) -> int:
        if request.api_key == FLEET_CONTROL:
            raise RejectRequest("FleetControl is a small request")
        return self._inner.decide_oversized(request)

    def response_rewriter(self, api_key: int, api_version: int
                          ) -> Callable[[memoryview], Any] | None:
        return self._inner.response_rewriter(api_key, api_version)

    async def aclose(self) -> None:
        closer = getattr(self._inner, "aclose", None)
        if closer is not None:
            await closer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _parse(self, request: RequestInfo) -> tuple[Handler | None, Body] | ErrorCode:
        """The message's handler (None: a commit ticket) and body, or the error answering it."""
        frame = request.frame
        try:
            header = parse_request_header(frame, flexible=False)
            if request.api_version != FLEET_CONTROL_VERSION:
                return ErrorCode.UNSUPPORTED_VERSION
            raw = bytes(frame[header.header_length:])
            if len(raw) > MAX_TICKET_BODY_BYTES:
                return ErrorCode.INVALID_REQUEST
            body = json.loads(raw)
        except (ValueError, KeyError, TypeError, RecursionError):
            return ErrorCode.INVALID_REQUEST
        if not isinstance(body, dict) or not isinstance(body.get("type"), str):
            return ErrorCode.INVALID_REQUEST
        if body["type"] in TICKET_TYPES:
            return None, body
        if len(raw) > MAX_BODY_BYTES:
            return ErrorCode.INVALID_REQUEST
        handler = self._handlers.get(body["type"])
        if handler is None:
            return ErrorCode.UNSUPPORTED_VERSION
        return handler, body


def _encode(correlation_id: int, answer: Answer) -> bytes:
    if isinstance(answer, tuple):
        error, body = answer
        return _ERROR.pack(correlation_id, int(error)) + json.dumps(
            body, separators=(",", ":")).encode()
    return _ERROR.pack(correlation_id, int(answer))


async def _prefixed(correlation_id: int, answer: Awaitable[bytes]) -> bytes:
    return _CORRELATION.pack(correlation_id) + await answer


async def _later(correlation_id: int, answer: Awaitable[Answer]) -> bytes:
    try:
        return _encode(correlation_id, await answer)
    except Exception:  # a failure stays with this message: answered, logged
        log.exception("FleetControl failed")
        return _encode(correlation_id, ErrorCode.UNKNOWN_SERVER_ERROR)


def field(body: Body, name: str, kind: type, limit: int = 1000) -> Any:
    """``body[name]`` if it is a ``kind`` (strings cut at ``limit``); KeyError/TypeError
    otherwise (the caller answers INVALID_REQUEST)."""
    value = body[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{name} is not a {kind.__name__}")
    return value[:limit] if isinstance(value, str) else value


async def send(address: Address, body: Body, *, security: Security, timeout: float
               ) -> tuple[int, Body | None]:
    """Deliver one message to the sidecar whose fleet listener is at ``address``: (error code,
    answer body or None). Raises :class:`UpstreamError` if it cannot be delivered or is not
    answered within ``timeout``."""
    data = json.dumps(body, separators=(",", ":")).encode()
    with trio.move_on_after(timeout) as late:
        client = await UpstreamClient.connect(address, timeout=timeout,
                                              max_frame_bytes=MAX_BODY_BYTES + 64,
                                              security=security, peer=True)
        try:
            answer = await client.exchange_raw(FLEET_CONTROL, FLEET_CONTROL_VERSION, data)
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
    if late.cancelled_caught:
        raise UpstreamError(f"{address[0]}:{address[1]} did not answer within {timeout:.1f} s")
    try:
        (error,) = struct.unpack_from(">h", answer, 0)
        rest = answer[2:]
        parsed = json.loads(rest) if rest else None
    except (struct.error, ValueError) as exc:
        raise UpstreamError(f"{address[0]}:{address[1]}: unreadable answer: {exc}") from exc
    return error, parsed if isinstance(parsed, dict) else None


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
