"""Spark jobs through groupgate in front of Kafka 3.9: batch read, batch write, streaming copy.

One local Spark session (pyspark 4.2.0 and its Kafka connector, ``tests.testbed.spark``) serves
the module; each test starts its own proxy and gives Spark only the proxy's bootstrap address.
Test data is produced, and results are read back, straight from the broker with librdkafka, so
Spark is the only client of the proxy and the checks do not depend on it. Every test checks:

* the exact records: (partition, offset, key, value) for a read, exact count and content, no
  duplicates, for a write;
* that Spark's Kafka traffic went through the proxy: the proxy's own request counters show the
  APIs Spark needs (Metadata, ListOffsets, Fetch, Produce, ...) on a broker listener of the
  proxy, and the kernel's socket table of the Spark JVM shows connections to that listener and
  never one to the broker's ports;
* that Spark's default Kafka source and sink use no consumer group (no JoinGroup/SyncGroup),
  while the deprecated consumer-based offset reader joins a one-member group that the proxy's
  engine coordinates.
"""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.process import ProxyProcess
from tests.integration.conftest import SparkSessions, StartProxy
from tests.integration.observe import PortWatcher
from tests.testbed.broker import KafkaBroker
from tests.testbed.spark import jvm_pid

PARTITIONS = 3
PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
JOIN_GROUP, SYNC_GROUP, INIT_PRODUCER_ID = 11, 14, 22
DESCRIBE_CLUSTER, DESCRIBE_TOPIC_PARTITIONS = 60, 75
GROUP_APIS = frozenset({JOIN_GROUP, SYNC_GROUP})
DEPRECATED_OFFSET_FETCHING = "spark.sql.streaming.kafka.useDeprecatedOffsetFetching"
Record = tuple[int, int, str, str]  # partition, offset, key, value


@pytest.fixture(scope="module")
def spark(spark_sessions: SparkSessions) -> Iterator[Any]:
    """A JVM of the module's own: the checks read its sockets, which must be this module's
    Kafka connections only (Spark keeps a job's Kafka consumers open for minutes)."""
    try:
        yield spark_sessions.own("groupgate-spark-tests")
    finally:
        spark_sessions.close()


@pytest.fixture
def proxy(kafka39: KafkaBroker, start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy(kafka39, "--metrics-listen", "127.0.0.1:0")


# ---------------------------------------------------------------------------------------------
# Plain clients straight to the broker


def produce(bootstrap: str, topic: str, start: int, count: int, stem: str = "") -> set[Record]:
    """Records ``start..start+count-1``, record ``i`` to partition ``i % 3``; returns them with
    the offsets they must get (partition ``p`` holds ``i = p, p + 3, ...`` in order)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3})
    expected: set[Record] = set()
    for i in range(start, start + count):
        key, value = f"{stem}k{i}", f"{stem}v{i}"
        producer.produce(topic, key=key, value=value, partition=i % PARTITIONS)
        expected.add((i % PARTITIONS, i // PARTITIONS, key, value))
    assert producer.flush(30) == 0
    return expected


def read_all(bootstrap: str, topic: str) -> list[Record]:
    """Every record of every partition, from the beginning up to the high watermark."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "log_level": 3})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends if ends[p]])
        records: list[Record] = []
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 60
        while len(done) < PARTITIONS and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            records.append((msg.partition(), msg.offset(), msg.key().decode(),
                            msg.value().decode()))
            if msg.offset() + 1 >= ends[msg.partition()]:
                done.add(msg.partition())
        assert len(done) == PARTITIONS, f"read {len(records)} records, ends {ends}"
        return records
    finally:
        consumer.close()


# ---------------------------------------------------------------------------------------------
# Evidence that Spark used the proxy and only the proxy


def request_counts(proxy: ProxyProcess) -> dict[tuple[str, int], int]:
    """(listener, api key) -> requests, from the proxy's /metrics."""
    match = re.search(r"metrics and health on (http://\S+)/metrics", proxy.log())
    assert match, proxy.log()
    with urllib.request.urlopen(f"{match.group(1)}/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = r'groupgate_requests_total\{api_key="(\d+)",node="([^"]+)"\} ([0-9.e+]+)'
    return {(node, int(key)): int(float(n)) for key, node, n in re.findall(pattern, text)}


def assert_spark_used_only_the_proxy(proxy: ProxyProcess, broker: KafkaBroker,
                                     watcher: PortWatcher, *, apis: set[int],
                                     on_broker_listener: set[int],
                                     absent: frozenset[int] = frozenset()) -> None:
    counts = request_counts(proxy)
    seen_apis = {key for (_, key), n in counts.items() if n}
    assert apis <= seen_apis, f"missing APIs {apis - seen_apis} in the proxy's counters {counts}"
    assert not absent & seen_apis, f"unexpected APIs {absent & seen_apis}: {counts}"
    broker_listeners = {str(node) for node in proxy.broker_ports()}
    assert broker_listeners, "the proxy opened no broker listener"
    for key in on_broker_listener:
        assert any(counts.get((node, key), 0) for node in broker_listeners), (
            f"no request {key} on a broker listener of the proxy: {counts}")
    broker_ports = {port for node in broker.nodes.values()
                    for port in (node.port, node.controller_port)}
    assert watcher.seen & set(proxy.broker_ports().values()), (
        f"the Spark JVM never connected to a proxy broker listener: {watcher.seen}, "
        f"proxy {proxy.broker_ports()}")
    assert not watcher.seen & broker_ports, (
        f"the Spark JVM connected straight to the broker: {watcher.seen & broker_ports}")


def as_records(rows: list[Any]) -> list[Record]:
    return [(row.partition, row.offset, row.key, row.value) for row in rows]


# ---------------------------------------------------------------------------------------------
# Tests


def test_batch_read_of_every_record(spark: Any, kafka39: KafkaBroker, proxy: ProxyProcess,
                                    topic: Callable[..., str]) -> None:
    name = topic(kafka39, partitions=PARTITIONS)
    expected = produce(kafka39.bootstrap, name, 0, 1500)
    with PortWatcher(jvm_pid(spark)) as watcher:
        rows = (spark.read.format("kafka")
                .option("kafka.bootstrap.servers", proxy.bootstrap)
                .option("subscribe", name)
                .option("startingOffsets", "earliest")
                .option("endingOffsets", "latest")
                .load()
                .selectExpr("partition", "offset", "CAST(key AS STRING) AS key",
                            "CAST(value AS STRING) AS value", "topic")
                .collect())
    assert {row.topic for row in rows} == {name}
    records = as_records(rows)
    assert len(records) == 1500
    assert set(records) == expected
    for p in range(PARTITIONS):
        assert sorted(o for q, o, _, _ in records if q == p) == list(range(500))
    assert_spark_used_only_the_proxy(proxy, kafka39, watcher,
                                     apis={METADATA, DESCRIBE_CLUSTER,
                                           DESCRIBE_TOPIC_PARTITIONS, LIST_OFFSETS, FETCH},
                                     on_broker_listener={LIST_OFFSETS, FETCH},
                                     absent=GROUP_APIS)


def test_batch_write(spark: Any, kafka39: KafkaBroker, proxy: ProxyProcess,
                     topic: Callable[..., str]) -> None:
    name = topic(kafka39, partitions=PARTITIONS)
    frame = spark.range(0, 1200).selectExpr(
        "CONCAT('wk', id) AS key", "CONCAT('wv', id) AS value",
        f"CAST(id % {PARTITIONS} AS INT) AS partition")
    with PortWatcher(jvm_pid(spark)) as watcher:
        (frame.write.format("kafka")
         .option("kafka.bootstrap.servers", proxy.bootstrap)
         .option("topic", name)
         .save())
    records = read_all(kafka39.bootstrap, name)
    assert len(records) == 1200
    assert {(p, k, v) for p, _, k, v in records} == {
        (i % PARTITIONS, f"wk{i}", f"wv{i}") for i in range(1200)}
    for p in range(PARTITIONS):  # no gaps, no duplicates: offsets 0..399 in each partition
        assert sorted(o for q, o, _, _ in records if q == p) == list(range(400))
    assert_spark_used_only_the_proxy(proxy, kafka39, watcher,
                                     apis={METADATA, PRODUCE, INIT_PRODUCER_ID},
                                     on_broker_listener={PRODUCE},
                                     absent=GROUP_APIS)


def copy_topic(spark: Any, bootstrap: str, source: str, sink: str, checkpoint: Path,
               **options: str) -> int:
    """One ``availableNow`` run of a streaming copy; returns the rows it read."""
    query = (spark.readStream.format("kafka")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source)
             .option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", 500)  # several micro-batches per run
             .options(**options)
             .load()
             .selectExpr("key", "value", "partition")
             .writeStream.format("kafka")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("topic", sink)
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True)
             .start())
    finished = query.awaitTermination(120)
    if not finished:
        query.stop()
    assert finished, "the availableNow query did not finish within 120 s"
    assert query.exception() is None, query.exception()
    return sum(int(progress["numInputRows"]) for progress in query.recentProgress)


def test_streaming_copy_resumes_from_its_checkpoint(
        spark: Any, kafka39: KafkaBroker, proxy: ProxyProcess, topic: Callable[..., str],
        tmp_path: Path) -> None:
    source = topic(kafka39, partitions=PARTITIONS)
    sink = topic(kafka39, partitions=PARTITIONS)
    checkpoint = tmp_path / "checkpoint"
    first = produce(kafka39.bootstrap, source, 0, 1200)
    with PortWatcher(jvm_pid(spark)) as watcher:
        assert copy_topic(spark, proxy.bootstrap, source, sink, checkpoint) == 1200
        copied = read_all(kafka39.bootstrap, sink)
        # the sink keeps each record's partition, so it holds the source records exactly
        assert len(copied) == 1200
        assert set(copied) == first

        second = produce(kafka39.bootstrap, source, 1200, 600)
        assert copy_topic(spark, proxy.bootstrap, source, sink, checkpoint) == 600
    copied = read_all(kafka39.bootstrap, sink)
    assert len(copied) == 1800
    assert set(copied) == first | second
    assert len({(k, v) for _, _, k, v in copied}) == 1800  # no record copied twice
    assert_spark_used_only_the_proxy(proxy, kafka39, watcher,
                                     apis={METADATA, LIST_OFFSETS, FETCH, PRODUCE},
                                     on_broker_listener={LIST_OFFSETS, FETCH, PRODUCE},
                                     absent=GROUP_APIS)


def test_deprecated_offset_fetching_joins_a_group_the_proxy_coordinates(
        spark: Any, kafka39: KafkaBroker, proxy: ProxyProcess, topic: Callable[..., str],
        tmp_path: Path) -> None:
    """With the consumer-based offset reader, the driver subscribes in a group of its own; the
    proxy's engine coordinates it (classic-translation is on by default) like any classic
    group."""
    source = topic(kafka39, partitions=PARTITIONS)
    sink = topic(kafka39, partitions=PARTITIONS)
    expected = produce(kafka39.bootstrap, source, 0, 900)
    prefix = f"spark-{uuid.uuid4().hex[:8]}"
    spark.conf.set(DEPRECATED_OFFSET_FETCHING, "true")
    try:
        with PortWatcher(jvm_pid(spark)) as watcher:
            rows = copy_topic(spark, proxy.bootstrap, source, sink, tmp_path / "checkpoint",
                              groupIdPrefix=prefix)
    finally:
        spark.conf.unset(DEPRECATED_OFFSET_FETCHING)
    assert rows == 900
    copied = read_all(kafka39.bootstrap, sink)
    assert len(copied) == 900
    assert set(copied) == expected
    assert_spark_used_only_the_proxy(
        proxy, kafka39, watcher, apis={METADATA, LIST_OFFSETS, FETCH, PRODUCE, JOIN_GROUP,
                                       SYNC_GROUP},
        on_broker_listener={JOIN_GROUP, SYNC_GROUP, FETCH, PRODUCE})
    # the engine, not the broker, took the member in: its event log names the driver's group
    joined = re.findall(rf"MemberJoined\(group_id='({re.escape(prefix)}-[^']+-driver-\d+)'",
                        proxy.log())
    assert joined, proxy.log()[-3000:]
