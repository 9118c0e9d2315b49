"""Every byte a client can make the proxy hold is bounded by a setting: examined requests
(per request and across connections), responses held behind a slow local answer, open
connections. Loopback sockets with a scripted peer in place of the broker."""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from proxy.budget import ByteBudget
from proxy.config import ProxyConfig
from proxy.connection import (
    EXAMINE,
    FORWARD,
    Connection,
    Local,
    RejectRequest,
    RequestInfo,
    Rewrite,
)
from proxy.frames import encode_frame
from proxy.orderer import HeldBytes
from proxy.server import ProxyServer
from tests.unit.proxy.test_connection import read_frames, request
from tests.unit.proxy.test_server import echo_upstream

OFFSET_COMMIT, HEARTBEAT, FETCH = 8, 12, 1


class ExaminingRouter:
    """OffsetCommit is examined and forwarded as it is (a group the proxy does not
    coordinate); Heartbeat is answered locally once ``release`` is set; the rest forwarded."""

    def __init__(self, oversized_passes: bool = False) -> None:
        self.release = trio.Event()
        self.examined: list[int] = []
        self.oversized_passes = oversized_passes
        """Whether a request too large to decode may be forwarded untouched (its group is not
        the proxy's)."""
        self.oversized: list[int] = []
        self.answer_upstream = False

    def classify(self, request: RequestInfo) -> int:
        return EXAMINE if request.api_key in (OFFSET_COMMIT, HEARTBEAT) else FORWARD

    def decide(self, request: RequestInfo) -> int | Local:
        self.examined.append(len(request.frame))
        if request.api_key == HEARTBEAT:
            return Local(self._answer(request.correlation_id),
                         holds_later=self.answer_upstream)
        return FORWARD

    def decide_oversized(self, request: RequestInfo) -> int:
        self.oversized.append(request.correlation_id)
        if not self.oversized_passes:
            raise RejectRequest("its group is coordinated by the proxy")
        return FORWARD

    async def _answer(self, correlation_id: int) -> bytes | Rewrite:
        await self.release.wait()
        if self.answer_upstream:  # e.g. a commit that waited, then goes to the broker
            return Rewrite(struct.pack(">hhih", HEARTBEAT, 4, correlation_id, -1),
                           lambda payload: None)
        return struct.pack(">ihi", correlation_id, 0, 0)

    def response_rewriter(self, api_key: int, api_version: int) -> None:
        return None


Script = Callable[[trio.SocketStream, trio.SocketStream, Connection, trio.Event],
                  Awaitable[None]]


async def run(router: ExaminingRouter, script: Script, **limits: Any) -> None:
    """client <-> Connection <-> peer over loopback; ``script(client, peer, conn, closed)``."""
    async with trio.open_nursery() as nursery:
        upstream_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        proxy_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        made: list[Connection] = []
        done = trio.Event()

        async def serve_one() -> None:
            client_side = await proxy_listeners[0].accept()
            upstream = await trio.open_tcp_stream(
                "127.0.0.1", upstream_listeners[0].socket.getsockname()[1])
            conn = Connection(client_side, upstream, router,  # type: ignore[arg-type]
                              max_frame_bytes=1 << 26, max_in_flight=64, name="test",
                              **limits)
            made.append(conn)
            try:
                await conn.run()
            finally:
                done.set()

        nursery.start_soon(serve_one)
        client = await trio.open_tcp_stream("127.0.0.1",
                                            proxy_listeners[0].socket.getsockname()[1])
        peer = await upstream_listeners[0].accept()
        await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(30):
            await script(client, peer, made[0], done)
        nursery.cancel_scope.cancel()


async def test_a_large_examined_request_is_decided_whole_and_forwarded() -> None:
    """160 KiB, like an OffsetCommit of 10,000 partitions: examined whole (it used to be
    classified from a 1 KiB prefix and the connection closed), then forwarded intact."""
    router = ExaminingRouter()
    budget = ByteBudget(1 << 20)
    body = bytes(range(256)) * 640
    sent = request(OFFSET_COMMIT, 2, 5, body)

    async def script(client, peer, conn, done):  # type: ignore[no-untyped-def]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, sent)
            got = await read_frames(peer, 1)
        assert encode_frame(got[0]) == sent and router.examined == [len(sent) - 4]
        await peer.send_all(encode_frame(struct.pack(">i", 5) + b"answer"))
        assert await read_frames(client, 1) == [struct.pack(">i", 5) + b"answer"]
        assert budget.used == 0  # the reservation was given back

    await run(router, script, examined_budget=budget)


async def test_an_examined_request_over_the_bound_closes_its_connection(
        caplog: pytest.LogCaptureFixture) -> None:
    router = ExaminingRouter()
    budget = ByteBudget(1 << 20)

    async def script(client, peer, conn, done):  # type: ignore[no-untyped-def]
        with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):
            # the proxy stops reading and closes: the rest of the frame may not even be sent
            await client.send_all(request(OFFSET_COMMIT, 2, 5, b"x" * (300 << 10)))
            await client.send_all(b"x" * (1 << 20))
        await done.wait()
        assert router.examined == [] and budget.used == 0

    with caplog.at_level("WARNING"):
        await run(router, script, max_examined_request_bytes=200 << 10,
                  examined_budget=budget)
    assert "exceeds max-examined-request-bytes" in caplog.text


@pytest.mark.parametrize("size", [300 << 10, 90 << 10], ids=["cut-through", "whole"])
async def test_a_request_over_the_bound_for_a_group_not_coordinated_is_forwarded(
        size: int) -> None:
    """Not decoded, forwarded as it is: the broker answers, as it would without the proxy.
    (A request over the bound arrives in pieces and is streamed; a smaller bound than one
    receive applies to whole frames.)"""
    router = ExaminingRouter(oversized_passes=True)
    sent = request(OFFSET_COMMIT, 2, 5, b"z" * size)

    async def script(client, peer, conn, done):  # type: ignore[no-untyped-def]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, sent)
            got = await read_frames(peer, 1)
        assert encode_frame(got[0]) == sent
        assert router.examined == [] and router.oversized == [5]
        await peer.send_all(encode_frame(struct.pack(">i", 5) + b"broker"))
        assert await read_frames(client, 1) == [struct.pack(">i", 5) + b"broker"]

    await run(router, script, max_examined_request_bytes=64 << 10)


async def test_a_slow_sender_cannot_keep_the_shared_budget(
        caplog: pytest.LogCaptureFixture) -> None:
    """A client that sends the start of a large group request and then stalls holds its part
    of the shared budget only for a bounded time; then its connection is closed."""
    router = ExaminingRouter()
    budget = ByteBudget(1 << 20)

    async def script(client, peer, conn, done):  # type: ignore[no-untyped-def]
        await client.send_all(request(OFFSET_COMMIT, 2, 5, b"x" * (600 << 10))[:200 << 10])
        await trio.sleep(0.1)
        assert budget.used > 0  # it holds its reservation while it is sending
        await done.wait()  # closed by the proxy
        assert budget.used == 0 and router.examined == []

    with caplog.at_level("WARNING"):
        await run(router, script, examined_budget=budget, examined_read_seconds=0.5)
    assert "took longer than 0.5s to arrive" in caplog.text
    # the request's own size, not the frame buffer's state once its tail was moved in
    assert f"a {len(request(OFFSET_COMMIT, 2, 5, b'x' * (600 << 10))) - 4}-byte group " \
        "request took" in caplog.text, caplog.text


async def test_examined_requests_wait_for_the_shared_budget() -> None:
    budget = ByteBudget(1000)
    got: list[int] = []
    assert await budget.acquire(600) == 600

    async def second() -> None:
        got.append(await budget.acquire(600))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and budget.used == 600
        budget.release(600)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [600] and budget.used == 600
    budget.release(600)
    assert await budget.acquire(5000) == 1000  # a request larger than the budget takes it all


@pytest.mark.parametrize("shared", [False, True], ids=["per-connection", "all-connections"])
async def test_responses_held_behind_a_local_answer_are_bounded_in_bytes(shared: bool) -> None:
    """A heartbeat the proxy answers slowly, then 24 fetches answered with 1 MiB each: the
    proxy holds at most the bound (plus one frame) and leaves the rest in the broker's
    socket; once the answer is ready everything arrives in order. The bound of one
    connection, and the bound of all connections together."""
    router = ExaminingRouter()
    limit = 4 << 20
    limits: dict[str, Any] = ({"held": HeldBytes(limit), "max_held_response_bytes": 1 << 30}
                              if shared else {"max_held_response_bytes": limit})
    fetches = 24
    chunk = b"r" * (1 << 20)

    async def script(client, peer, conn, done):  # type: ignore[no-untyped-def]
        await client.send_all(request(HEARTBEAT, 4, 1, b"")
                              + b"".join(request(FETCH, 12, 2 + i, b"") for i in range(fetches)))
        await read_frames(peer, fetches)
        peak = 0

        async def answer_all() -> None:
            for i in range(fetches):
                await peer.send_all(encode_frame(struct.pack(">i", 2 + i) + chunk))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer_all)
            for _ in range(200):
                await trio.sleep(0.005)
                peak = max(peak, conn.orderer.held_bytes)
            assert peak <= limit + len(chunk) + 16
            assert conn.orderer.held_bytes > limit // 2  # it did hold some
            router.release.set()
            back = await read_frames(client, fetches + 1)
        assert [struct.unpack_from(">i", b)[0] for b in back] == list(range(1, fetches + 2))
        assert conn.orderer.held_bytes == 0 and conn.orderer.shared.used == 0

    await run(router, script, **limits)


async def test_connections_beyond_the_bound_are_closed_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    async with trio.open_nursery() as nursery:
        upstream_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, echo_upstream, upstream_listeners)
        config = ProxyConfig(upstream=(("127.0.0.1",
                                        upstream_listeners[0].socket.getsockname()[1]),),
                             listen=("127.0.0.1", 0), shutdown_grace=1.0, max_connections=3)
        server = ProxyServer(config, lambda _s, _n, _h, _session: ExaminingRouter())
        await nursery.start(server.run)
        with caplog.at_level("WARNING"), trio.fail_after(10):
            kept = [await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
                    for _ in range(3)]
            for c in kept:  # each is served
                await c.send_all(request(FETCH, 12, 9, b""))
                assert await read_frames(c, 1) == [struct.pack(">i", 9)]
            extra = await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
            with pytest.raises(trio.BrokenResourceError):
                await extra.send_all(request(FETCH, 12, 9, b""))
                assert await extra.receive_some(100) == b""
                raise trio.BrokenResourceError  # closed without an answer counts the same
            await kept[0].aclose()
            await trio.sleep(0.2)
            again = await trio.open_tcp_stream("127.0.0.1", server.bootstrap_port)
            await again.send_all(request(FETCH, 12, 10, b""))
            assert await read_frames(again, 1) == [struct.pack(">i", 10)]
        assert "max-connections (3) open" in caplog.text
        server.stop()
        nursery.cancel_scope.cancel()


async def test_requests_after_an_answer_that_may_go_upstream_wait_for_it() -> None:
    """A commit the proxy holds (its group's broker membership is rejoining) and then sends to
    the broker: the fetches the client sent after it reach the broker after it, as a Kafka
    broker would handle them, and their responses are never held behind it."""
    router = ExaminingRouter()
    router.answer_upstream = True

    async def script(client, peer, conn, done):  # type: ignore[no-untyped-def]
        await client.send_all(request(HEARTBEAT, 4, 1, b"")
                              + b"".join(request(FETCH, 12, 2 + i, b"") for i in range(3)))
        with trio.move_on_after(0.3):
            await peer.receive_some(100)
            raise AssertionError("a request overtook the held answer")
        router.release.set()
        frames = await read_frames(peer, 4)
        assert [struct.unpack_from(">hhi", f)[2] for f in frames] == [1, 2, 3, 4]
        await peer.send_all(b"".join(encode_frame(struct.pack(">i", c) + b"r")
                                     for c in (1, 2, 3, 4)))
        back = await read_frames(client, 4)
        assert [struct.unpack_from(">i", b)[0] for b in back] == [1, 2, 3, 4]

    await run(router, script)
