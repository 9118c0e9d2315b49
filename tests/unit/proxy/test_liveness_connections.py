"""How a real connection ended, as pod-local liveness reads it: by the client (end of stream
or reset: may be a death) or by the proxy (the broker closed, hostile input: never)."""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest
import trio

from proxy.connection import (
    FORWARD,
    LARGE_FRAME_BYTES,
    Connection,
    RejectRequest,
    RequestInfo,
)
from proxy.coordination.pod_liveness import closed_by_client
from proxy.frames import encode_frame


class Router:
    def classify(self, request: RequestInfo) -> int:
        if request.api_key == 99:
            raise RejectRequest("hostile")
        return FORWARD

    def decide(self, request: RequestInfo) -> int:
        raise AssertionError("nothing is examined here")

    def response_rewriter(self, api_key: int, api_version: int) -> None:
        return None


def frame(api_key: int) -> bytes:
    return encode_frame(struct.pack(">hhih", api_key, 0, 1, 1) + b"c")


async def ended(script: Callable[[trio.SocketStream, trio.SocketStream], Awaitable[None]],
                *, max_in_flight: int = 16) -> Connection:
    """Run one connection (client <-> Connection <-> broker on loopback) through ``script``
    until it ends; the connection as it ended."""
    broker_listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    proxy_listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    done: list[Connection] = []

    async def serve_one() -> None:
        accepted = await proxy_listener.accept()
        upstream = await trio.open_tcp_stream("127.0.0.1",
                                              broker_listener.socket.getsockname()[1])
        conn = Connection(accepted, upstream, Router(),  # type: ignore[arg-type]
                          max_frame_bytes=1 << 20, max_in_flight=max_in_flight,
                          name="test")
        await conn.run()
        done.append(conn)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_one)
            client = await trio.open_tcp_stream("127.0.0.1",
                                                proxy_listener.socket.getsockname()[1])
            broker = await broker_listener.accept()
            await client.send_all(frame(3))
            assert await broker.receive_some(100)
            await script(client, broker)
    await broker_listener.aclose()
    await proxy_listener.aclose()
    return done[0]


async def test_a_client_closing_or_resetting_is_the_client_s_close() -> None:
    async def close(client: trio.SocketStream, _broker: trio.SocketStream) -> None:
        await client.aclose()

    async def reset(client: trio.SocketStream, _broker: trio.SocketStream) -> None:
        client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 struct.pack("ii", 1, 0))
        await client.aclose()

    assert closed_by_client(await ended(close))
    assert closed_by_client(await ended(reset))


async def test_closes_the_proxy_makes_are_not_the_client_s() -> None:
    async def broker_closes(_client: trio.SocketStream, broker: trio.SocketStream) -> None:
        await broker.aclose()  # e.g. a broker restart, passed on to the client

    async def hostile(client: trio.SocketStream, _broker: trio.SocketStream) -> None:
        await client.send_all(frame(99))

    assert not closed_by_client(await ended(broker_closes))
    assert not closed_by_client(await ended(hostile))


@pytest.mark.parametrize("answer_bytes", [6, 2 * LARGE_FRAME_BYTES],
                         ids=["held-answer", "cut-through-answer"])
async def test_a_client_reset_seen_while_answering_it_is_the_client_s_close(
        answer_bytes: int) -> None:
    """A killed client whose socket the proxy first touches by sending it a response (its
    request pump waiting elsewhere): the failed send is the client's close, as a failed read
    is. The request pump waits for space here (one request in flight at most), so only the
    response side can notice; a large answer goes through the cut-through path."""
    async def reset_then_answer(client: trio.SocketStream, broker: trio.SocketStream) -> None:
        await client.send_all(frame(3))  # read by the proxy, waiting for space to forward
        await trio.sleep(0.2)
        client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                 struct.pack("ii", 1, 0))
        await client.aclose()  # a reset, as from a killed process with unread data
        await trio.sleep(0.2)
        with contextlib.suppress(trio.BrokenResourceError):  # the proxy may reset it
            await broker.send_all(encode_frame(struct.pack(">i", 1) + b"a" * answer_bytes))
            while await broker.receive_some(100):  # until the proxy closes it
                pass

    conn = await ended(reset_then_answer, max_in_flight=1)
    assert conn.closing_reason is not None
    assert closed_by_client(conn), conn.closing_reason
