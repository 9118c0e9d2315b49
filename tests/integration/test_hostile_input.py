"""Hostile and malformed input: the offending connection is closed with one clear log line,
other connections keep working and the proxy keeps running. The proxy runs with its default
limits (``max-frame-bytes`` 100 MiB, ``max-examined-request-bytes`` 1 MiB), as users run it.

Large group requests for groups the proxy does not coordinate get the broker's answer, as
without the proxy, whether they are small enough to be decoded (an OffsetCommit of 10,000
partitions, 160 KiB) or not (2 MiB: forwarded untouched).
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

import pytest

from proxy.codec import messages
from proxy.codec.header import encode_request_header
from proxy.config import ProxyConfig
from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy
from tests.testbed.broker import KafkaBroker

MAX_FRAME = ProxyConfig(upstream=()).max_frame_bytes


def request(api_key: int, version: int, correlation_id: int, body: bytes = b"",
            client_id: bytes = b"hostile") -> bytes:
    payload = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    payload += body
    return struct.pack(">i", len(payload)) + payload


def closed_by_peer(sock: socket.socket, timeout: float = 10.0) -> bool:
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def healthy_roundtrip(proxy: ProxyProcess) -> None:
    """A well-behaved client on its own connection still gets answers."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, request_timeout_ms=10_000)
    try:
        assert admin.describe_cluster()["brokers"]
    finally:
        admin.close()


def log_lines_about(proxy: ProxyProcess, sock_name: tuple[str, int]) -> list[str]:
    peer = f"{sock_name[0]}:{sock_name[1]} "
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = [ln for ln in proxy.log().splitlines() if peer in ln and "closing" in ln]
        if lines:
            return lines
        time.sleep(0.05)
    return []


@pytest.fixture
def proxy(kafka39: KafkaBroker, start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy(kafka39)


CASES: dict[str, tuple[Callable[[], bytes], str]] = {
    "negative length": (lambda: struct.pack(">i", -7) + b"\x00" * 16,
                        "frame length -7 is below the minimum"),
    "oversized length": (lambda: struct.pack(">i", MAX_FRAME + 1),
                         f"exceeds the maximum of {MAX_FRAME}"),
    "header too short": (lambda: struct.pack(">i", 3) + b"\x00\x03\x00",
                         "below the minimum"),
    "unknown api key": (lambda: request(4242, 0, 1), "unknown API key 4242"),
    "negative api key": (lambda: request(-3, 0, 1), "unknown API key -3"),
    "unknown version": (lambda: request(3, 999, 1), "unsupported version 999 of Metadata"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_frame_closes_only_its_connection(proxy: ProxyProcess, case: str) -> None:
    data, expected = CASES[case]
    bystander = socket.create_connection((proxy.host, proxy.port))
    hostile = socket.create_connection((proxy.host, proxy.port))
    hostile.sendall(data())
    assert closed_by_peer(hostile), "the proxy kept the offending connection open"
    lines = log_lines_about(proxy, hostile.getsockname())
    assert len(lines) == 1, lines
    assert expected in lines[0]
    # A connection opened before the hostile one is unaffected.
    bystander.sendall(request(18, 0, 77))
    bystander.settimeout(10)
    size = struct.unpack(">i", bystander.recv(4))[0]
    assert size > 6
    healthy_roundtrip(proxy)
    assert proxy.alive


def test_tls_on_a_plaintext_listener_is_refused_with_a_log_line(proxy: ProxyProcess) -> None:
    """A client that starts TLS on a listener without TLS is closed with a clear log line;
    nothing is relayed unexamined past the coordination, and other connections go on."""
    hostile = socket.create_connection((proxy.host, proxy.port))
    hostile.sendall(bytes.fromhex("160301020001") + b"\x00" * 64)
    assert closed_by_peer(hostile)
    assert "the client started TLS, but this listener has none" in proxy.log()
    assert "relaying bytes opaquely" not in proxy.log()
    healthy_roundtrip(proxy)


def test_too_new_api_versions_gets_the_kip511_answer(proxy: ProxyProcess) -> None:
    sock = socket.create_connection((proxy.host, proxy.port))
    sock.settimeout(10)
    sock.sendall(request(18, 32000, 12))
    size = struct.unpack(">i", sock.recv(4))[0]
    body = b""
    while len(body) < size:
        body += sock.recv(size - len(body))
    correlation_id, error_code, count = struct.unpack_from(">ihi", body, 0)
    assert (correlation_id, error_code) == (12, 35)  # UNSUPPORTED_VERSION, v0 body
    api_key, lo, hi = struct.unpack_from(">hhh", body, 10)
    assert count == 1 and api_key == 18 and lo == 0 and hi >= 3
    # The connection stays usable: a supported ApiVersions now succeeds.
    sock.sendall(request(18, 0, 13))
    assert struct.unpack(">i", sock.recv(4))[0] > 6


def test_garbage_after_a_valid_header_is_rejected_upstream(proxy: ProxyProcess) -> None:
    hostile = socket.create_connection((proxy.host, proxy.port))
    # Metadata v12 header followed by bytes that are no Metadata request.
    hostile.sendall(request(3, 12, 5, body=b"\xff" * 40))
    assert closed_by_peer(hostile)
    healthy_roundtrip(proxy)
    assert proxy.alive


def test_truncated_frame_then_disconnect(proxy: ProxyProcess) -> None:
    hostile = socket.create_connection((proxy.host, proxy.port))
    hostile.sendall(request(3, 1, 9, body=b"\x00" * 100)[:30])
    hostile.close()
    healthy_roundtrip(proxy)
    assert proxy.alive


def test_random_bytes_never_take_the_proxy_down(proxy: ProxyProcess) -> None:
    import random

    rnd = random.Random(848)
    for _ in range(60):
        sock = socket.create_connection((proxy.host, proxy.port))
        blob = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 300)))
        if rnd.random() < 0.5:  # a plausible length prefix makes it past the frame reader
            blob = struct.pack(">i", len(blob)) + blob
        sock.sendall(blob)
        sock.close()
    healthy_roundtrip(proxy)
    assert proxy.alive


def read_response(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        assert chunk, "connection closed instead of an answer"
        head += chunk
    (size,) = struct.unpack(">i", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(min(size - len(body), 1 << 20))
        assert chunk, "connection closed in the middle of the answer"
        body += chunk
    return body


@pytest.mark.parametrize("partitions", [10_000, 150_000], ids=["160KiB-decoded", "2MiB-passed"])
def test_a_large_offset_commit_for_a_broker_group_gets_the_brokers_answer(
        proxy: ProxyProcess, kafka39: KafkaBroker, partitions: int) -> None:
    topic = f"big-commit-{partitions}"
    kafka39.create_topic(topic, 1, 1)
    value = {"group_id": f"no-members-{partitions}", "generation_id_or_member_epoch": -1,
             "member_id": "", "retention_time_ms": -1,
             "topics": [{"name": topic, "partitions": [
                 {"partition_index": p, "committed_offset": 0, "committed_metadata": ""}
                 for p in range(partitions)]}]}
    payload = encode_request_header(8, 2, 41, "big") + messages.encode_request(8, 2, value)
    assert (len(payload) > 128 << 10) and (partitions < 20_000 or len(payload) > 1 << 20)
    sock = socket.create_connection((proxy.host, proxy.port))
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    body = read_response(sock)
    (correlation_id,) = struct.unpack_from(">i", body)
    answer, _ = messages.decode_response(8, 2, body, 4)
    assert correlation_id == 41
    errors = {p["error_code"] for t in answer["topics"] for p in t["partitions"]}
    # the broker's own answer for every partition: committed, unknown partition, or (the
    # offsets topic still loading) the coordinator errors a client retries
    assert errors <= {0, 3, 14, 15, 16}
    assert sum(len(t["partitions"]) for t in answer["topics"]) == partitions
    assert proxy.alive
    healthy_roundtrip(proxy)
