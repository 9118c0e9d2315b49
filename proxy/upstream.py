"""A minimal Kafka client connection the proxy uses for its own requests to brokers.

One request at a time per :class:`UpstreamClient` (the callers are background tasks such as
the broker-directory refresh), so correlation ids are simply counted. Requests and responses
are values of :mod:`proxy.codec.messages`; transport errors raise :class:`UpstreamError`.
"""

from __future__ import annotations

import struct
from typing import Any

import trio

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.errors import CodecError
from proxy.codec.header import encode_request_header
from proxy.frames import FrameError, FrameSplitter

CLIENT_ID = "groupgate"


class UpstreamError(Exception):
    """The broker could not be reached or answered something unusable."""


class UpstreamClient:
    def __init__(self, stream: trio.SocketStream, *, max_frame_bytes: int) -> None:
        self._stream = stream
        self._splitter = FrameSplitter(max_frame_bytes, min_frame_bytes=4)
        self._pending: list[bytes] = []
        self._correlation = 0

    @classmethod
    async def connect(cls, address: tuple[str, int], *, timeout: float,
                      max_frame_bytes: int) -> UpstreamClient:
        with trio.move_on_after(timeout):
            try:
                stream = await trio.open_tcp_stream(*address)
            except (OSError, ValueError) as exc:  # ValueError: a malformed host name
                raise UpstreamError(f"{address[0]}:{address[1]}: {exc}") from exc
            return cls(stream, max_frame_bytes=max_frame_bytes)
        raise UpstreamError(f"{address[0]}:{address[1]}: connect timed out")

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def request(self, api_key: int, version: int, value: dict[str, Any],
                      client_id: str = CLIENT_ID) -> dict[str, Any]:
        self._correlation += 1
        correlation_id = self._correlation
        payload = (encode_request_header(api_key, version, correlation_id, client_id)
                   + messages.encode_request(api_key, version, value))
        try:
            await self._stream.send_all(struct.pack(">i", len(payload)) + payload)
            frame = await self._read_frame()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, FrameError) as exc:
            raise UpstreamError(f"request {api_key} v{version} failed: {exc!r}") from exc
        (got,) = struct.unpack_from(">i", frame, 0)
        if got != correlation_id:
            raise UpstreamError(f"correlation id {got}, expected {correlation_id}")
        header = 4 if messages.response_header_version(api_key, version) == 0 else 5
        try:
            value_out, _ = messages.decode_response(api_key, version, frame, header)
        except CodecError as exc:
            raise UpstreamError(f"undecodable response to {api_key} v{version}: {exc}") from exc
        return value_out

    async def _read_frame(self) -> bytes:
        while not self._pending:
            data = await self._stream.receive_some(65536)
            if not data:
                raise UpstreamError("broker closed the connection")
            blob, spans = self._splitter.feed(data)
            self._pending.extend(bytes(blob[a:b]) for a, b in spans)
        return self._pending.pop(0)


async def fetch_brokers(address: tuple[str, int], *, timeout: float, max_frame_bytes: int
                        ) -> list[tuple[int, str, int]]:
    """(node_id, host, port) of every broker, from a Metadata request for no topics."""
    client = await UpstreamClient.connect(address, timeout=timeout,
                                          max_frame_bytes=max_frame_bytes)
    try:
        with trio.fail_after(timeout):
            response = await client.request(ApiKey.METADATA, 4, {"topics": [],
                                                          "allow_auto_topic_creation": False})
    except trio.TooSlowError as exc:
        raise UpstreamError(f"{address[0]}:{address[1]}: Metadata timed out") from exc
    finally:
        await client.aclose()
    return [(b["node_id"], b["host"], b["port"]) for b in response["brokers"]]
