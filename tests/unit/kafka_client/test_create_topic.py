"""CreateTopics for one topic: the request as a broker decodes it, and its answer read."""

from __future__ import annotations

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.kafka_client.create_topic import (
    CREATE_TOPICS_VERSION,
    create_topic_error,
    create_topic_request,
)
from translation.errors import ErrorCode


def test_the_request_asks_for_one_topic_with_its_configs_sorted() -> None:
    request = create_topic_request("t", partitions=3, replication_factor=-1,
                                   configs={"retention.ms": "5", "cleanup.policy": "delete"},
                                   timeout_ms=1500)
    encoded = messages.encode_request(ApiKey.CREATE_TOPICS, CREATE_TOPICS_VERSION, request)
    decoded, _ = messages.decode_request(ApiKey.CREATE_TOPICS, CREATE_TOPICS_VERSION, encoded)
    (topic,) = decoded["topics"]
    assert (topic["name"], topic["num_partitions"], topic["replication_factor"]) == ("t", 3, -1)
    assert [(c["name"], c["value"]) for c in topic["configs"]] == [
        ("cleanup.policy", "delete"), ("retention.ms", "5")]
    assert decoded["timeout_ms"] == 1500 and not decoded["validate_only"]


def test_the_answer_gives_the_topics_error() -> None:
    assert create_topic_error({"topics": [{"error_code": ErrorCode.NONE}]}) == (0, "")
    assert create_topic_error({"topics": [{
        "error_code": ErrorCode.POLICY_VIOLATION, "error_message": "no"}]}) == (
        ErrorCode.POLICY_VIOLATION, "no")
    assert create_topic_error({"topics": []})[0] == ErrorCode.UNKNOWN_SERVER_ERROR
