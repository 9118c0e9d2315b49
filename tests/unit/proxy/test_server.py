"""ProxyServer over loopback with a scripted upstream: an unexpected error on one connection
closes that connection only, and the server keeps accepting."""

from __future__ import annotations

import struct

import trio

from proxy.config import ProxyConfig
from proxy.connection import FORWARD, RequestInfo
from proxy.frames import FrameSplitter, encode_frame
from proxy.server import ProxyServer


class ExplodingRouter:
    """Forwards everything except API key 99, on which it fails like a bug would."""

    def classify(self, request: RequestInfo) -> int:
        if request.api_key == 99:
            raise RuntimeError("simulated bug")
        return FORWARD

    def decide(self, request: RequestInfo) -> int:
        raise AssertionError("unused")

    def response_rewriter(self, api_key: int, api_version: int) -> None:
        return None


def request(api_key: int, correlation_id: int) -> bytes:
    return encode_frame(struct.pack(">hhih", api_key, 0, correlation_id, -1))


async def echo_upstream(stream: trio.SocketStream) -> None:
    """Answers every request frame with its correlation id (no Kafka semantics)."""
    splitter = FrameSplitter(1 << 20)
    async with stream:
        while data := await stream.receive_some(65536):
            blob, spans = splitter.feed(data)
            for start, _end in spans:
                (correlation_id,) = struct.unpack_from(">i", blob, start + 4)
                await stream.send_all(encode_frame(struct.pack(">i", correlation_id)))


async def test_unexpected_error_closes_only_its_connection() -> None:
    async with trio.open_nursery() as nursery:
        upstream_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        upstream_port = upstream_listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, echo_upstream, upstream_listeners)
        config = ProxyConfig(upstream=(("127.0.0.1", upstream_port),),
                             listen=("127.0.0.1", 0), shutdown_grace=1.0)
        server = ProxyServer(config, lambda _server, _node, _host, _session: ExplodingRouter())
        await nursery.start(server.run)

        bystander = await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
        victim = await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
        with trio.fail_after(10):
            await victim.send_all(request(99, 1))
            assert await victim.receive_some(100) == b""
            await bystander.send_all(request(3, 7))
            reply = await bystander.receive_some(100)
            assert struct.unpack_from(">ii", reply, 0) == (4, 7)
            late = await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
            await late.send_all(request(3, 8))
            assert struct.unpack_from(">ii", await late.receive_some(100), 0) == (4, 8)
        server.stop()
        await server.stopped.wait()
        nursery.cancel_scope.cancel()


async def test_a_broker_port_that_cannot_be_bound_does_not_break_the_others() -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    config = ProxyConfig(upstream=(("127.0.0.1", 1),), listen=("127.0.0.1", 0),
                         broker_port_base=port - 1)
    server = ProxyServer(config, lambda _server, _node, _host, _session: ExplodingRouter())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        # Node 1 maps onto the taken port: the client gets that (refusing) address, no error.
        assert server.lookup(1, "broker-1", 9092) == ("127.0.0.1", port)
        assert 1 not in server.brokers
        _, other = server.lookup(2, "broker-2", 9092)
        assert other == port + 1 and server.brokers[2].upstream == ("broker-2", 9092)
        # Ports past 65535 are refused the same way instead of wrapping around.
        far = ProxyConfig(upstream=config.upstream, broker_port_base=65535)
        server.config = far
        assert server.lookup(7, "broker-7", 9092)[1] == 65542 and 7 not in server.brokers
        server.stop()
    taken.close()


async def test_a_malformed_upstream_host_closes_the_client_only() -> None:
    config = ProxyConfig(upstream=(("kafka-7..internal", 9092),), listen=("127.0.0.1", 0),
                         connect_timeout=2.0)
    server = ProxyServer(config, lambda _server, _node, _host, _session: ExplodingRouter())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        for _ in range(2):
            client = await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
            with trio.fail_after(10):
                assert await client.receive_some(10) == b""
        server.stop()
