"""A request relayed for a client that left before it was answered must never be carried out
later: its link is reset, not closed gracefully (a graceful close lets the other end still read
and act on what is in its socket buffer)."""

from __future__ import annotations

import struct
from functools import partial
from typing import Any

import trio

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.header import parse_request_header, response_header_for
from proxy.coordination.peers import ConnectionLinks
from proxy.frames import encode_frame
from proxy.kafka_client.links import LinkPool

HEARTBEAT = {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None}


async def _read_frame(stream: trio.SocketStream, buffer: bytearray) -> bytes | None:
    while True:
        if len(buffer) >= 4:
            (size,) = struct.unpack(">i", buffer[:4])
            if len(buffer) >= 4 + size:
                frame = bytes(buffer[4:4 + size])
                del buffer[:4 + size]
                return frame
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data


class Peer:
    """A fleet listener that never answers its first connection's request and answers the
    others; notes how that first connection ended."""

    def __init__(self) -> None:
        self.received = trio.Event()
        self.first_ended: str | None = None
        self.first_done = trio.Event()
        self.connections = 0

    async def serve(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        first = self.connections == 1
        buffer = bytearray()
        try:
            while True:
                frame = await _read_frame(stream, buffer)
                if frame is None:
                    if first:
                        self.first_ended = "closed"
                    return
                if first:
                    self.received.set()
                    continue  # never answered
                header = parse_request_header(frame)
                body = messages.encode_response(ApiKey.HEARTBEAT, header.api_version,
                                                {"throttle_time_ms": 0, "error_code": 0})
                await stream.send_all(encode_frame(response_header_for(
                    ApiKey.HEARTBEAT, header.api_version, header.correlation_id) + body))
        except trio.BrokenResourceError:
            if first:
                self.first_ended = "reset"
        finally:
            if first:
                self.first_done.set()


async def test_a_request_abandoned_by_its_client_resets_its_link() -> None:
    peer = Peer()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, peer.serve, 0, host="127.0.0.1"))
        address = listeners[0].socket.getsockname()[:2]
        links = ConnectionLinks(LinkPool(connect_timeout=5, request_timeout=5,
                                         max_frame_bytes=1 << 20))
        answers: list[dict[str, Any]] = []

        async def relay() -> None:
            answers.append(await links.request(address, ApiKey.HEARTBEAT, 3, HEARTBEAT,
                                               "app", to_peer=True))

        async with trio.open_nursery() as client_connection:  # the connection's tasks
            client_connection.start_soon(relay)
            await peer.received.wait()
            client_connection.cancel_scope.cancel()  # the client's connection closed
        await links.aclose()
        assert not answers
        # the coordinating sidecar saw a reset, so whatever it had not read is discarded
        with trio.fail_after(10):
            await peer.first_done.wait()
        assert peer.first_ended == "reset"
        nursery.cancel_scope.cancel()


async def test_the_link_is_used_again_after_a_reset() -> None:
    peer = Peer()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, peer.serve, 0, host="127.0.0.1"))
        address = listeners[0].socket.getsockname()[:2]
        links = ConnectionLinks(LinkPool(connect_timeout=5, request_timeout=5,
                                         max_frame_bytes=1 << 20))
        async with trio.open_nursery() as client_connection:
            client_connection.start_soon(partial(links.request, address, ApiKey.HEARTBEAT, 3,
                                                 HEARTBEAT, "app", to_peer=True))
            await peer.received.wait()
            client_connection.cancel_scope.cancel()
        # progress: the next request of the connection reconnects and is answered
        answer = await links.request(address, ApiKey.HEARTBEAT, 3, HEARTBEAT, "app",
                                     to_peer=True)
        assert answer["error_code"] == 0
        await links.aclose()
        nursery.cancel_scope.cancel()
