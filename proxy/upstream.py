"""A minimal Kafka client connection the proxy uses for its own requests to brokers.

One request at a time per :class:`UpstreamClient` (the callers are background tasks such as
the broker-directory refresh), so correlation ids are simply counted. Requests and responses
are values of :mod:`proxy.codec.messages`; transport errors raise :class:`UpstreamError`.

With a :class:`~proxy.security.policy.Security` the connection is made as the cluster wants it:
TLS for ``SSL``/``SASL_SSL``, then SASL with the proxy's own identity for ``SASL_*``
(:mod:`proxy.security.sasl_client`), and again on the same connection before the session the
broker granted ends (KIP-368). A connection to another sidecar's fleet listener (``peer``)
uses the fleet's TLS and authenticates only when ``fleet-auth`` is ``sasl``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import TYPE_CHECKING, Any

import trio

from proxy.codec import messages
from proxy.codec.errors import CodecError
from proxy.codec.header import encode_request_header
from proxy.frames import FrameError, FrameSplitter
from proxy.security.sasl_client import REAUTH_FRACTION, AuthenticationFailed, authenticate
from proxy.security.tls import TlsError
from proxy.security.tlsstream import TlsStream

if TYPE_CHECKING:
    from proxy.security.identity import Identity
    from proxy.security.policy import Security

CLIENT_ID = "groupgate"


class UpstreamError(Exception):
    """The broker could not be reached or answered something unusable."""


class UpstreamConnectError(UpstreamError):
    """No connection could be opened (refused, unreachable, timed out, a failed TLS
    handshake): as opposed to a connection that was open and then failed."""


class UpstreamAuthenticationError(UpstreamError):
    """The broker refused the proxy's own credentials (or its mechanism)."""


class UpstreamClient:
    def __init__(self, stream: trio.abc.Stream, *, max_frame_bytes: int,
                 identity: Identity | None = None) -> None:
        """``identity``: authenticate with it (:meth:`authenticate`) and again before the
        session the broker granted ends."""
        self._stream = stream
        self._splitter = FrameSplitter(max_frame_bytes, min_frame_bytes=4)
        self._pending: list[bytes] = []
        self._correlation = 0
        self._identity = identity
        self._reauthenticate_at: float | None = None

    @classmethod
    async def connect(cls, address: tuple[str, int], *, timeout: float,
                      max_frame_bytes: int, security: Security | None = None,
                      peer: bool = False) -> UpstreamClient:
        """Connect (TLS and SASL as ``security`` says) within ``timeout``; ``peer``: the
        fleet listener of another sidecar rather than a broker."""
        where = f"{address[0]}:{address[1]}"
        with trio.move_on_after(timeout):
            try:
                if security is None:
                    stream: trio.abc.Stream = await trio.open_tcp_stream(*address)
                elif peer:
                    stream = await security.open_peer(address)
                else:
                    stream = await security.open_upstream(address, own=True)
            except (OSError, ValueError, TlsError) as exc:  # ValueError: a malformed host
                raise UpstreamConnectError(f"{where}: {exc}") from exc
            identity = None
            if security is not None and (security.peer_sasl if peer else True):
                identity = security.identity
            client = cls(stream, max_frame_bytes=max_frame_bytes, identity=identity)
            try:
                await client.authenticate()
            except BaseException:
                with trio.CancelScope(shield=True):
                    await client.aclose()
                raise
            return client
        raise UpstreamConnectError(f"{where}: connect timed out")

    async def authenticate(self) -> None:
        """SASL with the identity given (nothing without one); UpstreamError on failure."""
        if self._identity is None:
            return
        try:
            lifetime_ms = await authenticate(self._exchange, self._identity)
        except AuthenticationFailed as exc:
            raise UpstreamAuthenticationError(str(exc)) from None
        self._reauthenticate_at = (trio.current_time() + REAUTH_FRACTION * lifetime_ms / 1000
                                   if lifetime_ms > 0 else None)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def reset(self) -> None:
        """Close with a reset (:func:`reset_on_close`): for a connection with a request
        written and not answered, which must not be carried out later."""
        reset_on_close(self._stream)
        await self._stream.aclose()

    async def request(self, api_key: int, version: int, value: dict[str, Any],
                      client_id: str = CLIENT_ID) -> dict[str, Any]:
        await self._reauthenticate_if_due()
        return await self._exchange(api_key, version, value, client_id)

    async def _reauthenticate_if_due(self) -> None:
        if (self._reauthenticate_at is not None
                and trio.current_time() >= self._reauthenticate_at):
            await self.authenticate()  # KIP-368, on this connection

    async def _exchange(self, api_key: int, version: int, value: dict[str, Any],
                        client_id: str = CLIENT_ID) -> dict[str, Any]:
        self._correlation += 1
        correlation_id = self._correlation
        payload = (encode_request_header(api_key, version, correlation_id, client_id)
                   + messages.encode_request(api_key, version, value))
        frame = await self._round_trip(api_key, version, correlation_id, payload)
        header = 4 if messages.response_header_version(api_key, version) == 0 else 5
        try:
            value_out, _ = messages.decode_response(api_key, version, frame, header)
        except CodecError as exc:
            raise UpstreamError(f"undecodable response to {api_key} v{version}: {exc}") from exc
        return value_out

    async def exchange_raw(self, api_key: int, version: int, body: bytes,
                           client_id: str = CLIENT_ID) -> bytes:
        """Send a request whose body the codec does not know (the fleet's own ``FleetControl``,
        request header v1) and return its response body (after the correlation id)."""
        await self._reauthenticate_if_due()
        self._correlation += 1
        correlation_id = self._correlation
        payload = encode_request_header(api_key, version, correlation_id, client_id,
                                        flexible=False) + body
        frame = await self._round_trip(api_key, version, correlation_id, payload)
        return frame[4:]

    async def _round_trip(self, api_key: int, version: int, correlation_id: int,
                          payload: bytes) -> bytes:
        """Send one framed request and read its response frame (checked correlation id)."""
        try:
            await self._stream.send_all(struct.pack(">i", len(payload)) + payload)
            frame = await self._read_frame()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, FrameError) as exc:
            raise UpstreamError(f"request {api_key} v{version} failed: {exc!r}") from exc
        (got,) = struct.unpack_from(">i", frame, 0)
        if got != correlation_id:
            raise UpstreamError(f"correlation id {got}, expected {correlation_id}")
        return frame

    async def _read_frame(self) -> bytes:
        while not self._pending:
            data = await self._stream.receive_some(65536)
            if not data:
                raise UpstreamError("broker closed the connection")
            blob, spans = self._splitter.feed(data)
            self._pending.extend(bytes(blob[a:b]) for a, b in spans)
        return self._pending.pop(0)


def reset_on_close(stream: trio.abc.Stream) -> None:
    """Make closing ``stream`` reset the connection (SO_LINGER 0) instead of ending it.

    For a connection that closes with requests written to the broker (or to another sidecar)
    and not yet answered: the peer reads a connection's requests one at a time, so after a
    graceful close it would still read and carry out those already in its socket buffer,
    however late. A client that closed its connection (librdkafka does when a request times
    out) sends newer commits on its next one, and an older commit carried out after them would
    move the committed offset back. A reset discards what the peer has not read; only the
    request it is already handling can still complete. The client never had answers to the
    others: for it they failed, as on a broken network."""
    transport = stream.transport if isinstance(stream, TlsStream) else stream
    if isinstance(transport, trio.SocketStream):
        with contextlib.suppress(OSError):  # already closed
            transport.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        struct.pack("ii", 1, 0))
