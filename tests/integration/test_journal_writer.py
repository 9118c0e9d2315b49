"""The journal writer against a real Kafka 3.9 broker: the topic is created with the settings
given (append-only, time retention, partitions), events from a real engine are written with
acks=all and read back with librdkafka exactly: one record per event, keyed by group id,
timestamped with the event time, each group's events in order in one partition; a second
writer uses the existing topic as it is."""

from __future__ import annotations

import uuid
from typing import Any

import trio

from proxy.journal.observer import JournalObserver
from proxy.journal.schema import Event, decode
from proxy.journal.settings import JournalSettings
from proxy.journal.writer import JournalWriter
from proxy.kafka_client.links import LinkPool
from proxy.kafka_client.partitioner import partition_for
from proxy.records import Compression
from tests.testbed.broker import KafkaBroker
from tests.unit.engine.helpers import FOO, ScriptedAssignor, hb, image, join, make_engine, target
from translation.heartbeat import ConsumerGroupHeartbeatRequest


def engine_events() -> list[Event]:
    """Three groups of a real engine: joins, a revocation, a leave, snapshots."""
    assignor = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 4)), assignor)
    observer = JournalObserver(source="it:9092")
    observer.attach(engine)
    out: list[Event] = []
    for n, group in enumerate(("orders", "payments", "grüppe")):
        t = 1_700_000_000_000 + n * 1000
        assignor.next = target(A={FOO: [0, 1, 2, 3]})
        out += observer.observe(engine.heartbeat(join(group, "A"), 0)[1], t)
        assignor.next = target(A={FOO: [0, 1]}, B={FOO: [2, 3]})
        out += observer.observe(engine.heartbeat(join(group, "B"), 1)[1], t + 1)
        out += observer.observe(engine.heartbeat(hb(group, "A", 1, {FOO: [0, 1, 2, 3]}), 2)[1],
                                t + 2)
        out += observer.observe(engine.heartbeat(hb(group, "A", 1, {FOO: [0, 1]}), 3)[1], t + 3)
        out += observer.observe(engine.heartbeat(hb(group, "B", 2, {}), 4)[1], t + 4)
        out += observer.snapshot(group, t + 5)
        out += observer.observe(
            engine.heartbeat(ConsumerGroupHeartbeatRequest(group, "B", -1), 5)[1], t + 6)
    return out


async def write(broker: KafkaBroker, settings: JournalSettings, events: list[Event]
                ) -> JournalWriter:
    host, port = broker.bootstrap.rsplit(":", 1)
    links = LinkPool(connect_timeout=5, request_timeout=15, max_frame_bytes=1 << 24)
    journal = JournalWriter(settings, links, [(host, int(port))])
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        journal.record_all(events)
        assert await journal.drain(60), journal.stats
        nursery.cancel_scope.cancel()
    await links.aclose()
    return journal


def read_back(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, Any]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4()}",
                         "enable.partition.eof": True, "enable.auto.commit": False,
                         "log_level": 3})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    at_end: set[int] = set()
    try:
        while len(at_end) < partitions:
            message = consumer.poll(10)
            assert message is not None, "no record and no end of partition within 10 s"
            if message.error():
                assert message.error().code() == -191, message.error()  # _PARTITION_EOF
                at_end.add(message.partition())
                continue
            out.append((message.partition(), message))
    finally:
        consumer.close()
    return out


def topic_configs(bootstrap: str, topic: str) -> tuple[int, dict[str, str]]:
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=10)
    partitions = len(metadata.topics[topic].partitions)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    return partitions, {k: v.value for k, v in configs.items()}


def test_journal_written_to_a_real_broker_and_read_back(kafka39: KafkaBroker) -> None:
    topic = f"journal-{uuid.uuid4().hex[:8]}"
    events = engine_events()
    settings = JournalSettings(topic=topic, partitions=3, replication_factor=1,
                               retention_ms=3_600_000)
    journal = trio.run(write, kafka39, settings, events)
    assert journal.stats.topic_created and journal.stats.written == len(events)
    assert journal.stats.dropped_full == journal.stats.rejected == 0

    partitions, configs = topic_configs(kafka39.bootstrap, topic)
    assert partitions == 3
    assert configs["cleanup.policy"] == "delete" and configs["retention.ms"] == "3600000"

    records = read_back(kafka39.bootstrap, topic, 3)
    assert len(records) == len(events)
    by_seq = {e.seq: e for e in events}
    seen: dict[str, list[int]] = {}
    for partition, message in records:
        event = decode(message.value())
        original = by_seq.pop(event.seq)
        assert event == Event(original.type, original.group, original.ts, original.source,
                              original.seq, {k: v for k, v in original.to_value().items()
                                             if k not in ("v", "type", "ts", "group", "source",
                                                          "seq")})
        assert message.key() == event.group.encode()
        assert message.timestamp() == (1, event.ts)  # CreateTime
        assert partition == partition_for(message.key(), 3)
        seen.setdefault(event.group, []).append(event.seq)
    assert by_seq == {}
    assert all(seqs == sorted(seqs) for seqs in seen.values())

    # A second writer (another sidecar, or a restart) uses the topic as it is.
    more = trio.run(write, kafka39, JournalSettings(topic=topic, partitions=7,
                                                    compression=Compression.NONE), events[:5])
    assert not more.stats.topic_created and more.stats.written == 5
    assert topic_configs(kafka39.bootstrap, topic)[0] == 3
    assert len(read_back(kafka39.bootstrap, topic, 3)) == len(events) + 5
