"""The server with TLS on both sides (certificates from trustme, a scripted TLS upstream): small
and large frames both ways, the listener terminating TLS, a plaintext client on a TLS listener
and a TLS client on a plaintext listener closed with a log line, never relayed."""

from __future__ import annotations

import contextlib
import logging
import ssl
import struct
from pathlib import Path

import pytest
import trio
import trustme

from proxy.config import ProxyConfig
from proxy.connection import FORWARD, RequestInfo
from proxy.frames import FrameSplitter, encode_frame
from proxy.security.tls import client_context, server_context
from proxy.server import ProxyServer

LARGE = 600 * 1024
"""Above the cut-through size, so large frames take the TLS paths of both pumps."""


class ForwardAll:
    def classify(self, request: RequestInfo) -> int:
        return FORWARD

    def decide(self, request: RequestInfo) -> int:
        return FORWARD

    def decide_oversized(self, request: RequestInfo) -> int:
        return FORWARD

    def response_rewriter(self, api_key: int, api_version: int) -> None:
        return None


def request(correlation_id: int, size: int = 0) -> bytes:
    return encode_frame(struct.pack(">hhih", 3, 0, correlation_id, -1) + b"r" * size)


class Upstream:
    """A TLS broker stand-in: answers each request with its correlation id and as many bytes
    as the request had; counts the frames it received."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.frames = 0

    async def serve(self, tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, self.context, server_side=True)
        splitter = FrameSplitter(8 << 20)
        try:
            while data := await stream.receive_some(65536):
                blob, spans = splitter.feed(data)
                self.frames += len(spans)
                for start, end in spans:
                    (correlation_id,) = struct.unpack_from(">i", blob, start + 4)
                    body = b"a" * (end - start - 10)
                    await stream.send_all(encode_frame(struct.pack(">i", correlation_id) + body))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    ca = trustme.CA()
    paths = {"ca": tmp_path / "ca.pem"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    for name in ("broker", "proxy"):
        leaf = ca.issue_cert("127.0.0.1")
        paths[name] = tmp_path / f"{name}.pem"
        paths[f"{name}-key"] = tmp_path / f"{name}.key"
        leaf.cert_chain_pems[0].write_to_path(str(paths[name]))
        leaf.private_key_pem.write_to_path(str(paths[f"{name}-key"]))
    return paths


async def receive_frame(stream: trio.abc.Stream, splitter: FrameSplitter) -> bytes:
    while True:
        data = await stream.receive_some(1 << 20)
        assert data, "closed"
        blob, spans = splitter.feed(data)
        if spans:
            start, end = spans[0]
            return bytes(blob[start:end])


async def start(nursery: trio.Nursery, pki: dict[str, Path], listener_tls: bool
                ) -> tuple[ProxyServer, Upstream]:
    upstream = Upstream(server_context(cert_file=pki["broker"], key_file=pki["broker-key"]))
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    nursery.start_soon(trio.serve_listeners, upstream.serve, listeners)
    port = listeners[0].socket.getsockname()[1]
    tls = ({"listener_tls_cert_file": str(pki["proxy"]),
            "listener_tls_key_file": str(pki["proxy-key"])} if listener_tls else {})
    config = ProxyConfig(upstream=(("127.0.0.1", port),), listen=("127.0.0.1", 0),
                         shutdown_grace=1.0, security_protocol="SSL",
                         tls_ca_file=str(pki["ca"]), **tls)
    server = ProxyServer(config, lambda _s, _n, _h, _session: ForwardAll())
    await nursery.start(server.run)
    return server, upstream


async def test_frames_small_and_large_both_ways_over_tls(pki: dict[str, Path]) -> None:
    async with trio.open_nursery() as nursery:
        server, _ = await start(nursery, pki, listener_tls=True)
        tcp = await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
        client = trio.SSLStream(tcp, client_context(ca_file=pki["ca"]),
                                server_hostname="127.0.0.1")
        splitter = FrameSplitter(8 << 20)
        with trio.fail_after(20):
            for correlation_id, size in enumerate([10, LARGE, 100, 3 * LARGE, 0]):
                await client.send_all(request(correlation_id, size))
                frame = await receive_frame(client, splitter)
                assert struct.unpack_from(">i", frame)[0] == correlation_id
                assert len(frame) == 4 + size
        await client.aclose()
        server.stop()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("listener_tls", [False, True])
async def test_the_wrong_kind_of_client_is_closed_and_nothing_reaches_the_broker(
        pki: dict[str, Path], listener_tls: bool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with trio.open_nursery() as nursery:
        server, upstream = await start(nursery, pki, listener_tls=listener_tls)
        tcp = await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
        with trio.fail_after(10):
            if listener_tls:
                await tcp.send_all(request(1))  # plaintext on a TLS listener
                # closed with the request unread: an end of stream or a reset
                with contextlib.suppress(trio.BrokenResourceError):
                    assert await tcp.receive_some(100) == b""
            else:
                client = trio.SSLStream(tcp, client_context(ca_file=pki["ca"]),
                                        server_hostname="127.0.0.1")
                with pytest.raises(trio.BrokenResourceError):
                    await client.do_handshake()
        server.stop()
        nursery.cancel_scope.cancel()
    expected = ("plaintext on a TLS listener" if listener_tls
                else "the client started TLS, but this listener has none")
    assert expected in caplog.text
    assert upstream.frames == 0
