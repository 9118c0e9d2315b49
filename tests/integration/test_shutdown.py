"""SIGTERM: stop accepting, let in-flight requests finish within the grace period, exit 0."""

from __future__ import annotations

import signal
import socket
import struct
import time
import uuid
from collections.abc import Callable

from proxy.codec import messages
from proxy.codec.header import encode_request_header
from tests.integration.conftest import StartProxy
from tests.testbed.broker import KafkaBroker

FETCH = 1


def long_poll_fetch(topic_id: object, correlation_id: int, wait_ms: int) -> bytes:
    """A Fetch v13 the broker parks for ``wait_ms`` (it asks for more bytes than exist)."""
    body = messages.encode_request(FETCH, 13, {
        "replica_id": -1, "max_wait_ms": wait_ms, "min_bytes": 10_000_000,
        "max_bytes": 50_000_000, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic_id": topic_id, "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
            "last_fetched_epoch": -1, "log_start_offset": -1,
            "partition_max_bytes": 1_000_000}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    payload = encode_request_header(FETCH, 13, correlation_id, "shutdown-test") + body
    return struct.pack(">i", len(payload)) + payload


def test_sigterm_drains_in_flight_requests(kafka39: KafkaBroker, topic: Callable[..., str],
                                           start_proxy: StartProxy) -> None:
    from confluent_kafka import TopicCollection

    name = topic(kafka39, partitions=1)
    admin = kafka39.admin()  # keep a reference while its futures run
    kafka_uuid = admin.describe_topics(TopicCollection([name]))[name].result().topic_id
    mask = (1 << 64) - 1
    topic_id = uuid.UUID(int=((kafka_uuid.get_most_significant_bits() & mask) << 64)
                         | (kafka_uuid.get_least_significant_bits() & mask))
    proxy = start_proxy(kafka39, "--shutdown-grace", "10")
    # Find which broker listener serves partition 0 (single node: broker 1).
    port = proxy.broker_ports()[1]
    sock = socket.create_connection((proxy.host, port))
    sock.settimeout(15)
    wait_ms = 3000
    sock.sendall(long_poll_fetch(topic_id, 41, wait_ms))
    time.sleep(0.5)  # the request is now parked in the broker
    sent_at = time.monotonic()
    proxy.signal(signal.SIGTERM)
    time.sleep(0.3)
    refused = False
    try:
        socket.create_connection((proxy.host, proxy.port), timeout=2).close()
    except OSError:
        refused = True
    assert refused, "the proxy still accepted connections after SIGTERM"
    size = struct.unpack(">i", sock.recv(4))[0]
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk
        data += chunk
    assert struct.unpack_from(">i", data, 0)[0] == 41
    assert time.monotonic() - sent_at >= (wait_ms - 500) / 1000 - 0.5
    assert proxy.process is not None
    assert proxy.process.wait(15) == 0
    assert "received SIGTERM" in proxy.log() and "stopped" in proxy.log()


def test_second_signal_exits_at_once(kafka39: KafkaBroker, start_proxy: StartProxy) -> None:
    proxy = start_proxy(kafka39, "--shutdown-grace", "30")
    # A client that keeps a request outstanding would hold a graceful stop for 30 s.
    sock = socket.create_connection((proxy.host, proxy.port))
    payload = struct.pack(">hhih", 3, 1, 1, -1)
    sock.sendall(struct.pack(">i", len(payload) + 100) + payload)  # incomplete: never answered
    time.sleep(0.3)
    proxy.signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proxy.alive, "the first signal should start a graceful drain"
    proxy.signal(signal.SIGTERM)
    assert proxy.process is not None
    assert proxy.process.wait(10) == 130
    assert "second signal: exiting now" in proxy.log()
