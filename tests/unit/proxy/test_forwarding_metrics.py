"""The forwarding path's metrics: bytes of client frames per listener and the per-API request
latency, counted by a real :class:`~proxy.connection.Connection` over loopback sockets.

Time is trio's mock clock, moved only by the scripted broker (``mock_clock.jump``), so a
request's latency is exactly the time the broker took.
"""

from __future__ import annotations

import os
import struct

import pytest
import trio
import trio.testing

from proxy.frames import encode_frame
from proxy.metrics import REGISTRY, RequestCounters, Traffic
from proxy.rewrite import DictAddressMap
from proxy.router import ForwardingRouter, parse_table
from tests.unit.proxy.test_connection import read_frames, request, run_with_peer

LIST_OFFSETS = 2


def latency(api_key: int, api: str, suffix: str, le: str | None = None) -> float:
    labels = {"api_key": str(api_key), "api": api}
    if le is not None:
        labels["le"] = le
    return REGISTRY.get_sample_value(f"groupgate_request_duration_seconds_{suffix}",
                                     labels) or 0.0


def produce(correlation_id: int, acks: int) -> bytes:
    # Produce v3: transactional_id (null), acks, timeout, topics (empty)
    return request(0, 3, correlation_id, struct.pack(">hhii", -1, acks, 1000, 0))


async def test_bytes_both_ways_and_the_latency_of_each_answered_request(
        mock_clock: trio.testing.MockClock) -> None:
    router = ForwardingRouter(DictAddressMap({}), RequestCounters("test"), parse_table())
    traffic = Traffic()
    before = {le: latency(LIST_OFFSETS, "ListOffsets", "bucket", le) for le in ("0.1", "0.25")}
    count, total = (latency(LIST_OFFSETS, "ListOffsets", s) for s in ("count", "sum"))
    produce_count = latency(0, "Produce", "count")
    sent = produce(1, 0) + request(LIST_OFFSETS, 1, 2, b"\x00" * 12)
    answer = encode_frame(struct.pack(">i", 2) + b"\x00" * 20)

    async def script(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        await client.send_all(sent)
        await read_frames(peer, 2)
        mock_clock.jump(0.2)  # the broker takes 200 ms to answer
        await peer.send_all(answer)
        assert await read_frames(client, 1) == [answer[4:]]

    await run_with_peer(router, script, traffic=traffic)

    assert (traffic.received, traffic.sent) == (len(sent), len(answer))
    assert latency(LIST_OFFSETS, "ListOffsets", "count") == count + 1
    assert latency(LIST_OFFSETS, "ListOffsets", "sum") == pytest.approx(total + 0.2)
    assert latency(LIST_OFFSETS, "ListOffsets", "bucket", "0.1") == before["0.1"]
    assert latency(LIST_OFFSETS, "ListOffsets", "bucket", "0.25") == before["0.25"] + 1
    # Produce with acks=0 gets no response: its bytes count, no latency is made up for it
    assert latency(0, "Produce", "count") == produce_count


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "copy"])
async def test_frames_streamed_through_are_counted_too(
        mock_clock: trio.testing.MockClock, splice: bool) -> None:
    router = ForwardingRouter(DictAddressMap({}), RequestCounters("test"), parse_table())
    traffic = Traffic()
    count = latency(LIST_OFFSETS, "ListOffsets", "count")
    below = latency(LIST_OFFSETS, "ListOffsets", "bucket", "1.0")
    big_request = request(LIST_OFFSETS, 1, 7, os.urandom(600_000))
    big_answer = encode_frame(struct.pack(">i", 7) + os.urandom(700_000))

    async def script(client: trio.SocketStream, peer: trio.SocketStream) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, big_request)
            assert await read_frames(peer, 1) == [big_request[4:]]
        mock_clock.jump(1.5)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.send_all, big_answer)
            assert await read_frames(client, 1) == [big_answer[4:]]

    await run_with_peer(router, script, splice=splice, traffic=traffic)

    assert (traffic.received, traffic.sent) == (len(big_request), len(big_answer))
    assert latency(LIST_OFFSETS, "ListOffsets", "count") == count + 1
    assert latency(LIST_OFFSETS, "ListOffsets", "bucket", "1.0") == below  # it took 1.5 s
