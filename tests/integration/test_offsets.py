"""Offsets through groupgate end where the client last committed them, whatever the client does.

Real clients against a Kafka 3.9 broker behind the proxy; the committed offsets are read
straight from the broker (an admin client bootstrapped on the broker, not the proxy), which is
what a downgrade or a lag exporter would see.

* Pipelined asynchronous commits: a confluent-kafka consumer of either protocol commits after
  every record with ``asynchronous=True``, so hundreds of OffsetCommit requests are in flight on
  one connection. Kafka handles one connection's requests in order; so must the proxy, or an
  older commit lands after a newer one and rolls the offset back.
* The same with Java's ``commitAsync`` after every record.
* Retention: the offsets of a live coordinated group outlive ``offsets.retention.minutes``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import StartProxy
from tests.testbed.broker import KafkaBroker
from tests.testbed.tools import CommitConsumer

log = logging.getLogger("rdkafka")

PARTITIONS = 12
RECORDS = 1200
PROXY_FLAGS = ("--group-heartbeat-interval-ms", "500", "--group-session-timeout-ms", "6000",
               "--group-metadata-refresh-ms", "1000")
WAIT = 90.0


def produce(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "logger": log})
    for i in range(count):
        producer.produce(topic, value=b"%d" % i, partition=i % partitions)
    assert producer.flush(30) == 0


def committed_at_broker(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets as the broker itself holds them."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": log})
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    listed = result[group].result(timeout=30)
    return {(tp.topic, tp.partition): tp.offset for tp in listed.topic_partitions}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_pipelined_asynchronous_commits_end_exact(
        kafka39: KafkaBroker, topic: Callable[..., str], start_proxy: StartProxy,
        protocol: str) -> None:
    from confluent_kafka import Consumer

    name = topic(kafka39, partitions=PARTITIONS)
    proxy = start_proxy(kafka39, *PROXY_FLAGS)
    produce(kafka39.bootstrap, name, RECORDS, PARTITIONS)
    group = f"async-{protocol}-{uuid.uuid4().hex[:8]}"
    callbacks: list[int] = []
    errors: list[str] = []

    def on_commit(err: object, partitions: list[object]) -> None:
        callbacks.append(1)
        if err is not None:
            errors.append(str(err))

    config = {"bootstrap.servers": proxy.bootstrap, "group.id": group, "logger": log,
              "group.protocol": protocol, "enable.auto.commit": False,
              "auto.offset.reset": "earliest", "on_commit": on_commit}
    if protocol == "classic":
        config.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    consumer = Consumer(config)
    consumer.subscribe([name])
    expected: dict[tuple[str, int], int] = {}
    consumed = 0
    deadline = time.monotonic() + WAIT
    try:
        while consumed < RECORDS and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            consumed += 1
            expected[(msg.topic(), msg.partition())] = msg.offset() + 1
            consumer.commit(message=msg, asynchronous=True)
        assert consumed == RECORDS, f"consumed {consumed} of {RECORDS}"
        while len(callbacks) < RECORDS and time.monotonic() < deadline:
            consumer.poll(0.2)
        assert len(callbacks) == RECORDS, f"{len(callbacks)} commit callbacks of {RECORDS}"
    finally:
        consumer.close()
    assert not errors, f"commit errors: {errors[:5]}"
    committed = committed_at_broker(kafka39.bootstrap, group)
    behind = {tp: (committed.get(tp), offset) for tp, offset in expected.items()
              if committed.get(tp) != offset}
    assert len(expected) == PARTITIONS
    assert not behind, f"broker holds (committed, last commit) {behind}"


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_java_commit_async_after_every_record_ends_exact(
        kafka39: KafkaBroker, topic: Callable[..., str], start_proxy: StartProxy,
        protocol: str) -> None:
    name = topic(kafka39, partitions=PARTITIONS)
    proxy = start_proxy(kafka39, *PROXY_FLAGS)
    produce(kafka39.bootstrap, name, RECORDS, PARTITIONS)
    group = f"java-async-{protocol}-{uuid.uuid4().hex[:8]}"
    config = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"} \
        if protocol == "classic" else {}
    with CommitConsumer(proxy.bootstrap, name, group, mode="async", group_protocol=protocol,
                        config=config) as consumer:
        consumer.wait_for(lambda: consumer.commits >= RECORDS, WAIT, "every commit answered")
    assert consumer.consumed_count == RECORDS
    assert not consumer.commit_errors, consumer.commit_errors[:5]
    expected = {tp: max(offsets) + 1 for tp, offsets in consumer.consumed.items()}
    assert len(expected) == PARTITIONS and consumer.committed == expected
    assert committed_at_broker(kafka39.bootstrap, group) == expected


def consume_and_commit(bootstrap: str, group: str, topic: str, records: int, protocol: str
                       ) -> Any:
    """A consumer that read and committed ``records`` records and stays in its group."""
    from confluent_kafka import Consumer

    config = {"bootstrap.servers": bootstrap, "group.id": group, "logger": log,
              "group.protocol": protocol, "enable.auto.commit": False,
              "auto.offset.reset": "earliest"}
    if protocol == "classic":
        config.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    consumer = Consumer(config)
    consumer.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + WAIT
    while seen < records and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            seen += 1
    assert seen == records
    consumer.commit(asynchronous=False)
    return consumer


@pytest.mark.slow  # waits for the broker's one-minute offset retention
def test_offsets_of_a_live_coordinated_group_do_not_expire(
        kafka_factory: Any, topic: Callable[..., str], start_proxy: StartProxy) -> None:
    """KIP-211: the broker expires the offsets of topics a live consumer group does not
    subscribe to. The proxy's member in the broker's group names the group's topics, so a
    coordinated group idle for longer than the retention keeps its offsets, like the same
    consumer's group straight on the broker; an empty group's offsets do expire (the control
    that shows retention is active in this test's window)."""
    broker = kafka_factory("3.9", properties={"offsets.retention.minutes": "1",
                                              "offsets.retention.check.interval.ms": "1000"})
    name = topic(broker, partitions=2)
    proxy = start_proxy(broker, *PROXY_FLAGS)
    produce(broker.bootstrap, name, 20, 2)
    suffix = uuid.uuid4().hex[:8]
    groups = {"through-proxy-consumer": (proxy.bootstrap, "consumer"),
              "through-proxy-classic": (proxy.bootstrap, "classic"),
              "straight-to-broker": (broker.bootstrap, "classic")}
    live = {f"{label}-{suffix}": consume_and_commit(bootstrap, f"{label}-{suffix}", name, 20,
                                                    protocol)
            for label, (bootstrap, protocol) in groups.items()}
    empty = f"empty-{suffix}"
    consume_and_commit(broker.bootstrap, empty, name, 20, "classic").close()
    try:
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline and committed_at_broker(broker.bootstrap, empty):
            for consumer in live.values():
                consumer.poll(0.1)
            time.sleep(1)
        assert not committed_at_broker(broker.bootstrap, empty), "retention never ran"
        for _ in range(20):  # a few more retention checks for the live groups
            for consumer in live.values():
                consumer.poll(0.1)
            time.sleep(0.5)
        for group in live:
            committed = committed_at_broker(broker.bootstrap, group)
            assert committed == {(name, 0): 10, (name, 1): 10}, (group, committed)
    finally:
        for consumer in live.values():
            consumer.close()
