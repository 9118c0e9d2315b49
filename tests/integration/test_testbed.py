"""The real-broker test bed itself: brokers of both lines start and serve real clients.

Covers direct (proxy-less) produce and consume with confluent-kafka, kafka-python and Kafka's
VerifiableProducer/VerifiableConsumer, the consumer-groups command, the 3-node cluster with one
partition led by each node, and broker restarts. These are the baselines the proxy tests build on.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

import pytest

from tests.testbed import artifacts
from tests.testbed.broker import KafkaBroker, KafkaCluster, api_versions, metadata
from tests.testbed.tools import (
    VerifiableConsumer,
    VerifiableProducer,
    describe_group,
    list_groups,
    missing_records,
    parse_table,
)

pytestmark = pytest.mark.broker

TopicFactory = Callable[..., str]


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def _eventually(condition: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


# ---------------------------------------------------------------------------------------------
# Artifacts (no broker)


def test_classpath_is_cached_and_offline() -> None:
    coords = ["org.apache.kafka:kafka-clients:3.9.2"]
    jars = artifacts.classpath("kafka-clients-3.9.2", coords)
    assert any(j.name == "kafka-clients-3.9.2.jar" for j in jars)
    t0 = time.monotonic()
    again = artifacts.classpath("kafka-clients-3.9.2", coords, offline=True)
    assert again == jars
    assert time.monotonic() - t0 < 0.5
    assert artifacts.java_version() >= 17


def test_classpath_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        artifacts.classpath("x", ["not-a-coordinate"])
    with pytest.raises(ValueError):
        artifacts.classpath("../escape", ["a:b:1"])
    with pytest.raises(artifacts.ArtifactError):
        artifacts.classpath("never-fetched", ["org.example:none:0.0.1"], offline=True)


def test_parse_table_reads_group_tables() -> None:
    text = (
        "\nGROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST  CLIENT-ID\n"
        "g1    t     0         5              7              2   m-1         /1.2  c-1\n"
        "g1    t     1         -              0              -   m-2         /1.2  c-2\n"
    )
    rows = parse_table(text)
    assert [r["PARTITION"] for r in rows] == ["0", "1"]
    assert rows[0]["LAG"] == "2" and rows[1]["CONSUMER-ID"] == "m-2"


# ---------------------------------------------------------------------------------------------
# Single-node brokers of both lines


def test_broker_answers(broker: KafkaBroker) -> None:
    versions = api_versions(broker.bootstrap)
    assert 3 in versions and 18 in versions  # Metadata, ApiVersions
    md = metadata(broker.bootstrap)
    assert md.brokers == {1: broker.bootstrap}
    assert md.controller_id == 1
    assert broker.node_id == 1 and broker.log_file.is_file()
    assert broker.log_file.stat().st_size > 0
    heartbeat = versions.get(68)  # ConsumerGroupHeartbeat
    if broker.line.native_consumer_protocol:
        assert heartbeat is not None and heartbeat[1] >= 1
    else:
        # 3.9 advertises only the early-access v0, which librdkafka and Java 4.x do not use.
        assert heartbeat is None or heartbeat[1] == 0


def test_confluent_kafka_roundtrip(broker: KafkaBroker, topic: TopicFactory) -> None:
    from confluent_kafka import Consumer, Producer

    name = topic(broker, partitions=3)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    sent = {f"v{i}" for i in range(300)}
    for i, value in enumerate(sorted(sent)):
        producer.produce(name, key=str(i).encode(), value=value.encode())
    assert producer.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": _group(),
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([name])
    got: set[str] = set()
    deadline = time.monotonic() + 60
    try:
        while got != sent and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.add((msg.value() or b"").decode())
    finally:
        consumer.close()
    assert got == sent


def test_kafka_python_roundtrip(broker: KafkaBroker, topic: TopicFactory) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    name = topic(broker, partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    sent = {f"p{i}".encode() for i in range(200)}
    for value in sent:
        producer.send(name, value=value)
    producer.flush(30)
    producer.close()

    consumer = KafkaConsumer(
        name,
        bootstrap_servers=broker.bootstrap,
        group_id=_group(),
        auto_offset_reset="earliest",
        consumer_timeout_ms=15000,
    )
    got: set[bytes] = set()
    try:
        for msg in consumer:
            got.add(msg.value)
            if got == sent:
                break
    finally:
        consumer.close()
    assert got == sent


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_verifiable_tools_every_record_consumed(
    broker: KafkaBroker, topic: TopicFactory, protocol: str
) -> None:
    if protocol == "consumer" and not broker.line.native_consumer_protocol:
        pytest.skip("the 3.9 broker has no KIP-848 coordinator (that is the proxy's job)")
    name = topic(broker, partitions=4)
    producer = VerifiableProducer(
        broker.line, broker.bootstrap, name, max_messages=2000, repeating_keys=16
    )
    acked = producer.run(timeout=120)
    assert len(acked) == 2000 and not producer.errors
    assert len({p for _, p, _, _ in acked}) == 4

    group = _group()
    consumers = [
        VerifiableConsumer(broker.line, broker.bootstrap, name, group, group_protocol=protocol)
        for _ in range(2)
    ]
    try:
        for c in consumers:
            c.start()
        assert _eventually(lambda: not missing_records(acked, consumers), 90)
        # once the group settles, both members hold a share and together all four partitions
        everything = {(name, p) for p in range(4)}
        assert _eventually(
            lambda: (
                all(c.assignment for c in consumers)
                and set().union(*(c.assignment for c in consumers)) == everything
            ),
            60,
        )
        assert _eventually(
            lambda: (
                {r["PARTITION"] for r in describe_group(broker.line, broker.bootstrap, group)}
                == {"0", "1", "2", "3"}
            ),
            60,
        )
        assert group in list_groups(broker.line, broker.bootstrap)
    finally:
        for c in consumers:
            c.stop()
    assert all(c.events_named("shutdown_complete") for c in consumers)


def test_confluent_consumer_protocol_on_kafka4(kafka4: KafkaBroker, topic: TopicFactory) -> None:
    """librdkafka with group.protocol=consumer against the native 4.x coordinator: the
    reference behaviour the proxy reproduces in front of 3.9."""
    from confluent_kafka import Consumer, Producer

    name = topic(kafka4, partitions=2)
    producer = Producer({"bootstrap.servers": kafka4.bootstrap})
    for i in range(50):
        producer.produce(name, key=str(i).encode(), value=b"x")
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": kafka4.bootstrap,
            "group.id": _group(),
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([name])
    count = 0
    deadline = time.monotonic() + 60
    try:
        while count < 50 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                count += 1
        assignment = {p.partition for p in consumer.assignment()}
    finally:
        consumer.close()
    assert count == 50
    assert assignment == {0, 1}


def test_single_broker_hard_restart_keeps_data(kafka39: KafkaBroker, topic: TopicFactory) -> None:
    from confluent_kafka import Consumer, Producer

    name = topic(kafka39, partitions=1)
    producer = Producer({"bootstrap.servers": kafka39.bootstrap, "acks": "all"})
    for i in range(20):
        producer.produce(name, value=str(i).encode())
    assert producer.flush(30) == 0
    old_pid = kafka39.nodes[1].pid
    assert old_pid is not None
    kafka39.restart(hard=True)
    with pytest.raises(ProcessLookupError):
        os.kill(old_pid, 0)
    assert kafka39.nodes[1].pid != old_pid and kafka39.alive

    consumer = Consumer(
        {
            "bootstrap.servers": kafka39.bootstrap,
            "group.id": _group(),
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([name])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < 20 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value() or b"")
    finally:
        consumer.close()
    assert values == [str(i).encode() for i in range(20)]


# ---------------------------------------------------------------------------------------------
# Three-node cluster


def test_cluster_partitions_led_by_each_broker(
    kafka39_cluster: KafkaCluster, topic: TopicFactory
) -> None:
    assert len(kafka39_cluster.nodes) == 3
    for node in kafka39_cluster.nodes.values():
        assert set(metadata(node.bootstrap).brokers) == {1, 2, 3}
    name = topic(kafka39_cluster, replica_assignment=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    assert kafka39_cluster.topic_leaders(name) == {0: 1, 1: 2, 2: 3}


def test_cluster_restart_broker_comes_back(
    kafka39_cluster: KafkaCluster, topic: TopicFactory
) -> None:
    from confluent_kafka import Consumer, Producer

    name = topic(kafka39_cluster, replica_assignment=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    producer = Producer({"bootstrap.servers": kafka39_cluster.bootstrap, "acks": "all"})
    for i in range(90):
        producer.produce(name, value=str(i).encode(), partition=i % 3)
    assert producer.flush(30) == 0

    old_pid = kafka39_cluster.node(2).pid
    kafka39_cluster.restart_broker(2)
    assert kafka39_cluster.node(2).pid != old_pid and kafka39_cluster.alive
    assert kafka39_cluster.wait_for_preferred_leaders(name, timeout=60) == {0: 1, 1: 2, 2: 3}

    consumer = Consumer(
        {
            "bootstrap.servers": kafka39_cluster.bootstrap,
            "group.id": _group(),
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([name])
    got: set[bytes] = set()
    deadline = time.monotonic() + 60
    try:
        while len(got) < 90 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.add(msg.value() or b"")
    finally:
        consumer.close()
    assert got == {str(i).encode() for i in range(90)}


def test_factory_broker_with_short_consumer_heartbeat(
    kafka_factory: Callable[..., KafkaCluster],
) -> None:
    kafka = kafka_factory("4.4", consumer_heartbeat_ms=500, auto_create_topics=True)
    assert kafka.alive and len(kafka.nodes) == 1
    settings = kafka.node(1).log_file.read_text()
    assert "group.consumer.heartbeat.interval.ms = 500" in settings
    assert "auto.create.topics.enable = true" in settings
