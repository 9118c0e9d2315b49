"""The state writer's answers to broker errors, against a scripted cluster (no broker).

A transaction coordinator whose metadata lags a leader change (a broker of three stopped)
answers AddPartitionsToTxn with UNKNOWN_TOPIC_OR_PARTITION for a while: the write retries it,
as Kafka's producer retries any retriable error, and commits. An error no retry fixes still
fails the write at once.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
import trio

from proxy.codec.api_keys import ApiKey
from proxy.kafka_client.links import Address
from proxy.metrics import REGISTRY
from proxy.state_log.errors import WriteFailed
from proxy.state_log.writer import Writer, WriterConfig
from translation.errors import ErrorCode

COORDINATOR: Address = ("broker-1", 9092)


class ScriptedLink:
    def __init__(self, cluster: ScriptedCluster) -> None:
        self._cluster = cluster

    async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                      timeout: float) -> dict[str, Any]:
        self._cluster.sent.append(ApiKey(api_key).name)
        script = self._cluster.answers.get(api_key)
        code = script.popleft() if script else ErrorCode.NONE
        if api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            return {"results_by_topic_v3_and_below": [{"name": "t", "results_by_partition": [
                {"partition_index": 0, "partition_error_code": code}]}]}
        if api_key == ApiKey.PRODUCE:
            return {"responses": [{"name": "t", "partition_responses": [
                {"index": 0, "error_code": code}]}]}
        return {"error_code": code, "producer_id": 7, "producer_epoch": 1}


class ScriptedCluster:
    def __init__(self, answers: dict[int, list[int]]) -> None:
        self.answers = {k: deque(v) for k, v in answers.items()}
        self.sent: list[str] = []

    def link(self, address: Address, key: str = "") -> ScriptedLink:
        return ScriptedLink(self)

    async def transaction_coordinator(self, transactional_id: str, deadline: float) -> Address:
        return COORDINATOR

    async def leader(self, topic: str, partition: int, deadline: float) -> Address:
        return COORDINATOR

    def forget_leader(self, topic: str, partition: int) -> None:
        pass


def writer(cluster: ScriptedCluster) -> Writer:
    config = WriterConfig(topic="t", transactional_id_prefix="gg", transaction_timeout_ms=60000,
                          write_timeout=30.0, open_timeout=30.0, max_batch_bytes=1 << 20,
                          coalesce=False)
    return Writer(cluster, config, "g", "gg-g", 0, 7, 0, COORDINATOR)  # type: ignore[arg-type]


async def test_add_partitions_retries_a_coordinator_whose_metadata_lags() -> None:
    cluster = ScriptedCluster({ApiKey.ADD_PARTITIONS_TO_TXN: [
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER]})
    w = writer(cluster)
    await w.write([(b"k", b"v")])
    assert w.transactions == 1
    assert cluster.sent == ["ADD_PARTITIONS_TO_TXN"] * 3 + ["PRODUCE", "END_TXN"]


async def test_an_error_no_retry_fixes_fails_the_write_at_once() -> None:
    cluster = ScriptedCluster({ApiKey.ADD_PARTITIONS_TO_TXN: [ErrorCode.INVALID_TXN_STATE]})
    w = writer(cluster)
    with pytest.raises(WriteFailed, match="INVALID_TXN_STATE") as failed:
        await w.write([(b"k", b"v")])
    assert failed.value.committed is False and w.transactions == 0
    # the write aborted its transaction (InitProducerId with its own id) and sent nothing else
    assert cluster.sent == ["ADD_PARTITIONS_TO_TXN", "INIT_PRODUCER_ID"]
    await w.write([(b"k", b"v")])
    assert w.transactions == 1


def _writes(outcome: str, suffix: str) -> float:
    return REGISTRY.get_sample_value(f"groupgate_state_log_write_seconds_{suffix}",
                                     {"outcome": outcome}) or 0.0


async def test_each_transaction_s_time_is_observed_by_outcome(
        autojump_clock: trio.abc.Clock) -> None:
    committed, took = _writes("committed", "count"), _writes("committed", "sum")
    failed = _writes("failed", "count")
    cluster = ScriptedCluster({ApiKey.ADD_PARTITIONS_TO_TXN: [
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]})
    w = writer(cluster)
    began = trio.current_time()
    await w.write([(b"k", b"v")])  # committed after one backoff
    elapsed = trio.current_time() - began
    assert elapsed > 0
    assert _writes("committed", "count") == committed + 1
    assert _writes("committed", "sum") == pytest.approx(took + elapsed)
    cluster.answers[ApiKey.ADD_PARTITIONS_TO_TXN].append(ErrorCode.INVALID_TXN_STATE)
    with pytest.raises(WriteFailed):
        await w.write([(b"k", b"v")])
    assert _writes("failed", "count") == failed + 1
    assert _writes("committed", "count") == committed + 1
