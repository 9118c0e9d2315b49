"""A member whose group state record would not fit the state topic, against a real Kafka 3.9
broker through one sidecar with the state log: the topic takes batches of at most 64 KiB here
(``max.message.bytes``), and a new-protocol consumer subscribing to 400 topic names of 212
characters (a member record of about 86 KB) is refused with INVALID_REQUEST, a fatal error for
librdkafka, while two members of the same group keep consuming under continuous production,
their group keeps being written, and none of them is sent round a rebalance (before, the
member was admitted, every write of the group failed MESSAGE_TOO_LARGE and the group was given
up and taken over again and again)."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.integration.conftest import StartProxy
from tests.testbed.broker import KafkaBroker
from translation.records import RecordKind, decode_record, fold

pytestmark = pytest.mark.broker

WAIT = 45.0
"""Upper bound for waiting on a condition (tests wait for events; this only stops a hang)."""
HUGE = [f"absent-{i:05d}-" + "x" * 200 for i in range(400)]


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Member(threading.Thread):
    """A confluent-kafka consumer (``group.protocol=consumer``) polling in a thread."""

    def __init__(self, bootstrap: str, group: str, topics: list[str]) -> None:
        super().__init__(daemon=True)
        self.errors: list[KafkaError] = []
        self.records = 0
        self.assigned: set[int] = set()
        self.member_id: str | None = None
        self.stopping = threading.Event()
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
            "auto.offset.reset": "earliest", "error_cb": self.errors.append,
            "topic.metadata.refresh.interval.ms": 1000})
        self.consumer.subscribe(topics, on_assign=self._assigned, on_revoke=self._revoked)

    def _assigned(self, consumer: Any, partitions: list[Any]) -> None:
        self.assigned |= {p.partition for p in partitions}
        self.member_id = consumer.memberid()  # in the polling thread (the client's calls
        # from another thread while it polls can block)

    def _revoked(self, _consumer: Any, partitions: list[Any]) -> None:
        self.assigned -= {p.partition for p in partitions}

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                message = self.consumer.poll(0.2)
            except KafkaException as exc:  # after a fatal error
                self.errors.append(exc.args[0])
                time.sleep(0.2)
                continue
            if message is None:
                continue
            if message.error():
                self.errors.append(message.error())
            else:
                self.records += 1
        self.consumer.close()

    def fatal(self) -> KafkaError | None:
        """The fatal error, whether it came to the error callback or as a polled message."""
        return next((e for e in self.errors
                     if e.fatal() or e.code() == KafkaError._FATAL), None)


def live_members(bootstrap: str, state_topic: str, group: str) -> set[str]:
    """The member ids the state log holds for ``group`` (read committed, to the end)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex}",
                       "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        partitions = reader.list_topics(state_topic, timeout=10).topics[state_topic].partitions
        ends = {p: reader.get_watermark_offsets(TopicPartition(state_topic, p), timeout=10)[1]
                for p in partitions}
        assigned = [TopicPartition(state_topic, p, 0) for p, end in ends.items() if end]
        reader.assign(assigned)
        records = []
        deadline = time.monotonic() + WAIT
        # done when the position has passed each end: the log is transactional, so its last
        # offset may be a commit marker that is never delivered as a record
        while any(tp.offset < ends[tp.partition] for tp in reader.position(assigned)):
            if time.monotonic() > deadline:
                raise AssertionError(f"the state log not read to its ends {ends} in {WAIT} s: "
                                     f"at {reader.position(assigned)}")
            message = reader.poll(0.5)
            if message is None or message.error():
                continue
            record = decode_record(message.key(), message.value())
            if record.key.group_id == group:
                records.append(record)
        return {k.member_id for k in fold(records) if k.kind is RecordKind.MEMBER}
    finally:
        reader.close()


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


def test_a_member_too_large_for_the_state_topic_is_refused_and_the_others_consume(
        kafka39: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str]) -> None:
    name = topic(kafka39, partitions=4)
    state_topic = f"state-{uuid.uuid4().hex[:8]}"
    sidecar = start_proxy(kafka39, "--state-log-topic", state_topic,
                          "--state-log-topic-config", "max.message.bytes=65536",
                          "--group-heartbeat-interval-ms", "500",
                          "--group-session-timeout-ms", "6000",
                          "--metrics-listen", "127.0.0.1:0")
    found = re.search(r"metrics and health on (http://\S+)/metrics", sidecar.log())
    assert found, sidecar.log()
    metrics_url = f"{found.group(1)}/metrics"
    bootstrap = f"{sidecar.host}:{sidecar.port}"
    group = f"g-{uuid.uuid4().hex[:8]}"

    producing = threading.Event()
    produced = [0]

    def produce() -> None:
        producer = Producer({"bootstrap.servers": kafka39.bootstrap, "linger.ms": 5})
        while not producing.is_set():
            producer.produce(name, value=b"%d" % produced[0], partition=produced[0] % 4)
            produced[0] += 1
            producer.poll(0)
            time.sleep(0.002)
        producer.flush(10)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    members = [Member(bootstrap, group, [name]) for _ in range(2)]
    big: Member | None = None
    try:
        for member in members:
            member.start()
        wait_until(lambda: sorted(members[0].assigned | members[1].assigned) == [0, 1, 2, 3]
                   and all(m.assigned for m in members) and all(m.records for m in members),
                   "both members to hold partitions and consume")
        held = [set(m.assigned) for m in members]

        big = Member(bootstrap, group, HUGE)
        big.start()
        wait_until(lambda: big is not None and big.fatal() is not None,
                   "the oversized member to be refused")
        assert any("Invalid request" in e.str() for e in big.errors), big.errors

        # the others consume on, undisturbed: more records, the same partitions, no errors
        counts = [m.records for m in members]
        wait_until(lambda: all(m.records > c + 100 for m, c in zip(members, counts,
                                                                    strict=True)),
                   "the two members to go on consuming")
        assert [set(m.assigned) for m in members] == held
        assert not [e for m in members for e in m.errors], [m.errors for m in members]

        # the group's state in the log: its two members, written since the refusal too
        assert live_members(kafka39.bootstrap, state_topic, group) == {
            m.member_id for m in members}
        assert _metric(metrics_url, "groupgate_state_members_refused_too_large_total") >= 1
        log = sidecar.log()
        assert "MESSAGE_TOO_LARGE" not in log and "giving the group up" not in log, log
        assert re.search(rf"group {group}: member \S+ refused \(consumer-group-heartbeat\): its "
                         r"state record would be \d+ bytes, the state log takes at most 65439",
                         log), log
    finally:
        producing.set()
        producer.join(15)
        for member in [*members, *([big] if big is not None else [])]:
            member.stopping.set()
        for member in [*members, *([big] if big is not None else [])]:
            member.join(15)
