"""The sidecar topology of the test bed: pods as network namespaces, each with its own
loopback where its sidecar listens on 127.0.0.1:9092, joined to the broker by a bridge.

Clients in a pod know only ``127.0.0.1:9092``; everything they learn of the cluster (broker
addresses in Metadata, the group coordinator) must point back at their own sidecar, and each
pod's sidecar must reach the broker over the bridge.

The faults the fleet's tests apply to pods are checked here on real sockets: a pod cut off
from the brokers, a frozen sidecar or member, a slow link; each undone.
"""

from __future__ import annotations

import json
import select
import socket
import statistics
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.process import ProxyProcess
from tests.testbed import pods
from tests.testbed.broker import KafkaBroker

pytestmark = pytest.mark.broker


@pytest.fixture
def network() -> Iterator[pods.PodNetwork]:
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)
    with pods.PodNetwork() as made:
        yield made


def listener(sock: socket.socket, address: tuple[str, int]) -> socket.socket:
    sock.bind(address)
    sock.listen(8)
    return sock


def connect(sock: socket.socket, address: tuple[str, int], timeout: float = 2.0
            ) -> socket.socket:
    sock.settimeout(timeout)
    sock.connect(address)
    return sock

CLIENT = r"""
import json, sys
from confluent_kafka import Consumer, Producer
topic, tag, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
producer = Producer({"bootstrap.servers": "127.0.0.1:9092"})
for i in range(10):
    producer.produce(topic, key=tag.encode(), value=f"{tag}-{i}".encode())
assert producer.flush(20) == 0
consumer = Consumer({"bootstrap.servers": "127.0.0.1:9092", "group.id": f"pods-{tag}",
                     "auto.offset.reset": "earliest"})
consumer.subscribe([topic])
seen, brokers = set(), set()
for _ in range(60):
    msg = consumer.poll(0.5)
    if msg is not None and msg.error() is None:
        seen.add(msg.value().decode())
    if len(seen) >= expected:
        break
for broker in consumer.list_topics(timeout=10).brokers.values():
    brokers.add(f"{broker.host}:{broker.port}")
consumer.close()
print(json.dumps({"seen": sorted(seen), "brokers": sorted(brokers)}))
"""


def test_each_pod_reaches_the_broker_through_its_own_sidecar(tmp_path: Path) -> None:
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)
    with pods.PodNetwork() as network:
        a, b = network.pod("a"), network.pod("b")
        with KafkaBroker.start("3.9", tmp_path / "kafka", host=network.host_ip) as broker:
            topic = f"pods-{uuid.uuid4().hex[:6]}"
            broker.create_topic(topic, 2)
            sidecars = [ProxyProcess.start(broker.bootstrap, tmp_path / f"{pod.name}.log",
                                           listen="127.0.0.1:9092", wrapper=pod.command([]))
                        for pod in (a, b)]
            try:
                results = {}
                for pod, expected in ((a, 10), (b, 20)):  # b's group reads a's ten too
                    done = pod.run([sys.executable, "-c", CLIENT, topic, pod.name,
                                    str(expected)],
                                   capture_output=True, text=True, timeout=90)
                    assert done.returncode == 0, done.stderr[-2000:]
                    results[pod.name] = json.loads(done.stdout.strip().splitlines()[-1])
            finally:
                for sidecar in sidecars:
                    sidecar.stop()
    # Both pods' records are in the topic; every pod saw all twenty (its own group reads
    # from the beginning), and the only broker it was told of is its own sidecar's listener.
    assert len(results["b"]["seen"]) == 20, results
    assert {f"a-{i}" for i in range(10)} <= set(results["a"]["seen"]), results
    for name, result in results.items():
        assert result["brokers"], result
        assert all(host.startswith("127.0.0.1:") for host in result["brokers"]), (name, result)
    assert network.host_ip not in json.dumps(results)


def test_a_pod_cut_off_from_the_brokers_keeps_its_loopback_and_the_other_pods(
        network: pods.PodNetwork) -> None:
    """A listener on the brokers' address stands in for a broker (the cut is by address)."""
    a, b = network.pod("a"), network.pod("b")
    broker = listener(socket.socket(), (network.host_ip, 0))
    address = broker.getsockname()
    established = connect(a.socket(), address)
    accepted, _ = broker.accept()
    established.sendall(b"1")
    assert accepted.recv(1) == b"1"
    other_pod = listener(b.socket(), (b.ip, 0))
    loopback = listener(a.socket(), ("127.0.0.1", 0))
    with a.partitioned():
        with pytest.raises(TimeoutError):  # silence, as over a partition: no RST, no ICMP
            connect(a.socket(), address, timeout=1.5)
        accepted.sendall(b"2")
        established.settimeout(1.5)
        with pytest.raises(TimeoutError):
            established.recv(1)
        established.sendall(b"3")
        accepted.settimeout(1.5)
        with pytest.raises(TimeoutError):
            accepted.recv(1)
        broker.setblocking(False)
        with pytest.raises(BlockingIOError):  # the pod's SYNs never reached the broker
            broker.accept()
        broker.setblocking(True)
        connect(a.socket(), other_pod.getsockname()).close()
        connect(a.socket(), loopback.getsockname()).close()
        connect(b.socket(), address).close()  # only the cut pod is cut
        broker.accept()[0].close()
    connect(a.socket(), address).close()
    # The established connection lived through it: both sides get what was sent meanwhile.
    established.settimeout(30)
    assert established.recv(1) == b"2"
    accepted.settimeout(30)
    assert accepted.recv(1) == b"3"


def ask_api_versions(sock: socket.socket, correlation_id: int) -> None:
    client_id = b"pods"
    request = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    sock.sendall(struct.pack(">i", len(request)) + request)


def answer(sock: socket.socket) -> int:
    """The correlation id of the next response on ``sock`` (the rest is read and dropped)."""
    size, answered = struct.unpack(">ii", sock.recv(8, socket.MSG_WAITALL))
    rest = size - 4
    while rest > 0:
        rest -= len(sock.recv(rest))
    return int(answered)


def test_a_frozen_sidecar_accepts_connections_but_answers_only_once_resumed(
        network: pods.PodNetwork, tmp_path: Path) -> None:
    pod = network.pod("a")
    sidecar_address = ("127.0.0.1", 9092)
    with (KafkaBroker.start("3.9", tmp_path / "kafka", host=network.host_ip) as broker,
          ProxyProcess.start(broker.bootstrap, tmp_path / "sidecar.log",
                             listen="127.0.0.1:9092", wrapper=pod.command([])) as sidecar):
        before = connect(pod.socket(), sidecar_address, 30)
        ask_api_versions(before, 1)
        assert answer(before) == 1
        with pods.frozen(sidecar):
            waiting = connect(pod.socket(), sidecar_address)  # the kernel's handshake
            ask_api_versions(waiting, 2)
            waiting.settimeout(2.0)
            with pytest.raises(TimeoutError):
                waiting.recv(1, socket.MSG_PEEK)
        waiting.settimeout(30)
        assert answer(waiting) == 2  # the request sent while frozen, answered once resumed


def test_a_frozen_member_process_stops_until_resumed(network: pods.PodNetwork) -> None:
    pod = network.pod("a")
    echo = pod.popen([sys.executable, "-u", "-c",
                      "import sys\nfor line in sys.stdin: print(line.strip(), flush=True)"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert echo.stdin is not None and echo.stdout is not None
    try:
        echo.stdin.write("before\n")
        assert echo.stdout.readline().strip() == "before"
        with pods.frozen(echo):
            echo.stdin.write("frozen\n")
            ready, _, _ = select.select([echo.stdout], [], [], 1.5)
            assert not ready
        ready, _, _ = select.select([echo.stdout], [], [], 30)
        assert ready and echo.stdout.readline().strip() == "frozen"
    finally:
        echo.kill()
        echo.wait()


def round_trips(sock: socket.socket, peer: socket.socket, count: int = 5) -> list[float]:
    times = []
    for _ in range(count):
        began = time.monotonic()
        sock.sendall(b"p")
        peer.recv(1)
        peer.sendall(b"q")
        sock.recv(1)
        times.append(time.monotonic() - began)
    return times


def test_a_slow_link_delays_what_the_pod_sends(network: pods.PodNetwork) -> None:
    ok, why = pods.netem_available()
    if not ok:
        pytest.skip(why)
    pod = network.pod("a")
    broker = listener(socket.socket(), (network.host_ip, 0))
    client = connect(pod.socket(), broker.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    peer, _ = broker.accept()
    client.settimeout(30)
    peer.settimeout(30)
    before = statistics.median(round_trips(client, peer))
    with pod.slowed(200):
        slowed = min(round_trips(client, peer))
        assert "netem" in pod.run(["tc", "qdisc", "show", "dev", "eth0"], capture_output=True,
                                  text=True).stdout
    assert slowed >= before + 0.15, (before, slowed)
    assert "netem" not in pod.run(["tc", "qdisc", "show", "dev", "eth0"], capture_output=True,
                                  text=True).stdout
