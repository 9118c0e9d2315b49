"""Pod-local liveness through the running server: real client sockets on loopback, the
router factory of ``groupgate run``, the server's close hooks, the service's engine. A client
whose every connection is reset at once loses its member; one whose broker connection the
proxy closed does not."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from proxy.app import make_router_factory
from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.header import encode_request_header
from proxy.codec.schema import struct_default
from proxy.config import ProxyConfig
from proxy.coordination.pod_liveness import PodLiveness
from proxy.coordination.service import CoordinatorService
from proxy.frames import FrameSplitter, encode_frame
from proxy.server import ProxyServer

from .helpers import TOPIC, coordinate, make_service

JOIN = {"group_id": "g", "member_id": "", "member_epoch": 0, "instance_id": None,
        "rack_id": None, "rebalance_timeout_ms": 30000, "subscribed_topic_names": [TOPIC],
        "server_assignor": None, "topic_partitions": []}


def frame(key: int, version: int, value: dict[str, Any], correlation: int) -> bytes:
    return encode_frame(encode_request_header(key, version, correlation, "app")
                        + messages.encode_request(key, version, value))


class Broker:
    """Answers ApiVersions (with no API: the proxy adds the ones it serves itself) and
    nothing else. ``close_all`` closes every connection."""

    def __init__(self) -> None:
        self.streams: list[trio.SocketStream] = []

    async def serve(self, stream: trio.SocketStream) -> None:
        self.streams.append(stream)
        splitter = FrameSplitter(1 << 20)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while data := await stream.receive_some(65536):
                blob, spans = splitter.feed(data)
                for start, _end in spans:
                    key, version, correlation = struct.unpack_from(">hhi", blob, start)
                    if key == ApiKey.API_VERSIONS:
                        body = messages.encode_response(key, version, {
                            **struct_default(messages.schema(key, True).struct, version),
                            "api_keys": [{"api_key": k, "min_version": 0, "max_version": v}
                                         for k, v in ((18, 3), (3, 12), (10, 4))]})
                        await stream.send_all(encode_frame(struct.pack(">i", correlation)
                                                           + body))

    async def close_all(self) -> None:
        for stream in self.streams:
            await stream.aclose()


@asynccontextmanager
async def sidecar(service: CoordinatorService, liveness: PodLiveness, broker: Broker
                  ) -> AsyncIterator[ProxyServer]:
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, broker.serve, listeners)
        config = ProxyConfig(upstream=(("127.0.0.1", listeners[0].socket.getsockname()[1]),),
                             listen=("127.0.0.1", 0), shutdown_grace=1.0)
        server = ProxyServer(config, make_router_factory(config, service, liveness))
        server.connection_closed = liveness.connection_closed
        server.connection_refused = liveness.connection_refused
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        await nursery.start(liveness.run)
        await nursery.start(server.run)
        yield server
        nursery.cancel_scope.cancel()


async def client(server: ProxyServer, connections: int) -> tuple[list[trio.SocketStream], str]:
    """A client with ``connections`` connections, each opened with ApiVersions (KIP-511), and
    a member joined on the first one; returns its connections and member id."""
    streams = [await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
               for _ in range(connections)]
    for stream in streams:
        await stream.send_all(frame(ApiKey.API_VERSIONS, 3,
                                    {"client_software_name": "librdkafka",
                                     "client_software_version": "2.6.1"}, 1))
    group = streams[0]
    await group.send_all(frame(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, JOIN, 2))
    splitter = FrameSplitter(1 << 20)
    joined: dict[str, Any] | None = None
    while joined is None:
        blob, spans = splitter.feed(await group.receive_some(65536))
        for start, end in spans:
            if struct.unpack_from(">i", blob, start)[0] == 2:  # after ApiVersions' answer
                joined, _ = messages.decode_response(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                                     memoryview(blob)[start:end], 5)
    member_id = joined["member_id"]
    await group.send_all(frame(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                               {**JOIN, "member_id": member_id,
                                "member_epoch": joined["member_epoch"],
                                "subscribed_topic_names": None, "topic_partitions": None,
                                "rebalance_timeout_ms": -1}, 3))
    await trio.sleep(0.1)  # decided by the proxy
    return streams, member_id


def reset(stream: trio.SocketStream) -> None:
    """Close with RST, as the kernel does for a killed process with unread data."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


async def test_a_killed_client_loses_its_member_a_broker_close_does_not() -> None:
    service = make_service()
    coordinate(service, "g")
    liveness = PodLiveness(service, window_ms=200, grace_ms=300)
    broker = Broker()
    async with sidecar(service, liveness, broker) as server:
        streams, survivor = await client(server, 3)
        await broker.close_all()  # e.g. a broker restart: the proxy closes the clients
        with trio.fail_after(5):
            for stream in streams:
                while await stream.receive_some(65536):
                    pass  # answers before the close
        await trio.sleep(1)
        assert survivor in service.engine.groups["g"].members
        streams, member_id = await client(server, 3)
        for stream in streams:
            reset(stream)
        with trio.fail_after(5):
            while member_id in service.engine.groups["g"].members:
                await trio.sleep(0.05)
        assert survivor in service.engine.groups["g"].members
