"""Produce of the proxy's own batches: the request as a broker decodes it, the answer read."""

from __future__ import annotations

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.kafka_client.produce import (
    NOT_ANSWERED,
    PRODUCE_VERSION,
    partition_results,
    produce_request,
)
from proxy.records import Record, encode_batch
from translation.errors import ErrorCode


def test_the_request_carries_each_partitions_batch() -> None:
    batch = encode_batch([Record(b"k", b"v", 7)])
    request = produce_request("t", {0: batch, 3: batch}, acks=-1, timeout_ms=900,
                              transactional_id="tx")
    encoded = messages.encode_request(ApiKey.PRODUCE, PRODUCE_VERSION, request)
    decoded, _ = messages.decode_request(ApiKey.PRODUCE, PRODUCE_VERSION, encoded)
    assert (decoded["transactional_id"], decoded["acks"], decoded["timeout_ms"]) == ("tx", -1, 900)
    (topic,) = decoded["topic_data"]
    assert topic["name"] == "t"
    assert [p["index"] for p in topic["partition_data"]] == [0, 3]
    assert [bytes(p["records"]) for p in topic["partition_data"]] == [batch, batch]


def test_results_per_partition_of_the_topic_only() -> None:
    response = {"responses": [
        {"name": "other", "partition_responses": [{"index": 1, "error_code": 0}]},
        {"name": "t", "partition_responses": [
            {"index": 0, "error_code": 0},
            {"index": 1, "error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER}]}]}
    results = partition_results(response, "t")
    assert {p: r["error_code"] for p, r in results.items()} == {
        0: 0, 1: ErrorCode.NOT_LEADER_OR_FOLLOWER}
    assert results.get(2, NOT_ANSWERED)["error_code"] == ErrorCode.NETWORK_EXCEPTION
