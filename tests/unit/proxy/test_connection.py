"""Connection over loopback sockets, with a scripted peer in place of the broker.

No Kafka semantics are faked here: the peer only echoes framed bytes back, which is all the
connection layer may rely on. What is checked is the forwarding machinery itself: bytes arrive
unchanged in both directions, large frames take the cut-through path (splice or copy) intact,
responses stay in request order, and Produce with acks=0 reserves no response slot.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from proxy import connection as connection_module
from proxy.connection import FORWARD, Connection, RequestInfo
from proxy.frames import FrameSplitter, encode_frame
from proxy.metrics import RequestCounters, Traffic
from proxy.rewrite import DictAddressMap
from proxy.router import ForwardingRouter, parse_table


class EchoRouter:
    def classify(self, request: RequestInfo) -> int:
        return FORWARD

    def decide(self, request: RequestInfo) -> int:
        raise AssertionError("nothing is examined here")

    def response_rewriter(self, api_key: int, api_version: int) -> None:
        return None


def request(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    return encode_frame(struct.pack(">hhih", api_key, version, correlation_id, 1) + b"c" + body)


async def read_frames(stream: trio.SocketStream, count: int) -> list[bytes]:
    splitter = FrameSplitter(1 << 26)
    frames: list[bytes] = []
    while len(frames) < count:
        data = await stream.receive_some(1 << 16)
        assert data, "stream closed early"
        blob, spans = splitter.feed(data)
        frames += [bytes(blob[a:b]) for a, b in spans]
    return frames


async def run_with_peer(router: object, script: Callable[[trio.SocketStream, trio.SocketStream],
                                                           Awaitable[None]],
                        *, splice: bool = True, traffic: Traffic | None = None) -> None:
    """Connect client <-> Connection <-> peer over loopback and run ``script(client, peer)``."""
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        proxy_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        proxy_port = proxy_listeners[0].socket.getsockname()[1]

        async def serve_one() -> None:
            client_side = await proxy_listeners[0].accept()
            upstream = await trio.open_tcp_stream("127.0.0.1", port)
            conn = Connection(client_side, upstream, router,  # type: ignore[arg-type]
                              max_frame_bytes=1 << 26, max_in_flight=16, name="test",
                              splice=splice, traffic=traffic)
            await conn.run()

        nursery.start_soon(serve_one)
        client = await trio.open_tcp_stream("127.0.0.1", proxy_port)
        peer = await listeners[0].accept()
        with trio.fail_after(30):
            await script(client, peer)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "copy"])
async def test_large_frames_pass_intact_both_ways(monkeypatch: pytest.MonkeyPatch,
                                                  splice: bool) -> None:
    big = os.urandom(3 << 20)
    small = b"tiny"

    async def script(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        sent = [request(1, 4, 1, small), request(0, 3, 2, big), request(3, 1, 3, small)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, b"".join(sent))
            got = await read_frames(peer, 3)
        assert [encode_frame(g) for g in got] == sent
        responses = [struct.pack(">i", 1) + small, struct.pack(">i", 2) + big,
                     struct.pack(">i", 3) + small]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.send_all, b"".join(encode_frame(r) for r in responses))
            back = await read_frames(client, 3)
        assert back == responses

    await run_with_peer(EchoRouter(), script, splice=splice)


async def test_produce_acks_zero_gets_no_slot_and_order_holds() -> None:
    router = ForwardingRouter(DictAddressMap({}), RequestCounters("test"), parse_table())

    def produce(correlation_id: int, acks: int) -> bytes:
        # Produce v3: transactional_id (null), acks, timeout, topics (empty)
        body = struct.pack(">hhii", -1, acks, 1000, 0)
        return request(0, 3, correlation_id, body)

    async def script(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        await client.send_all(produce(10, 0) + produce(11, 1) + produce(12, 0))
        got = await read_frames(peer, 3)
        assert [struct.unpack_from(">i", g, 4)[0] for g in got] == [10, 11, 12]
        # The broker answers only the acks=1 request; the client must get exactly that.
        await peer.send_all(encode_frame(struct.pack(">i", 11) + b"\x00" * 8))
        back = await read_frames(client, 1)
        assert struct.unpack_from(">i", back[0], 0)[0] == 11

    await run_with_peer(router, script)


async def test_response_for_an_unexpected_correlation_id_closes_the_connection() -> None:
    async def script(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        await client.send_all(request(3, 1, 5, b"\x00\x00\x00\x00"))
        await read_frames(peer, 1)
        await peer.send_all(encode_frame(struct.pack(">i", 6) + b"x"))
        assert await client.receive_some(100) == b""

    await run_with_peer(EchoRouter(), script)


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "copy"])
async def test_slow_client_large_response_streams_without_spinning(
        monkeypatch: pytest.MonkeyPatch, splice: bool) -> None:
    """A client that reads slowly must make the relay sleep, not busy-loop; and the large
    response must go through the cut-through path."""
    waits = {"readable": 0, "writable": 0}
    streamed = []
    real_readable, real_writable = trio.lowlevel.wait_readable, trio.lowlevel.wait_writable
    real_stream = connection_module.stream_frame

    async def counting_readable(sock: object) -> None:
        waits["readable"] += 1
        await real_readable(sock)

    async def counting_writable(sock: object) -> None:
        waits["writable"] += 1
        await real_writable(sock)

    async def recording_stream(*args: object) -> None:
        streamed.append(args)
        await real_stream(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(connection_module.trio.lowlevel, "wait_readable", counting_readable)
    monkeypatch.setattr(connection_module.trio.lowlevel, "wait_writable", counting_writable)
    monkeypatch.setattr(connection_module, "stream_frame", recording_stream)
    big = os.urandom(8 << 20)

    async def script(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        await client.send_all(request(1, 4, 1, b"fetch"))
        await read_frames(peer, 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.send_all, encode_frame(struct.pack(">i", 1) + big))
            received = bytearray()
            while len(received) < 8 + len(big):
                received += await client.receive_some(16384)
                await trio.sleep(0.001)  # a slow consumer
        assert bytes(received[8:]) == big

    await run_with_peer(EchoRouter(), script, splice=splice)
    assert len(streamed) == 1, "the large response was not streamed through"
    # 8 MiB in 16 KiB reads is ~512 client reads; a busy loop would wait 100,000s of times.
    assert waits["readable"] + waits["writable"] < 20_000, waits


async def test_drain_finishes_a_request_in_the_middle_of_arriving() -> None:
    """Shutdown waits for the frame boundary: the broker gets the whole request and the
    client its response, then the connection closes."""
    big = os.urandom(2 << 20)
    frame = request(0, 3, 9, struct.pack(">hhii", -1, 1, 1000, 0) + big)
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        proxy_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        proxy_port = proxy_listeners[0].socket.getsockname()[1]
        conns: list[Connection] = []
        router = ForwardingRouter(DictAddressMap({}), RequestCounters("test"), parse_table())

        async def serve_one() -> None:
            client_side = await proxy_listeners[0].accept()
            upstream = await trio.open_tcp_stream("127.0.0.1", port)
            conn = Connection(client_side, upstream, router, max_frame_bytes=1 << 26,
                              max_in_flight=16, name="test")
            conns.append(conn)
            await conn.run()

        nursery.start_soon(serve_one)
        client = await trio.open_tcp_stream("127.0.0.1", proxy_port)
        peer = await listeners[0].accept()
        with trio.fail_after(20):
            await client.send_all(frame[: len(frame) // 2])
            await trio.sleep(0.2)
            nursery.start_soon(conns[0].drain, 10.0)
            await trio.sleep(0.2)
            # sent while the broker side reads: the kernel buffers between them are smaller
            # than the rest of the frame
            nursery.start_soon(client.send_all, frame[len(frame) // 2:])
            got = await read_frames(peer, 1)
            assert encode_frame(got[0]) == frame
            await peer.send_all(encode_frame(struct.pack(">i", 9) + b"ok"))
            assert await read_frames(client, 1) == [struct.pack(">i", 9) + b"ok"]
            assert await client.receive_some(10) == b""  # closed after the drain
        nursery.cancel_scope.cancel()


class PreparingRouter(EchoRouter):
    """Examines api key 8: needs something first (an event), then forwards the frame as it is."""

    def __init__(self, ready: trio.Event) -> None:
        self.ready = ready
        self.decided: list[int] = []

    def classify(self, request: RequestInfo) -> int:
        return connection_module.EXAMINE if request.api_key == 8 else FORWARD

    def decide(self, request: RequestInfo) -> connection_module.Decision:
        async def later() -> int:
            await self.ready.wait()
            self.decided.append(request.correlation_id)
            assert bytes(request.frame[8:10]) == struct.pack(">h", 1)  # still the request's
            return FORWARD
        return connection_module.Prepare(later())


async def test_a_request_being_prepared_holds_the_requests_after_it_and_then_passes() -> None:
    ready = trio.Event()
    router = PreparingRouter(ready)

    async def script(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        first = request(8, 2, 1, b"A" * 100)
        second = request(0, 9, 2, b"B" * 100)
        await client.send_all(first + second)
        with trio.move_on_after(0.3):
            await peer.receive_some(1 << 16)
            raise AssertionError("nothing may pass before the first request is decided")
        ready.set()
        frames = await read_frames(peer, 2)
        assert frames == [first[4:], second[4:]]  # the original bytes, in the client's order
        assert router.decided == [1]

    await run_with_peer(router, script)


class AnsweringRouter(EchoRouter):
    """Answers api key 8 itself, once ``ready`` is set."""

    def __init__(self, ready: trio.Event) -> None:
        self.ready = ready

    def classify(self, request: RequestInfo) -> int:
        return connection_module.EXAMINE if request.api_key == 8 else FORWARD

    def decide(self, request: RequestInfo) -> connection_module.Decision:
        async def later() -> bytes:
            await self.ready.wait()
            return struct.pack(">i", request.correlation_id) + b"answer"
        return connection_module.Local(later())


class BreakingStream(trio.abc.Stream):
    """A client socket whose sends fail once ``broken`` is set, as a closed peer's do."""

    def __init__(self, inner: trio.SocketStream) -> None:
        self.inner = inner
        self.broken = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.broken:
            raise trio.BrokenResourceError("socket connection broken: [Errno 32] Broken pipe")
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_client_gone_before_its_local_answer_is_an_ordinary_close() -> None:
    """Its answer's send fails: the connection closes with a debug line, nothing escapes."""
    ready = trio.Event()
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        proxy_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        proxy_port = proxy_listeners[0].socket.getsockname()[1]
        client = await trio.open_tcp_stream("127.0.0.1", proxy_port)
        client_side = BreakingStream(await proxy_listeners[0].accept())
        upstream = await trio.open_tcp_stream("127.0.0.1", port)
        peer = await listeners[0].accept()  # the broker side stays open
        conn = Connection(client_side, upstream, AnsweringRouter(ready),  # type: ignore[arg-type]
                          max_frame_bytes=1 << 26, max_in_flight=16, name="test", splice=False)
        done = trio.Event()

        async def serve() -> None:
            await conn.run()  # must return, not raise
            done.set()

        nursery.start_soon(serve)
        await client.send_all(request(8, 2, 7, b"x"))
        await trio.testing.wait_all_tasks_blocked()
        client_side.broken = True
        ready.set()
        with trio.fail_after(10):
            await done.wait()
        assert conn.closing_reason is not None and "client connection failed" in conn.closing_reason
        await peer.aclose()
        nursery.cancel_scope.cancel()


async def test_a_client_gone_with_requests_at_the_broker_resets_the_broker_connection() -> None:
    """What the broker has not read yet of a connection whose client left must not be carried
    out later (a commit written after the client's newer ones): the proxy resets it. With
    nothing outstanding it ends the connection as usual."""
    async def script(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        await client.send_all(request(8, 9, 1, b"a"))
        await read_frames(peer, 1)  # unanswered when the client leaves
        await client.aclose()
        with pytest.raises(trio.BrokenResourceError):
            while await peer.receive_some(10):
                pass

    await run_with_peer(EchoRouter(), script)

    async def answered(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        await client.send_all(request(8, 9, 1, b"a"))
        await read_frames(peer, 1)
        await peer.send_all(encode_frame(struct.pack(">i", 1) + b"x"))
        await read_frames(client, 1)
        await client.aclose()
        assert await peer.receive_some(10) == b""

    await run_with_peer(EchoRouter(), answered)


class ProbingRouter(EchoRouter):
    """Examines api key 68: asks the broker something first (a probe on this connection),
    then answers the request itself with what the broker said."""

    def __init__(self) -> None:
        self.probe: Callable[..., Awaitable[bytes]] | None = None

    def attach(self, send: Callable[..., Awaitable[bytes]]) -> None:
        self.probe = send

    def classify(self, request: RequestInfo) -> int:
        return connection_module.EXAMINE if request.api_key == 68 else FORWARD

    def decide(self, request: RequestInfo) -> connection_module.Decision:
        async def later() -> connection_module.Local:
            assert self.probe is not None
            answer = await self.probe(
                12, 4, lambda cid: struct.pack(">hhih", 12, 4, cid, 1) + b"p", 10.0)
            return connection_module.Local(struct.pack(">i", request.correlation_id)
                                           + b"answered after " + answer[4:])
        return connection_module.Prepare(later())


async def test_a_probe_goes_to_the_broker_in_order_and_its_answer_never_to_the_client() -> None:
    """A fetch, then a request the proxy answers after asking the broker, then another fetch:
    the broker sees fetch, probe (a correlation id of the proxy's own), fetch; the client gets
    exactly its three responses, in its order, the middle one built from the probe's answer."""
    router = ProbingRouter()

    async def script(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        await client.send_all(request(1, 12, 1, b"f1") + request(68, 0, 2, b"hb")
                              + request(1, 12, 3, b"f2"))
        first, probe = await read_frames(peer, 2)
        assert struct.unpack_from(">hhi", first, 0) == (1, 12, 1)
        api_key, version, probe_id = struct.unpack_from(">hhi", probe, 0)
        assert (api_key, version) == (12, 4) and probe_id < 0
        with trio.move_on_after(0.2):  # the fetch after it waits for the decision
            await peer.receive_some(1 << 16)
            raise AssertionError("the request after the examined one passed it")
        # answers in wire order; the fetch's response is released while the probe is out
        await peer.send_all(encode_frame(struct.pack(">i", 1) + b"fetch-1"))
        assert await read_frames(client, 1) == [struct.pack(">i", 1) + b"fetch-1"]
        await peer.send_all(encode_frame(struct.pack(">i", probe_id) + b"READ ok"))
        (last,) = await read_frames(peer, 1)
        assert struct.unpack_from(">hhi", last, 0) == (1, 12, 3)
        await peer.send_all(encode_frame(struct.pack(">i", 3) + b"fetch-2"))
        assert await read_frames(client, 2) == [
            struct.pack(">i", 2) + b"answered after READ ok", struct.pack(">i", 3) + b"fetch-2"]

    await run_with_peer(router, script)


async def test_a_probe_answer_is_read_even_while_the_answer_waiting_for_it_holds_responses(
        ) -> None:
    """While the proxy prepares the answer at the head of the queue, what the broker sends is
    held up to max-held-response-bytes, then the broker is no longer read. An answer that
    asks the broker first (holding the requests after it) must still get the probe's answer,
    however large, or it would wait forever."""
    class AskingRouter(ProbingRouter):
        def decide(self, request: RequestInfo) -> connection_module.Decision:
            async def answer() -> bytes:
                assert self.probe is not None
                got = await self.probe(
                    3, 10, lambda cid: struct.pack(">hhih", 3, 10, cid, 1) + b"m", 10.0)
                return struct.pack(">i", request.correlation_id) + b"%d" % len(got)
            return connection_module.Local(answer(), holds_later=True)

    router = AskingRouter()

    async def script(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        await client.send_all(request(68, 0, 1, b"hb"))
        (probe,) = await read_frames(peer, 1)
        probe_id = struct.unpack_from(">hhi", probe, 0)[2]
        big = encode_frame(struct.pack(">i", probe_id) + b"M" * 65536)  # > 1024 held bytes
        await peer.send_all(big[:3000])
        await trio.testing.wait_all_tasks_blocked()
        await peer.send_all(big[3000:])
        assert await read_frames(client, 1) == [struct.pack(">i", 1) + b"65540"]

    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        proxy_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        proxy_port = proxy_listeners[0].socket.getsockname()[1]

        async def serve_one() -> None:
            client_side = await proxy_listeners[0].accept()
            upstream = await trio.open_tcp_stream("127.0.0.1", port)
            conn = Connection(client_side, upstream, router,  # type: ignore[arg-type]
                              max_frame_bytes=1 << 26, max_in_flight=16, name="test",
                              max_held_response_bytes=1024, splice=False)
            await conn.run()

        nursery.start_soon(serve_one)
        client = await trio.open_tcp_stream("127.0.0.1", proxy_port)
        peer = await listeners[0].accept()
        with trio.fail_after(30):
            await script(client, peer)
        nursery.cancel_scope.cancel()
