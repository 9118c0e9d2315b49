"""The journal writer against a scripted broker: topic creation with the operator's settings,
routing by group id, retries when a leader moved, split batches, refusals, a full buffer, a
broker that does not answer, and periodic snapshots. Requests and responses go through the
codec both ways, so what the writer sends is what a broker would get."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import trio

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.journal.observer import JournalObserver
from proxy.journal.schema import Event, EventType, decode
from proxy.journal.settings import JournalSettings
from proxy.journal.writer import JournalWriter, run_snapshots
from proxy.kafka_client.links import LinkPool
from proxy.kafka_client.partitioner import partition_for
from proxy.metrics import REGISTRY
from proxy.records import Compression, batches
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

from ..engine.helpers import FOO, ScriptedAssignor, image, join, make_engine, target

TOPIC = "groupgate-journal"
BOOTSTRAP = ("10.0.0.9", 9092)
BROKERS = {1: ("10.0.0.1", 9092), 2: ("10.0.0.2", 9092)}


class ScriptedBroker:
    """Answers Metadata, CreateTopics and Produce like a two-broker cluster; ``script``
    hooks let a test change the answers."""

    def __init__(self, partitions: int = 3, exists: bool = False) -> None:
        self.partitions = partitions
        self.exists = exists
        self.leaders = {p: 1 + p % 2 for p in range(partitions)}
        self.log: dict[int, list[tuple[bytes, bytes, int]]] = {}
        self.requests: list[tuple[tuple[str, int], int, dict[str, Any]]] = []
        self.produce_error: Callable[[int, int], int] = lambda partition, records: 0
        self.hang = False

    def answer(self, address: tuple[str, int], key: int, version: int,
               value: dict[str, Any]) -> dict[str, Any]:
        encoded = messages.encode_request(key, version, value)  # the writer's value encodes
        value, _ = messages.decode_request(key, version, encoded)
        self.requests.append((address, key, value))
        if key == ApiKey.METADATA:
            response = self.metadata()
        elif key == ApiKey.CREATE_TOPICS:
            response = self.create(address, value)
        elif key == ApiKey.PRODUCE:
            response = self.produce(address, value)
        else:
            raise AssertionError(f"unexpected api key {key}")
        raw = messages.encode_response(key, version, response)
        return messages.decode_response(key, version, raw)[0]

    def metadata(self) -> dict[str, Any]:
        brokers = [{"node_id": n, "host": h, "port": p, "rack": None}
                   for n, (h, p) in BROKERS.items()]
        if not self.exists:
            topic = {"error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "name": TOPIC,
                     "topic_id": uuid.UUID(int=0), "is_internal": False, "partitions": []}
        else:
            topic = {"error_code": 0, "name": TOPIC, "topic_id": uuid.UUID(int=42),
                     "is_internal": False, "partitions": [
                         {"error_code": 0, "partition_index": p, "leader_id": leader,
                          "leader_epoch": 0, "replica_nodes": [leader], "isr_nodes": [leader],
                          "offline_replicas": []} for p, leader in self.leaders.items()]}
        return {"brokers": brokers, "cluster_id": "c", "controller_id": 2, "topics": [topic]}

    def create(self, address: tuple[str, int], value: dict[str, Any]) -> dict[str, Any]:
        assert address == BROKERS[2], "CreateTopics goes to the controller"
        (topic,) = value["topics"]
        code = ErrorCode.TOPIC_ALREADY_EXISTS if self.exists else 0
        self.exists = True
        return {"topics": [{"name": topic["name"], "topic_id": uuid.UUID(int=42),
                            "error_code": code, "error_message": None,
                            "num_partitions": self.partitions, "replication_factor": 1,
                            "configs": []}]}

    def produce(self, address: tuple[str, int], value: dict[str, Any]) -> dict[str, Any]:
        results = []
        (topic,) = value["topic_data"]
        for part in topic["partition_data"]:
            p = part["index"]
            (batch,) = batches(part["records"])
            records = [(r.key or b"", r.value or b"", r.timestamp_ms) for r in batch.records()]
            code = self.produce_error(p, len(records))
            if code == 0:
                assert address == BROKERS[self.leaders[p]], "Produce goes to the leader"
                assert batch.compression is Compression.GZIP
                self.log.setdefault(p, []).extend(records)
            results.append({"index": p, "error_code": code, "base_offset": 0})
        return {"responses": [{"name": topic["name"], "partition_responses": results}]}

    def events(self) -> list[Event]:
        return [decode(v) for records in self.log.values() for _, v, _ in records]


class ScriptedPool(LinkPool):
    def __init__(self, broker: ScriptedBroker) -> None:
        super().__init__(connect_timeout=1, request_timeout=1, max_frame_bytes=1 << 20)
        self.broker = broker

    def dedicated(self, address: tuple[str, int], request_timeout: float) -> Any:
        broker = self.broker

        class Link:
            async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                              timeout: float | None = None) -> dict[str, Any]:
                if broker.hang:
                    await trio.sleep(timeout or 1)
                    raise UpstreamError("request timed out")
                await trio.sleep(0.001)
                return broker.answer(address, api_key, version, value)

            async def aclose(self) -> None:
                return None

        return Link()


def events(n: int, groups: int = 5, start: int = 0) -> list[Event]:
    return [Event(EventType.EPOCH_BUMPED, f"group-{i % groups}", 1_700_000_000_000 + i,
                  "proxy-a:9092", i + 1, {"group_epoch": i, "reason": "member joined"})
            for i in range(start, start + n)]


def writer(broker: ScriptedBroker, **settings: Any) -> JournalWriter:
    defaults: dict[str, Any] = {"topic": TOPIC, "partitions": 3, "replication_factor": 2,
                                "retention_ms": 86_400_000}
    return JournalWriter(JournalSettings(**{**defaults, **settings}), ScriptedPool(broker),
                         [BOOTSTRAP], backoff_s=(0.1, 1.0))


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_creates_the_topic_and_writes_each_group_to_one_partition_in_order(
        autojump_clock: trio.abc.Clock) -> None:
    broker = ScriptedBroker()
    journal = writer(broker)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        journal.record_all(events(300))
        assert await journal.drain(60)
        nursery.cancel_scope.cancel()
    (create,) = [v for _, k, v in broker.requests if k == ApiKey.CREATE_TOPICS]
    (topic,) = create["topics"]
    assert (topic["name"], topic["num_partitions"], topic["replication_factor"]) == (TOPIC, 3, 2)
    assert {c["name"]: c["value"] for c in topic["configs"]} == {
        "cleanup.policy": "delete", "retention.ms": "86400000"}
    assert journal.stats.topic_created and journal.stats.written == 300
    for partition, records in broker.log.items():
        for key, value, ts in records:
            event = decode(value)
            assert key == event.group.encode() and ts == event.ts
            assert partition_for(key, 3) == partition
        seqs = [decode(v).seq for _, v, _ in records]
        assert seqs == sorted(seqs)
    assert sorted(e.seq for e in broker.events()) == list(range(1, 301))


async def test_an_existing_topic_is_used_as_it_is(autojump_clock: trio.abc.Clock) -> None:
    broker = ScriptedBroker(partitions=2, exists=True)
    journal = writer(broker)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        journal.record_all(events(10))
        assert await journal.drain(60)
        nursery.cancel_scope.cancel()
    assert not [k for _, k, _ in broker.requests if k == ApiKey.CREATE_TOPICS]
    assert set(broker.log) <= {0, 1} and len(broker.events()) == 10


async def test_leader_moved_retries_with_fresh_metadata(autojump_clock: trio.abc.Clock) -> None:
    broker = ScriptedBroker(exists=True)
    refusals = [0]

    def moved(partition: int, records: int) -> int:
        if refusals[0] < 3:
            refusals[0] += 1
            broker.leaders[partition] = 3 - broker.leaders[partition]
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return 0

    broker.produce_error = moved
    journal = writer(broker)
    errors_before = sample("groupgate_journal_write_errors_total")
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        journal.record_all(events(50))
        assert await journal.drain(60)
        nursery.cancel_scope.cancel()
    assert sorted(e.seq for e in broker.events()) == list(range(1, 51))  # each once
    metadata_requests = [k for _, k, _ in broker.requests if k == ApiKey.METADATA]
    assert len(metadata_requests) >= 2
    assert journal.stats.errors >= 1
    assert sample("groupgate_journal_write_errors_total") > errors_before


async def test_a_batch_refused_as_too_large_is_split(autojump_clock: trio.abc.Clock) -> None:
    broker = ScriptedBroker(partitions=1, exists=True)
    broker.produce_error = lambda p, n: ErrorCode.MESSAGE_TOO_LARGE if n > 4 else 0
    journal = writer(broker)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        journal.record_all(events(20))
        assert await journal.drain(60)
        nursery.cancel_scope.cancel()
    assert [e.seq for e in broker.events()] == list(range(1, 21))
    assert journal.stats.rejected == 0


async def test_permanent_refusals_drop_and_count(autojump_clock: trio.abc.Clock) -> None:
    broker = ScriptedBroker(partitions=1, exists=True)
    broker.produce_error = lambda p, n: ErrorCode.TOPIC_AUTHORIZATION_FAILED
    journal = writer(broker)
    before = sample("groupgate_journal_events_dropped_total", {"reason": "rejected"})
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        journal.record_all(events(7))
        assert await journal.drain(60)
        nursery.cancel_scope.cancel()
    assert broker.log == {} and journal.stats.rejected == 7
    assert sample("groupgate_journal_events_dropped_total", {"reason": "rejected"}) == before + 7


async def test_a_broker_that_does_not_answer_never_holds_up_record(
        autojump_clock: trio.abc.Clock) -> None:
    """While writes time out, record() keeps returning at once, the buffer stays within its
    bound and the excess is counted; once the broker answers, the buffered events go out."""
    broker = ScriptedBroker(exists=True)
    broker.hang = True
    journal = writer(broker, buffer_events=100)
    before = sample("groupgate_journal_events_dropped_total", {"reason": "buffer-full"})
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        for i in range(10):
            journal.record_all(events(30, start=i * 30))
            await trio.sleep(5)
            assert journal.buffered <= 100
        assert journal.stats.dropped_full == 200
        assert sample("groupgate_journal_events_dropped_total",
                      {"reason": "buffer-full"}) == before + 200
        assert not await journal.drain(10)
        broker.hang = False
        assert await journal.drain(60)
        nursery.cancel_scope.cancel()
    assert sorted(e.seq for e in broker.events()) == list(range(1, 101))


async def test_snapshots_every_interval(autojump_clock: trio.abc.Clock) -> None:
    assignor = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), assignor)
    observer = JournalObserver(source="proxy-a:9092")
    observer.attach(engine)
    assignor.next = target(A={FOO: [0, 1]})
    engine.heartbeat(join("g1", "A"), 0)
    engine.heartbeat(join("g2", "B"), 0)
    broker = ScriptedBroker(exists=True)
    journal = writer(broker)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        nursery.start_soon(run_snapshots, observer, journal, 60.0)
        await trio.sleep(150)
        assert await journal.drain(60)
        nursery.cancel_scope.cancel()
    snapshots = [e for e in broker.events() if e.type is EventType.GROUP_SNAPSHOT]
    assert sorted(e.group for e in snapshots) == ["g1", "g1", "g2", "g2"]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        JournalSettings(topic=" ")
    with pytest.raises(ValueError):
        JournalSettings(topic="t", partitions=0)
    with pytest.raises(ValueError):
        JournalSettings(topic="t", acks=0)
    with pytest.raises(ValueError):
        JournalWriter(JournalSettings(), ScriptedPool(ScriptedBroker()), [BOOTSTRAP])
    assert not JournalSettings().enabled and JournalSettings(topic="t").enabled
