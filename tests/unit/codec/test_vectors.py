"""Hand-checked byte vectors, written out from the Kafka protocol guide's encoding rules."""

from __future__ import annotations

import uuid

from proxy.codec import messages
from proxy.codec.compiler import UNKNOWN_TAGGED


def test_apiversions_request_v3_compact_strings() -> None:
    # ClientSoftwareName "kp" -> uvarint(3) 'kp'; ClientSoftwareVersion "1.0" -> uvarint(4) '1.0';
    # empty tagged-field section -> 0x00.
    wire = bytes.fromhex("03") + b"kp" + bytes.fromhex("04") + b"1.0" + b"\x00"
    value = {"client_software_name": "kp", "client_software_version": "1.0"}
    assert messages.encode_request(18, 3, value) == wire
    got, end = messages.decode_request(18, 3, wire)
    assert end == len(wire)
    assert {k: got[k] for k in value} == value


def test_heartbeat_request_v0_classic_strings() -> None:
    # group_id int16 len + bytes, generation_id int32, member_id int16 len + bytes
    wire = b"\x00\x01g" + b"\x00\x00\x00\x05" + b"\x00\x02m1"
    got, end = messages.decode_request(12, 0, wire)
    assert end == len(wire)
    assert (got["group_id"], got["generation_id"], got["member_id"]) == ("g", 5, "m1")
    assert got["group_instance_id"] is None  # v3+ field, absent in v0 -> its default
    assert messages.encode_request(12, 0, got) == wire


def test_heartbeat_response_v4_tagged_fields_preserved() -> None:
    # throttle 0, error 0, tagged section with one unknown tag 9 of 2 bytes
    wire = b"\x00\x00\x00\x00" + b"\x00\x00" + b"\x01" + b"\x09\x02ab"
    got, end = messages.decode_response(12, 4, wire)
    assert end == len(wire)
    assert got[UNKNOWN_TAGGED] == {9: b"ab"}
    assert messages.encode_response(12, 4, got) == wire


def test_metadata_v0_brokers_then_topics() -> None:
    wire = (b"\x00\x00\x00\x01" + b"\x00\x00\x00\x02" + b"\x00\x01h" + b"\x00\x00\x23\x84"
            + b"\x00\x00\x00\x00")
    got, _ = messages.decode_response(3, 0, wire)
    assert got["brokers"] == [{"node_id": 2, "host": "h", "port": 9092, "rack": None}]
    assert got["topics"] == []


def test_nullable_struct_uses_int8_marker() -> None:
    # ConsumerGroupHeartbeat response v0: assignment null -> 0xff; present -> 0x01 + struct
    base = {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "member_id": "m",
            "member_epoch": 1, "heartbeat_interval_ms": 5000}
    null = messages.encode_response(68, 0, {**base, "assignment": None})
    assert null.endswith(b"\xff\x00")
    tid = uuid.UUID(int=1)
    full = messages.encode_response(68, 0, {**base, "assignment": {
        "topic_partitions": [{"topic_id": tid, "partitions": [0, 2]}]}})
    assert full.endswith(b"\x01" + b"\x02" + tid.bytes + b"\x03" + b"\x00\x00\x00\x00"
                         + b"\x00\x00\x00\x02" + b"\x00" + b"\x00" + b"\x00")
    got, _ = messages.decode_response(68, 0, full)
    assert got["assignment"]["topic_partitions"][0] == {"topic_id": tid, "partitions": [0, 2]}


def test_defaults_for_missing_fields_on_encode() -> None:
    # JoinGroup v5 request with only group_id: session timeout 0, rebalance timeout -1, etc.
    wire = messages.encode_request(11, 5, {"group_id": "g"})
    got, _ = messages.decode_request(11, 5, wire)
    assert got["rebalance_timeout_ms"] == -1
    assert got["group_instance_id"] is None
    assert got["protocols"] == []


def test_consumer_protocol_subscription_roundtrip_and_newer_versions() -> None:
    value = {"topics": ["a", "b"], "user_data": None,
             "owned_partitions": [{"topic": "a", "partitions": [1]}], "generation_id": 4,
             "rack_id": "r"}
    blob = messages.encode_data("ConsumerProtocolSubscription", 3, value)
    assert blob[:2] == b"\x00\x03"
    version, got = messages.decode_data("ConsumerProtocolSubscription", blob)
    assert version == 3 and got == value
    # a newer version with an appended field is read with the newest known schema
    newer = b"\x00\x09" + blob[2:] + b"extra"
    version, got = messages.decode_data("ConsumerProtocolSubscription", newer)
    assert version == 9 and got["topics"] == ["a", "b"]
