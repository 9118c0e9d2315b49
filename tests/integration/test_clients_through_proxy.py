"""Real, unmodified clients through groupgate against real 3.9 and 4.4 brokers.

Each test produces records through the proxy, consumes them in a classic consumer group
through the proxy, and checks two things independently: every record produced was consumed,
and the client only ever learned and used proxy addresses. Addresses are observed twice: in
what the client itself reports it received (Metadata brokers, DescribeCluster nodes, the
group coordinator from FindCoordinator), and in the kernel's table of the client process's
TCP connections (no connection to a broker port, ever).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable

from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy
from tests.integration.observe import PortWatcher
from tests.testbed.broker import KafkaBroker, KafkaCluster
from tests.testbed.tools import VerifiableConsumer, VerifiableProducer

RECORDS = 3000
log = logging.getLogger("rdkafka")


def broker_ports(cluster: KafkaCluster) -> set[int]:
    return {node.port for node in cluster.nodes.values()}


def assert_only_proxy_addresses(proxy: ProxyProcess, cluster: KafkaCluster,
                                addresses: list[tuple[str, int]], ports_used: set[int]) -> None:
    listeners = proxy.listener_ports()
    assert addresses, "the client reported no broker addresses at all"
    leaked = [(h, p) for h, p in addresses if p not in listeners or h != proxy.host]
    assert not leaked, f"client received non-proxy addresses {leaked}; proxy has {listeners}"
    assert ports_used, "no TCP connection of the client was observed"
    assert not ports_used & broker_ports(cluster), (
        f"client connected straight to a broker: {ports_used & broker_ports(cluster)}")


def test_confluent_kafka_producer_and_group_consumer(
        broker: KafkaBroker, topic: Callable[..., str], start_proxy: StartProxy) -> None:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient

    name = topic(broker, partitions=3)
    proxy = start_proxy(broker)
    group = f"g-{uuid.uuid4().hex[:8]}"
    common = {"bootstrap.servers": proxy.bootstrap, "logger": log}
    addresses: list[tuple[str, int]] = []
    with PortWatcher(os.getpid()) as watcher:
        producer = Producer(dict(common, **{"linger.ms": 5}))
        for i in range(RECORDS):
            producer.produce(name, value=b"%d" % i + b"." * 1000, key=b"%d" % i)
            if i % 500 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0

        consumer = Consumer(dict(common, **{"group.id": group, "auto.offset.reset": "earliest",
                                            "enable.auto.commit": False}))
        consumer.subscribe([name])
        seen: set[int] = set()
        deadline = time.monotonic() + 60
        while len(seen) < RECORDS and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen.add(int(msg.value().split(b".", 1)[0]))
        consumer.commit(asynchronous=False)

        admin = AdminClient(common)
        metadata = admin.list_topics(timeout=10)
        addresses += [(b.host, b.port) for b in metadata.brokers.values()]
        cluster = admin.describe_cluster().result(timeout=10)
        addresses += [(n.host, n.port) for n in cluster.nodes]
        description = admin.describe_consumer_groups([group])[group].result(timeout=10)
        addresses.append((description.coordinator.host, description.coordinator.port))
        consumer.close()
    assert seen == set(range(RECORDS))
    assert_only_proxy_addresses(proxy, broker, addresses, watcher.seen)


def test_kafka_python_producer_and_group_consumer(
        broker: KafkaBroker, topic: Callable[..., str], start_proxy: StartProxy) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    name = topic(broker, partitions=3)
    proxy = start_proxy(broker)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with PortWatcher(os.getpid()) as watcher:
        producer = KafkaProducer(bootstrap_servers=proxy.bootstrap, linger_ms=5)
        futures = [producer.send(name, b"%d" % i) for i in range(RECORDS)]
        producer.flush(30)
        assert all(f.succeeded() for f in futures)
        addresses = [(b.host, b.port) for b in producer._metadata.brokers()]
        producer.close()

        consumer = KafkaConsumer(name, bootstrap_servers=proxy.bootstrap, group_id=group,
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 consumer_timeout_ms=10_000)
        seen = set()
        for record in consumer:
            seen.add(int(record.value))
            if len(seen) == RECORDS:
                break
        consumer.commit()
        cluster = consumer._client.cluster
        addresses += [(b.host, b.port) for b in cluster.brokers()]
        coordinator_id = consumer._coordinator.coordinator_id
        assert coordinator_id is not None
        coordinator = cluster.broker_metadata(coordinator_id)
        addresses.append((coordinator.host, coordinator.port))
        consumer.close()
    assert seen == set(range(RECORDS))
    assert_only_proxy_addresses(proxy, broker, addresses, watcher.seen)


def test_java_verifiable_producer_and_consumer(
        broker: KafkaBroker, topic: Callable[..., str], start_proxy: StartProxy) -> None:
    name = topic(broker, partitions=3)
    proxy = start_proxy(broker)
    line = broker.line.name
    producer = VerifiableProducer(line, proxy.bootstrap, name, max_messages=RECORDS)
    producer.start()
    assert producer.proc is not None
    with PortWatcher(producer.proc.pid) as producer_ports:
        acked = producer.run(timeout=120)
    assert len(acked) == RECORDS and not producer.errors

    consumer = VerifiableConsumer(line, proxy.bootstrap, name, f"g-{uuid.uuid4().hex[:8]}")
    with consumer:
        assert consumer.proc is not None
        with PortWatcher(consumer.proc.pid) as consumer_ports:
            consumer.wait_records(RECORDS, timeout=120)
    produced = {(t, p, o) for t, p, o, _ in acked}
    assert produced <= consumer.consumed_offsets()
    # The Java tools print no addresses; their sockets are the evidence.
    for watcher in (producer_ports, consumer_ports):
        assert watcher.seen, "no TCP connection of the Java tool was observed"
        assert watcher.seen <= proxy.listener_ports() | {0}, (
            f"Java client connected outside the proxy: {watcher.seen - proxy.listener_ports()}")


def test_three_brokers_reached_through_their_listeners_and_survive_a_restart(
        kafka39_cluster: KafkaCluster, topic: Callable[..., str],
        start_proxy: StartProxy) -> None:
    from confluent_kafka import Consumer, Producer

    cluster = kafka39_cluster
    # One partition led by each broker.
    name = topic(cluster, partitions=3, replica_assignment=[[1, 2], [2, 3], [3, 1]])
    leaders = cluster.wait_for_preferred_leaders(name)
    assert set(leaders.values()) == {1, 2, 3}
    proxy = start_proxy(cluster)
    # The test bed itself talks to the brokers from this process while restarting one, so the
    # clients' own view is the evidence here: librdkafka's statistics list every broker
    # connection it holds, by the address it learned.
    used: set[str] = set()

    def on_stats(raw: str) -> None:
        used.update(b["nodename"] for b in json.loads(raw)["brokers"].values()
                    if b.get("nodename"))

    common = {"bootstrap.servers": proxy.bootstrap, "logger": log,
              "statistics.interval.ms": 200, "stats_cb": on_stats}

    def produce(start: int, count: int) -> None:
        producer = Producer(dict(common, acks="all", **{"linger.ms": 5}))
        for i in range(start, start + count):
            producer.produce(name, value=b"%d" % i, partition=i % 3)
        assert producer.flush(60) == 0
        producer.poll(0.5)  # deliver a statistics event

    produce(0, 600)
    consumer = Consumer(dict(common, **{"group.id": f"g-{uuid.uuid4().hex[:8]}",
                                        "auto.offset.reset": "earliest"}))
    consumer.subscribe([name])
    seen: set[int] = set()

    def consume_until(n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(seen) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.add(int(msg.value()))

    consume_until(600, 60)
    assert len(seen) == 600
    per_broker = proxy.broker_ports()
    assert sorted(per_broker) == [1, 2, 3]
    ports_used = {int(n.rsplit(":", 1)[1]) for n in used}
    assert set(per_broker.values()) <= ports_used, "a broker's listener was never used"

    cluster.restart_broker(2)
    produce(600, 600)
    consume_until(1200, 120)
    consumer.close()
    assert seen == set(range(1200))
    hosts = {n.rsplit(":", 1)[0] for n in used}
    ports_used = {int(n.rsplit(":", 1)[1]) for n in used}
    assert hosts == {proxy.host}
    assert ports_used <= proxy.listener_ports(), f"non-proxy addresses used: {used}"
