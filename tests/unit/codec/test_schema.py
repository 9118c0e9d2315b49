"""Schema loading: comments, version ranges, names, and the vendored set."""

from __future__ import annotations

import pytest

from proxy.codec import messages
from proxy.codec.schema import (
    SCHEMA_DIR,
    Versions,
    load,
    parse_schema,
    snake_case,
    strip_comments,
)

REQUIRED = [
    "ApiVersions", "Metadata", "FindCoordinator", "DescribeCluster", "Produce", "Fetch",
    "JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup", "OffsetCommit", "OffsetFetch",
    "TxnOffsetCommit", "OffsetDelete", "ListGroups", "DescribeGroups",
    "ConsumerGroupHeartbeat", "ConsumerGroupDescribe",
]


@pytest.mark.parametrize(("name", "expected"), [
    ("ClientId", "client_id"), ("ProtocolType", "protocol_type"), ("NodeId", "node_id"),
    ("ThrottleTimeMs", "throttle_time_ms"), ("IsrNodes", "isr_nodes"),
    ("KRaftVersion", "k_raft_version"), ("TopicId", "topic_id"), ("Host", "host"),
])
def test_snake_case(name: str, expected: str) -> None:
    assert snake_case(name) == expected


def test_versions() -> None:
    assert 5 in Versions.parse("3+") and 2 not in Versions.parse("3+")
    assert 4 in Versions.parse("0-4") and 5 not in Versions.parse("0-4")
    assert Versions.parse("none").empty and Versions.parse(None).empty
    assert Versions.parse("7") == Versions(7, 7)


def test_strip_comments_keeps_slashes_in_strings() -> None:
    text = '// header\n{ "a": "http://x", /* c */ "b": 1 } // tail'
    assert parse_schema.__module__  # the loader uses the same function
    assert strip_comments(text).strip() == '{ "a": "http://x",  "b": 1 }'


def test_all_required_schemas_are_vendored_with_license_note() -> None:
    for api in REQUIRED:
        for kind in ("Request", "Response"):
            assert (SCHEMA_DIR / f"{api}{kind}.json").exists(), api + kind
    for extra in ("RequestHeader", "ResponseHeader", "ConsumerProtocolSubscription",
                  "ConsumerProtocolAssignment"):
        assert (SCHEMA_DIR / f"{extra}.json").exists()
    readme = (SCHEMA_DIR / "README.md").read_text()
    assert "Apache License" in readme


def test_min_version_is_not_forced_to_zero() -> None:
    assert messages.supported_versions(8)[0] == 2  # OffsetCommit 2-10 in Kafka 4.x
    assert messages.supported_versions(0)[0] == 3  # Produce 3-13
    with pytest.raises(Exception, match="not supported"):
        messages.decode_request(8, 1, b"")


def test_header_versions() -> None:
    assert messages.request_header_version(3, 8) == 1
    assert messages.request_header_version(3, 9) == 2
    assert messages.response_header_version(3, 9) == 1
    assert messages.response_header_version(18, 3) == 0  # ApiVersions: always v0
    assert messages.request_header_version(18, 3) == 2
    assert messages.is_flexible(68, 0)


def test_client_id_is_never_compact() -> None:
    hdr = load("RequestHeader")
    client_id = next(f for f in hdr.struct.fields if f.name == "ClientId")
    assert client_id.flexible is not None and client_id.flexible.empty


def test_commonstructs_are_resolved() -> None:
    resp = messages.schema(68, response=True)
    assignment = next(f for f in resp.struct.fields if f.key == "assignment")
    assert assignment.struct is not None
    tp = assignment.struct.fields[0]
    assert tp.struct is not None and [f.key for f in tp.struct.fields] == [
        "topic_id", "partitions"]
