"""The group state log against real Kafka 3.9 brokers.

* The topic is created with exactly the configured settings; an existing one is checked (a
  difference is logged, a topic that is not compacted is refused).
* Records written by a group's writer load back, latest value per key, tombstones removing
  keys, with many groups sharing one partition.
* A second writer of a group fences the first: its next write raises Fenced, and what it had
  in an open transaction is never loaded.
* A writer that dies between Produce and EndTxn leaves nothing visible once the next writer
  has opened; another group's load waits for such an open transaction instead of returning
  without its own later records.
* Loads after the log cleaner compacted the partition give the same state.
* On three nodes (replication 3, min.insync.replicas 2) writes go on when the partition's
  leader is stopped.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from proxy.codec.api_keys import ApiKey
from proxy.records import Record, batches, encode_batch
from proxy.state_log.log import (
    Fenced,
    StateLog,
    StateLogSettings,
    StateTopicError,
    Unavailable,
)
from proxy.state_log.topic import default_configs
from tests.testbed.broker import KafkaCluster


def group_of(key: bytes) -> str:
    group, sep, _ = key.partition(b"\x00")
    if not sep:
        raise ValueError("not a state key")
    return group.decode()


def key(group: str, name: str) -> bytes:
    return group.encode() + b"\x00" + name.encode()


def address(cluster: KafkaCluster) -> list[tuple[str, int]]:
    out = []
    for part in cluster.bootstrap.split(","):
        host, _, port = part.rpartition(":")
        out.append((host, int(port)))
    return out


def settings(**kwargs: Any) -> StateLogSettings:
    base: dict[str, Any] = {"topic": f"state-{uuid.uuid4().hex[:8]}", "partitions": 1,
                            "replication_factor": 1}
    base.update(kwargs)
    return StateLogSettings(**base)


@asynccontextmanager
async def state_log(cluster: KafkaCluster, config: StateLogSettings) -> AsyncIterator[StateLog]:
    log = StateLog(address(cluster), config, group_of=group_of)
    try:
        await log.start()
        yield log
    finally:
        await log.aclose()


def topic_configs(cluster: KafkaCluster, name: str) -> dict[str, str]:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import ConfigResource

    admin = cluster.admin()
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    deadline = time.monotonic() + 30
    while True:
        # A broker other than the controller learns of a new topic a moment later.
        try:
            described = admin.describe_configs([resource])[resource].result(30)
        except KafkaException as e:
            if (e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART
                    or time.monotonic() > deadline):
                raise
            time.sleep(0.2)
            continue
        return {k: v.value for k, v in described.items()}


async def test_topic_is_created_with_exactly_its_settings(kafka39: KafkaCluster) -> None:
    config = settings(partitions=3)
    async with state_log(kafka39, config) as log:
        assert log.state is not None and log.state.created and log.state.partitions == 3
    actual = topic_configs(kafka39, config.topic)
    wanted = default_configs(1)
    assert {k: actual[k] for k in wanted} == wanted
    assert wanted["cleanup.policy"] == "compact" and wanted["min.insync.replicas"] == "1"
    async with state_log(kafka39, config) as again:
        assert again.state is not None
        assert not again.state.created and again.state.differences == ()


async def test_an_existing_topic_is_checked(kafka39: KafkaCluster,
                                            topic: Callable[..., str],
                                            caplog: pytest.LogCaptureFixture) -> None:
    deleting = topic(kafka39, partitions=1, config={"cleanup.policy": "delete"})
    with pytest.raises(StateTopicError, match="must be compacted"):
        async with state_log(kafka39, settings(topic=deleting)):
            pass
    other = topic(kafka39, partitions=2, config={"cleanup.policy": "compact",
                                                  "segment.bytes": str(1 << 20)})
    caplog.set_level(logging.WARNING, "groupgate.state_log")
    async with state_log(kafka39, settings(topic=other)) as log:
        assert log.state is not None and log.state.partitions == 2
        differences = log.state.differences
    assert "partitions=2 (1)" in differences
    assert f"segment.bytes={1 << 20} ({8 << 20})" in differences
    assert any("exists with settings other than configured" in r.message
               for r in caplog.records)


async def test_round_trip_many_groups_in_one_partition(kafka39: KafkaCluster) -> None:
    groups = [f"g{i}" for i in range(12)] + ["with space/and:colon", "ü" * 300]
    expected: dict[str, dict[bytes, bytes]] = {g: {} for g in groups}
    async with state_log(kafka39, settings()) as log:
        writers = {g: await log.open_writer(g) for g in groups}
        for round_ in range(4):
            for g in groups:
                records: list[tuple[bytes, bytes | None]] = []
                for m in range(5):
                    k = key(g, f"member-{m}")
                    if (m + round_) % 3 == 0 and round_:
                        records.append((k, None))
                        expected[g].pop(k, None)
                    else:
                        v = f"{g}/{m}/{round_}".encode()
                        records.append((k, v))
                        expected[g][k] = v
                await writers[g].write(records)
        await _produce_plain(log, b"no separator", b"another producer's record")
        for g in groups:
            loaded = await log.load_group(g)
            assert dict(loaded.records) == expected[g], g
            assert [k for k, _ in loaded.records] == _write_order(expected[g])
            assert loaded.records_read > len(loaded.records)  # the partition holds others
            assert loaded.unreadable == 1


async def _produce_plain(log: StateLog, k: bytes, v: bytes) -> None:
    """One record from a plain (not transactional) producer."""
    batch = encode_batch([Record(k, v, 0)])  # no producer id, not transactional
    leader = await log.cluster.leader(log.settings.topic, 0, trio.current_time() + 10)
    response = await log.cluster.link(leader).request(ApiKey.PRODUCE, 9, {
        "transactional_id": None, "acks": -1, "timeout_ms": 10_000,
        "topic_data": [{"name": log.settings.topic, "partition_data": [
            {"index": 0, "records": batch}]}]})
    assert response["responses"][0]["partition_responses"][0]["error_code"] == 0


def _write_order(live: dict[bytes, bytes]) -> list[bytes]:
    """Keys in the order of their last write (the round they were last set in, then name)."""
    return sorted(live, key=lambda k: (int(live[k].decode().rsplit("/", 1)[1]), k))


async def test_a_second_writer_fences_the_first(kafka39: KafkaCluster) -> None:
    async with state_log(kafka39, settings()) as log:
        first = await log.open_writer("fenced")
        await first.write([(key("fenced", "a"), b"1")])
        await first._begin([(key("fenced", "b"), b"open")], trio.current_time() + 10)
        second = await log.open_writer("fenced")
        assert second.producer_id == first.producer_id
        assert second.producer_epoch > first.producer_epoch
        with pytest.raises(Fenced):
            await first.write([(key("fenced", "c"), b"late")])
        assert first.fenced
        with pytest.raises(Fenced):  # and stays so
            await first.write([(key("fenced", "c"), b"later")])
        loaded = await log.load_group("fenced")
        assert dict(loaded.records) == {key("fenced", "a"): b"1"}
        await second.write([(key("fenced", "a"), b"2")])
        assert dict((await log.load_group("fenced")).records) == {key("fenced", "a"): b"2"}


async def test_a_writer_killed_mid_transaction_leaves_nothing(kafka39: KafkaCluster) -> None:
    config = settings(transaction_timeout_ms=120_000)
    async with state_log(kafka39, config) as log:
        writer = await log.open_writer("killed")
        await writer.write([(key("killed", "kept"), b"1")])
    async with state_log(kafka39, config) as dying:
        writer = await dying.open_writer("killed")
        await writer._begin([(key("killed", "kept"), b"2"), (key("killed", "new"), b"x")],
                            trio.current_time() + 10)
    # the dying sidecar's connections are closed without EndTxn: its transaction stays open
    async with state_log(kafka39, config) as log:
        await log.open_writer("killed")
        loaded = await log.load_group("killed")
        assert dict(loaded.records) == {key("killed", "kept"): b"1"}


async def test_a_load_waits_for_another_groups_open_transaction(kafka39: KafkaCluster) -> None:
    config = settings(transaction_timeout_ms=120_000)
    async with state_log(kafka39, config) as log:
        other = await log.open_writer("other")
        await other._begin([(key("other", "x"), b"open")], trio.current_time() + 10)
        mine = await log.open_writer("mine")
        await mine.write([(key("mine", "a"), b"committed after the other's open transaction")])
        await log.open_writer("mine")
        impatient = StateLog(address(kafka39),
                             settings(topic=config.topic, load_timeout=1.0,
                                      transaction_timeout_ms=120_000), group_of=group_of)
        try:
            await impatient.start()
            with pytest.raises(Unavailable, match="last stable offset"):
                await impatient.load_group("mine")
        finally:
            await impatient.aclose()
        async with trio.open_nursery() as nursery:
            result: list[Any] = []

            async def load() -> None:
                result.append(await log.load_group("mine"))

            nursery.start_soon(load)
            await log.open_writer("other")  # aborts the other group's open transaction
        (loaded,) = result
        assert dict(loaded.records) == {
            key("mine", "a"): b"committed after the other's open transaction"}


async def _data_records(log: StateLog, partition: int) -> int:
    """Records in the partition as stored (read_uncommitted, control batches left out)."""
    leader = await log.cluster.leader(log.settings.topic, partition, trio.current_time() + 10)
    count, position = 0, 0
    while True:
        response = await log.cluster.link(leader).request(ApiKey.FETCH, 12, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 22,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": log.settings.topic, "partitions": [{
                "partition": partition, "current_leader_epoch": -1, "fetch_offset": position,
                "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": 1 << 22}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        data = response["responses"][0]["partitions"][0]
        found = list(batches(data["records"] or b""))
        if not found:
            return count
        count += sum(b.record_count for b in found if not b.is_control)
        position = found[-1].next_offset


async def test_load_after_compaction(kafka39: KafkaCluster) -> None:
    config = settings(topic_configs={"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
                                     "delete.retention.ms": "100"})
    expected: dict[bytes, bytes] = {}
    written = 0
    async with state_log(kafka39, config) as log:
        writers = {g: await log.open_writer(g) for g in ("c1", "c2")}
        for round_ in range(30):
            for g, writer in writers.items():
                records: list[tuple[bytes, bytes | None]] = []
                for m in range(4):
                    k = key(g, f"m{m}")
                    if m == 3 and round_ % 2:
                        records.append((k, None))
                        expected.pop(k, None)
                    else:
                        records.append((k, b"%d" % round_))
                        expected[k] = b"%d" % round_
                await writer.write(records)
                written += len(records)
            await trio.sleep(0.12)  # segment.ms: the next write rolls a new segment
        await writers["c1"]._begin([(key("c1", "m0"), b"aborted")], trio.current_time() + 10)
        await log.open_writer("c1")  # aborts it
        await writers["c2"].write([(key("c2", "roll"), b"r")])
        expected[key("c2", "roll")] = b"r"
        before = await log.load_group("c1")
        with trio.fail_after(120):  # the cleaner runs every 15 s (log.cleaner.backoff.ms)
            while await _data_records(log, 0) >= written:
                await trio.sleep(1)
        for g in ("c1", "c2"):
            loaded = await log.load_group(g)
            assert dict(loaded.records) == {k: v for k, v in expected.items()
                                            if group_of(k) == g}
        assert dict(before.records) == dict((await log.load_group("c1")).records)


async def test_three_nodes_survive_the_leader_stopping(kafka39_cluster: KafkaCluster) -> None:
    config = settings(replication_factor=3, partitions=2)
    async with state_log(kafka39_cluster, config) as log:
        assert topic_configs(kafka39_cluster, config.topic)["min.insync.replicas"] == "2"
        writer = await log.open_writer("ha")
        await writer.write([(key("ha", "a"), b"1")])
        leader = kafka39_cluster.topic_leaders(config.topic)[writer.partition]
        await trio.to_thread.run_sync(kafka39_cluster.stop_broker, leader)
        await writer.write([(key("ha", "a"), b"2"), (key("ha", "b"), b"3")])
        loaded = await log.load_group("ha")
        assert dict(loaded.records) == {key("ha", "a"): b"2", key("ha", "b"): b"3"}
