"""proxy.coordination.convert, classic APIs: wire dicts <-> the engine's classic dataclasses.

Requests go through the codec the way a client's bytes do (encode, decode, bridge); responses
the way the proxy sends them (bridge, encode, decode). The embedded consumer protocol is
checked against kafka-python 3.0.12's own classes, and hostile subscription bytes must come
out as the engine's "malformed" subscription (None), never as an exception.
"""

from __future__ import annotations

import array
import struct
import warnings
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.codec.messages import (
    decode_data,
    decode_request,
    decode_response,
    encode_data,
    encode_request,
    encode_response,
)
from proxy.coordination.convert import (
    ASSIGNMENT_SCHEMA,
    SUBSCRIPTION_SCHEMA,
    ShapeError,
    classic_protocols,
    encode_assignment,
    heartbeat_request,
    heartbeat_response,
    join_group_request,
    join_group_response,
    leave_group_request,
    leave_group_response,
    parse_assignment,
    parse_subscription,
    sync_group_request,
    sync_group_response,
)
from tests.unit.codec.strategies import examples
from tests.unit.engine.classic.helpers import Classic
from tests.unit.engine.helpers import BAR, FOO, ScriptedAssignor, image, target
from translation.classic.messages import (
    ClassicAssignment,
    ClassicProtocol,
    ClassicSubscription,
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    LeavingMember,
    LeavingMemberResponse,
    SyncGroupResponse,
)
from translation.errors import ErrorCode

with warnings.catch_warnings():
    # kafka-python 3.0.12 loads its schemas with a deprecated importlib.resources call
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
    from kafka.protocol.consumer import JoinGroupRequest as KpJoinGroupRequest
    from kafka.protocol.consumer import SyncGroupResponse as KpSyncGroupResponse
    from kafka.protocol.consumer.metadata import (
        ConsumerProtocolAssignment as KpAssignment,
    )
    from kafka.protocol.consumer.metadata import (
        ConsumerProtocolSubscription as KpSubscription,
    )
    from kafka.protocol.old.consumer_protocol import ConsumerProtocolMemberMetadata_v0
    from kafka.structs import TopicPartition

JOIN, HEARTBEAT, LEAVE, SYNC = 11, 12, 13, 14
KpTP = KpSubscription.TopicPartition


def wire_request(api_key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    """What the proxy decodes from a client that sent ``value``."""
    data = encode_request(api_key, version, value)
    decoded, end = decode_request(api_key, version, data)
    assert end == len(data)
    return decoded


def wire_response(api_key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    """What a client decodes from the response body the proxy sends."""
    data = encode_response(api_key, version, value)
    decoded, end = decode_response(api_key, version, data)
    assert end == len(data)
    return decoded


def subscription_bytes(
    version: int,
    topics: list[str],
    *,
    user_data: bytes | None = None,
    owned: list[tuple[str, list[int]]] = (),  # type: ignore[assignment]
    generation_id: int = -1,
    rack_id: str | None = None,
) -> bytes:
    return encode_data(
        SUBSCRIPTION_SCHEMA,
        version,
        {
            "topics": topics,
            "user_data": user_data,
            "owned_partitions": [{"topic": t, "partitions": ps} for t, ps in owned],
            "generation_id": generation_id,
            "rack_id": rack_id,
        },
    )


FULL = {
    "topics": ["foo", "bar"],
    "user_data": b"\x01\x02",
    "owned": [("foo", [0, 2]), ("bar", [1])],
    "generation_id": 7,
    "rack_id": "rack-a",
}


# ---- ConsumerProtocolSubscription ------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_fields_per_version(version: int) -> None:
    data = subscription_bytes(
        version,
        FULL["topics"],  # type: ignore[arg-type]
        user_data=FULL["user_data"],  # type: ignore[arg-type]
        owned=FULL["owned"],  # type: ignore[arg-type]
        generation_id=7,
        rack_id="rack-a",
    )
    sub = parse_subscription(data)
    assert sub == ClassicSubscription(
        version=version,
        topics=("foo", "bar"),
        user_data=b"\x01\x02",
        owned_partitions=((("foo", (0, 2)), ("bar", (1,)))) if version >= 1 else (),
        generation_id=7 if version >= 2 else -1,
        rack_id="rack-a" if version >= 3 else None,
    )
    assert type(sub.user_data) is bytes


def test_subscription_null_user_data_and_no_topics() -> None:
    sub = parse_subscription(subscription_bytes(1, [], user_data=None))
    assert sub == ClassicSubscription(version=1, topics=(), user_data=None)


@pytest.mark.parametrize("wire_version", [4, 9, 32767])
def test_newer_subscription_versions_are_read_as_version_3(wire_version: int) -> None:
    v3 = subscription_bytes(3, ["foo"], owned=[("foo", [1])], generation_id=3, rack_id="r")
    # A newer version appends fields: the v3 prefix is read, the rest ignored (Kafka's rule).
    data = struct.pack(">h", wire_version) + v3[2:] + b"\x00\x00\x00\x05appended"
    sub = parse_subscription(data)
    assert sub is not None
    assert (sub.version, sub.topics, sub.owned_partitions, sub.generation_id, sub.rack_id) == (
        3,
        ("foo",),
        (("foo", (1,)),),
        3,
        "r",
    )


def test_subscription_from_a_memoryview() -> None:
    data = subscription_bytes(0, ["foo"], user_data=b"ud")
    sub = parse_subscription(memoryview(bytearray(data)))
    assert sub is not None and sub.user_data == b"ud" and type(sub.user_data) is bytes


def test_subscription_from_odd_buffers() -> None:
    data = subscription_bytes(0, ["foo"], user_data=b"ud")
    strided = memoryview(bytes(b for x in data for b in (x, 0)))[::2]
    assert not strided.c_contiguous
    assert parse_subscription(strided) == ClassicSubscription(0, ("foo",), b"ud")
    # A buffer of 16-bit items is read byte by byte: here, not a subscription.
    assert parse_subscription(memoryview(array.array("h", [0, 1, 2]))) is None


V3 = subscription_bytes(3, ["foo", "bar"], user_data=b"x", owned=[("foo", [0])], rack_id="r")

MALFORMED = {
    "empty": b"",
    "one byte": b"\x00",
    "version only": b"\x00\x00",
    "negative version": b"\xff\xff" + V3[2:],
    "null topics": b"\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff",
    "null topic name": b"\x00\x00\x00\x00\x00\x01\xff\xff\xff\xff\xff\xff",
    "negative topic count": b"\x00\x00\xff\xff\xff\xfe\xff\xff\xff\xff",
    "huge topic count": b"\x00\x00\x7f\xff\xff\xff\xff\xff\xff\xff",
    "topic longer than the buffer": b"\x00\x00\x00\x00\x00\x01\x00\x10ab",
    "user data longer than the buffer": b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x09ab",
    "null owned partitions (v1)": b"\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff",
    "not bytes": "a string",
    "none": None,
}


@pytest.mark.parametrize("data", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_subscription_is_none(data: bytes) -> None:
    assert parse_subscription(data) is None


def test_every_truncation_of_a_subscription_is_malformed() -> None:
    assert parse_subscription(V3) is not None
    for n in range(len(V3)):
        assert parse_subscription(V3[:n]) is None, n


def _check_parsed(sub: ClassicSubscription | None) -> None:
    if sub is None:
        return
    assert 0 <= sub.version <= 3
    assert all(isinstance(t, str) for t in sub.topics)
    assert sub.user_data is None or type(sub.user_data) is bytes
    for topic, partitions in sub.owned_partitions:
        assert isinstance(topic, str)
        assert all(isinstance(p, int) for p in partitions)
    assert isinstance(sub.generation_id, int)
    assert sub.rack_id is None or isinstance(sub.rack_id, str)


@settings(max_examples=examples(150), deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_parse_or_are_malformed(data: bytes) -> None:
    _check_parsed(parse_subscription(data))


@settings(max_examples=examples(150), deadline=None)
@given(st.integers(-3, 6), st.binary(max_size=48))
def test_random_bodies_after_a_version_parse_or_are_malformed(version: int, body: bytes) -> None:
    _check_parsed(parse_subscription(struct.pack(">h", version) + body))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_subscriptions_parse_or_are_malformed(data: st.DataObject) -> None:
    buf = bytearray(V3)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    _check_parsed(parse_subscription(bytes(buf[:cut])))


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=3), st.integers(0, 9))
def test_join_group_with_random_metadata_never_raises(metadata: list[bytes], version: int) -> None:
    body = wire_request(
        JOIN,
        version,
        {
            "group_id": "g",
            "session_timeout_ms": 10_000,
            "member_id": "m",
            "protocol_type": "consumer",
            "protocols": [{"name": f"p{i}", "metadata": m} for i, m in enumerate(metadata)],
        },
    )
    request = join_group_request(body, version)
    assert [p.name for p in request.protocols] == [f"p{i}" for i in range(len(metadata))]
    for protocol, raw in zip(request.protocols, metadata, strict=True):
        _check_parsed(protocol.subscription)
        assert (protocol.subscription is None) == (parse_subscription(raw) is None)


# ---- kafka-python's consumer protocol --------------------------------------------------------


def _kp_bytes(obj: Any) -> bytes:
    return bytes(obj.encode())


def test_kafka_python_range_and_roundrobin_metadata() -> None:
    for assignor in (RangePartitionAssignor, RoundRobinPartitionAssignor):
        sub = parse_subscription(_kp_bytes(assignor.metadata({"foo", "bar"})))
        assert sub is not None
        assert sub.version == 0 and sorted(sub.topics) == ["bar", "foo"]
        assert sub.user_data == b"" and sub.owned_partitions == ()


def test_kafka_python_sticky_metadata_keeps_its_user_data() -> None:
    meta = StickyPartitionAssignor._metadata(
        ["foo"], [TopicPartition("foo", 2), TopicPartition("foo", 0)], 5
    )
    raw = _kp_bytes(meta)
    sub = parse_subscription(raw)
    assert sub is not None and sub.version == 0 and sub.topics == ("foo",)
    # The userData is the assignor's own blob, passed through byte for byte: kafka-python's
    # sticky assignor reads its previous assignment and generation back from it.
    assert sub.user_data is not None and raw.endswith(sub.user_data)
    member = StickyPartitionAssignor.parse_member_metadata(
        KpSubscription(version=0, topics=list(sub.topics), user_data=sub.user_data)
    )
    assert sorted(member.partitions) == [TopicPartition("foo", 0), TopicPartition("foo", 2)]
    assert member.generation == 5


def test_kafka_python_cooperative_sticky_metadata_reports_owned_partitions() -> None:
    assignor = CooperativeStickyAssignor()
    assignor.member_assignment = [
        TopicPartition("foo", 3),
        TopicPartition("bar", 0),
        TopicPartition("foo", 1),
    ]
    sub = parse_subscription(_kp_bytes(assignor.metadata({"foo", "bar"})))
    assert sub is not None and sub.version == 1
    assert sub.topics == ("bar", "foo")
    assert dict(sub.owned_partitions) == {"foo": (1, 3), "bar": (0,)}


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_kafka_python_subscription_every_version(version: int) -> None:
    kp = KpSubscription(
        version=version,
        topics=["foo", "bar"],
        user_data=b"ud",
        owned_partitions=[KpTP(topic="foo", partitions=[0, 1]), KpTP(topic="bar", partitions=[])],
        generation_id=11,
        rack_id="rack-1",
    )
    sub = parse_subscription(_kp_bytes(kp))
    assert sub == ClassicSubscription(
        version=version,
        topics=("foo", "bar"),
        user_data=b"ud",
        owned_partitions=(("foo", (0, 1)), ("bar", ())) if version >= 1 else (),
        generation_id=11 if version >= 2 else -1,
        rack_id="rack-1" if version >= 3 else None,
    )


def test_kafka_python_legacy_member_metadata_struct() -> None:
    raw = _kp_bytes(ConsumerProtocolMemberMetadata_v0(0, ["a", "b"], None))
    assert parse_subscription(raw) == ClassicSubscription(0, ("a", "b"), None)


@pytest.mark.parametrize("version", range(10))
def test_kafka_python_join_group_request_through_the_codec(version: int) -> None:
    coop = CooperativeStickyAssignor()
    coop.member_assignment = [TopicPartition("foo", 0)]
    kp = KpJoinGroupRequest(
        group_id="g",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=300_000,
        member_id="m-1",
        group_instance_id="inst" if version >= 5 else None,
        protocol_type="consumer",
        protocols=[
            ("cooperative-sticky", coop.metadata({"foo"})),
            ("range", RangePartitionAssignor.metadata({"foo"})),
        ],
        reason="rejoin" if version >= 8 else None,
    )
    body, _ = decode_request(JOIN, version, bytes(kp.encode(version=version, header=False)))
    request = join_group_request(body, version, client_id="kp", client_host="/10.0.0.1")
    assert request.group_id == "g" and request.member_id == "m-1"
    assert request.rebalance_timeout_ms == (300_000 if version >= 1 else -1)
    assert request.group_instance_id == ("inst" if version >= 5 else None)
    assert request.reason == ("rejoin" if version >= 8 else None)
    assert [p.name for p in request.protocols] == ["cooperative-sticky", "range"]
    first, second = (p.subscription for p in request.protocols)
    assert first == ClassicSubscription(1, ("foo",), b"", (("foo", (0,)),))
    assert second == ClassicSubscription(0, ("foo",), b"")


@pytest.mark.parametrize("sync_version", range(6))
@pytest.mark.parametrize("assignment_version", range(4))
def test_kafka_python_reads_the_sync_group_assignment(
    sync_version: int, assignment_version: int
) -> None:
    partitions = (("bar", (0,)), ("foo", (1, 3)))
    body = sync_group_response(
        SyncGroupResponse(
            protocol_type="consumer",
            protocol_name="range",
            assignment=ClassicAssignment(assignment_version, partitions),
        ),
        sync_version,
    )
    data = encode_response(SYNC, sync_version, body)
    kp = KpSyncGroupResponse.decode(data, version=sync_version, header=False)
    assert kp.error_code == 0
    assignment = KpAssignment.decode(bytes(kp.assignment))
    assert assignment.version == assignment_version
    assert assignment.user_data is None
    assert sorted(assignment.partitions()) == [
        TopicPartition("bar", 0),
        TopicPartition("foo", 1),
        TopicPartition("foo", 3),
    ]


# ---- JoinGroup -------------------------------------------------------------------------------


def join_body(version: int, protocols: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "group_id": "grp",
        "session_timeout_ms": 10_000,
        "member_id": "m-1",
        "protocol_type": "consumer",
        "protocols": protocols,
    }
    if version >= 1:
        value["rebalance_timeout_ms"] = 60_000
    if version >= 5:
        value["group_instance_id"] = "inst-1"
    if version >= 8:
        value["reason"] = "metadata changed"
    value.update(fields)
    return wire_request(JOIN, version, value)


COOP = subscription_bytes(1, ["foo"], owned=[("foo", [0, 1])])
RANGE = subscription_bytes(0, ["foo"], user_data=b"")


@pytest.mark.parametrize("version", range(10))
def test_join_group_request_every_version(version: int) -> None:
    body = join_body(
        version,
        [
            {"name": "cooperative-sticky", "metadata": COOP},
            {"name": "range", "metadata": RANGE},
            {"name": "broken", "metadata": b"\x00\x00\x00"},
        ],
    )
    request = join_group_request(body, version, client_id=None, client_host="/1.2.3.4")
    assert request.group_id == "grp" and request.member_id == "m-1"
    assert request.protocol_type == "consumer"
    assert request.session_timeout_ms == 10_000
    assert request.rebalance_timeout_ms == (60_000 if version >= 1 else -1)
    assert request.group_instance_id == ("inst-1" if version >= 5 else None)
    assert request.reason == ("metadata changed" if version >= 8 else None)
    assert request.api_version == version
    assert (request.client_id, request.client_host) == ("", "/1.2.3.4")
    assert list(request.protocols) == [
        ClassicProtocol(
            "cooperative-sticky", ClassicSubscription(1, ("foo",), None, (("foo", (0, 1)),))
        ),
        ClassicProtocol("range", ClassicSubscription(0, ("foo",), b"")),
        ClassicProtocol("broken", None),
    ]


@pytest.mark.parametrize("version", range(10))
def test_join_group_fields_a_version_lacks_are_ignored(version: int) -> None:
    hand_built = {
        "group_id": "g",
        "session_timeout_ms": 10_000,
        "rebalance_timeout_ms": 5_000,
        "member_id": "",
        "group_instance_id": "inst",
        "protocol_type": "consumer",
        "protocols": [],
        "reason": "why",
    }
    request = join_group_request(hand_built, version)
    assert request.rebalance_timeout_ms == (5_000 if version >= 1 else -1)
    assert request.group_instance_id == ("inst" if version >= 5 else None)
    assert request.reason == ("why" if version >= 8 else None)


def test_join_group_other_protocol_types_are_not_parsed() -> None:
    body = join_body(6, [{"name": "range", "metadata": RANGE}], protocol_type="connect")
    request = join_group_request(body, 6)
    assert request.protocol_type == "connect"
    assert list(request.protocols) == [ClassicProtocol("range", None)]
    assert classic_protocols("consumer", body["protocols"])[0].subscription is not None


def test_join_group_keeps_protocol_order_and_duplicates() -> None:
    protocols = [
        {"name": "range", "metadata": RANGE},
        {"name": "roundrobin", "metadata": RANGE},
        {"name": "range", "metadata": COOP},
    ]
    request = join_group_request(join_body(9, protocols), 9)
    assert [p.name for p in request.protocols] == ["range", "roundrobin", "range"]
    assert [p.subscription.version for p in request.protocols if p.subscription] == [0, 0, 1]


@pytest.mark.parametrize("version", range(10))
def test_join_group_response_every_version(version: int) -> None:
    response = JoinGroupResponse(
        generation_id=4,
        protocol_type="consumer",
        protocol_name="cooperative-sticky",
        member_id="m-1",
    )
    out = wire_response(JOIN, version, join_group_response(response, version))
    assert out["error_code"] == 0
    assert out["generation_id"] == 4
    assert out["protocol_name"] == "cooperative-sticky"
    assert out["protocol_type"] == ("consumer" if version >= 7 else None)
    assert out["leader"] == "" and out["members"] == []
    assert out["member_id"] == "m-1"
    assert out["skip_assignment"] is False
    assert out["throttle_time_ms"] == 0


@pytest.mark.parametrize("version", range(10))
def test_join_group_error_response_every_version(version: int) -> None:
    response = JoinGroupResponse(
        error_code=int(ErrorCode.MEMBER_ID_REQUIRED), member_id="generated", error_message="x"
    )
    body = join_group_response(response, version)
    # Before v7 the protocol name cannot be null: Kafka sends "".
    assert body["protocol_name"] == ("" if version < 7 else None)
    out = wire_response(JOIN, version, body)
    assert out["error_code"] == ErrorCode.MEMBER_ID_REQUIRED
    assert out["member_id"] == "generated"
    assert out["generation_id"] == -1
    assert out["protocol_name"] == ("" if version < 7 else None)
    assert out["protocol_type"] is None
    assert "error_message" not in body


def test_join_group_response_empty_protocol_name_is_null_from_v7() -> None:
    response = JoinGroupResponse(error_code=int(ErrorCode.UNKNOWN_MEMBER_ID), protocol_name="")
    assert join_group_response(response, 6)["protocol_name"] == ""
    assert join_group_response(response, 7)["protocol_name"] is None


# ---- SyncGroup -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(6))
def test_sync_group_request_every_version(version: int) -> None:
    value: dict[str, Any] = {
        "group_id": "grp",
        "generation_id": 3,
        "member_id": "m-1",
        "group_instance_id": "inst-1",
        "protocol_type": "consumer",
        "protocol_name": "range",
        # A follower sends none; a client that sends some anyway gets the engine's.
        "assignments": [{"member_id": "m-2", "assignment": b"\x00\x00garbage"}],
    }
    request = sync_group_request(wire_request(SYNC, version, value), version)
    assert (request.group_id, request.member_id, request.generation_id) == ("grp", "m-1", 3)
    assert request.group_instance_id == ("inst-1" if version >= 3 else None)
    assert request.protocol_type == ("consumer" if version >= 5 else None)
    assert request.protocol_name == ("range" if version >= 5 else None)
    assert request.api_version == version


@pytest.mark.parametrize("version", range(6))
@pytest.mark.parametrize("assignment_version", range(4))
def test_sync_group_response_every_version(version: int, assignment_version: int) -> None:
    assignment = ClassicAssignment(assignment_version, (("bar", (2,)), ("foo", (0, 1))))
    response = SyncGroupResponse(
        protocol_type="consumer", protocol_name="range", assignment=assignment
    )
    out = wire_response(SYNC, version, sync_group_response(response, version))
    assert out["error_code"] == 0 and out["throttle_time_ms"] == 0
    assert out["protocol_type"] == ("consumer" if version >= 5 else None)
    assert out["protocol_name"] == ("range" if version >= 5 else None)
    wire_version, decoded = decode_data(ASSIGNMENT_SCHEMA, out["assignment"])
    assert wire_version == assignment_version
    assert decoded == {
        "assigned_partitions": [
            {"topic": "bar", "partitions": [2]},
            {"topic": "foo", "partitions": [0, 1]},
        ],
        "user_data": None,
    }


@pytest.mark.parametrize("version", range(6))
def test_sync_group_error_response_has_empty_assignment(version: int) -> None:
    response = SyncGroupResponse(
        error_code=int(ErrorCode.REBALANCE_IN_PROGRESS),
        # Even if an assignment came along, an error sends none.
        assignment=ClassicAssignment(1, (("foo", (0,)),)),
    )
    out = wire_response(SYNC, version, sync_group_response(response, version))
    assert out["error_code"] == ErrorCode.REBALANCE_IN_PROGRESS
    assert out["assignment"] == b""
    assert out["protocol_type"] is None and out["protocol_name"] is None


def test_sync_group_success_without_assignment_is_an_empty_assignment() -> None:
    body = sync_group_response(SyncGroupResponse(), 5)
    assert decode_data(ASSIGNMENT_SCHEMA, body["assignment"]) == (
        0,
        {"assigned_partitions": [], "user_data": None},
    )


def test_assignment_version_is_clamped_to_the_known_versions() -> None:
    partitions = (("foo", (0,)),)
    assert (
        decode_data(ASSIGNMENT_SCHEMA, encode_assignment(ClassicAssignment(9, partitions)))[0] == 3
    )
    assert (
        decode_data(ASSIGNMENT_SCHEMA, encode_assignment(ClassicAssignment(-1, partitions)))[0] == 0
    )


def test_parse_assignment_round_trip_and_user_data() -> None:
    data = encode_data(
        ASSIGNMENT_SCHEMA,
        2,
        {"assigned_partitions": [{"topic": "foo", "partitions": [5, 1]}], "user_data": b"st"},
    )
    assignment, user_data = parse_assignment(data)
    assert assignment == ClassicAssignment(2, (("foo", (5, 1)),))
    assert user_data == b"st"
    ours = encode_assignment(ClassicAssignment(1, (("foo", (1,)),)))
    assert parse_assignment(ours) == (ClassicAssignment(1, (("foo", (1,)),)), None)


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x00\x00\x00\x00\x01", b"\xff\xff\x00"])
def test_parse_assignment_malformed_raises_bridge_error(data: bytes) -> None:
    with pytest.raises(ShapeError):
        parse_assignment(data)


@pytest.mark.parametrize("version", range(6))
def test_sync_group_fields_a_version_lacks_are_ignored(version: int) -> None:
    hand_built = {
        "group_id": "g",
        "generation_id": 1,
        "member_id": "m",
        "group_instance_id": "inst",
        "protocol_type": "consumer",
        "protocol_name": "range",
    }
    request = sync_group_request(hand_built, version)
    assert request.group_instance_id == ("inst" if version >= 3 else None)
    assert (request.protocol_type, request.protocol_name) == (
        ("consumer", "range") if version >= 5 else (None, None)
    )


@settings(max_examples=examples(100), deadline=None)
@given(st.binary(max_size=48))
def test_random_assignment_bytes_parse_or_raise_bridge_error(data: bytes) -> None:
    try:
        assignment, user_data = parse_assignment(data)
    except ShapeError:
        return
    assert 0 <= assignment.version <= 3
    assert user_data is None or type(user_data) is bytes
    assert all(isinstance(t, str) for t, _ in assignment.partitions)


# ---- Heartbeat -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(5))
def test_heartbeat_round_trip_every_version(version: int) -> None:
    value = {"group_id": "grp", "generation_id": 9, "member_id": "m-1", "group_instance_id": "i"}
    request = heartbeat_request(wire_request(HEARTBEAT, version, value), version)
    assert (request.group_id, request.member_id, request.generation_id) == ("grp", "m-1", 9)
    assert request.group_instance_id == ("i" if version >= 3 else None)
    assert request.api_version == version
    response = HeartbeatResponse(error_code=int(ErrorCode.REBALANCE_IN_PROGRESS), error_message="x")
    body = heartbeat_response(response, version)
    assert "error_message" not in body
    out = wire_response(HEARTBEAT, version, body)
    assert out["error_code"] == ErrorCode.REBALANCE_IN_PROGRESS
    assert out["throttle_time_ms"] == 0


@pytest.mark.parametrize("version", range(5))
def test_heartbeat_fields_a_version_lacks_are_ignored(version: int) -> None:
    hand_built = {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": "i"}
    request = heartbeat_request(hand_built, version)
    assert request.group_instance_id == ("i" if version >= 3 else None)


# ---- LeaveGroup ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(3))
def test_leave_group_single_member_versions(version: int) -> None:
    request = leave_group_request(
        wire_request(LEAVE, version, {"group_id": "grp", "member_id": "m-1"}), version
    )
    assert request.group_id == "grp" and request.api_version == version
    assert list(request.members) == [LeavingMember("m-1")]
    response = LeaveGroupResponse(
        members=[LeavingMemberResponse("m-1", None, int(ErrorCode.UNKNOWN_MEMBER_ID))]
    )
    out = wire_response(LEAVE, version, leave_group_response(response, version))
    # The member's error is the top-level one (Kafka's LeaveGroupResponse before v3).
    assert out["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID
    assert out["members"] == []


@pytest.mark.parametrize("version", range(3, 6))
def test_leave_group_batch_versions(version: int) -> None:
    value = {
        "group_id": "grp",
        "members": [
            {"member_id": "m-1", "group_instance_id": None, "reason": "shutdown"},
            {"member_id": "", "group_instance_id": "inst-2", "reason": "admin"},
        ],
    }
    request = leave_group_request(wire_request(LEAVE, version, value), version)
    reasons = ("shutdown", "admin") if version >= 5 else (None, None)
    assert list(request.members) == [
        LeavingMember("m-1", None, reasons[0]),
        LeavingMember("", "inst-2", reasons[1]),
    ]
    response = LeaveGroupResponse(
        members=[
            LeavingMemberResponse("m-1", None),
            LeavingMemberResponse("", "inst-2", int(ErrorCode.UNKNOWN_MEMBER_ID)),
        ]
    )
    out = wire_response(LEAVE, version, leave_group_response(response, version))
    assert out["error_code"] == 0
    assert out["members"] == [
        {"member_id": "m-1", "group_instance_id": None, "error_code": 0},
        {"member_id": "", "group_instance_id": "inst-2", "error_code": 25},
    ]


def test_leave_group_empty_batch_and_top_level_error() -> None:
    request = leave_group_request(wire_request(LEAVE, 4, {"group_id": "grp", "members": []}), 4)
    assert list(request.members) == []
    response = LeaveGroupResponse(error_code=int(ErrorCode.UNKNOWN_MEMBER_ID))
    for version in range(6):
        out = wire_response(LEAVE, version, leave_group_response(response, version))
        assert out["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID
        assert out["members"] == []


@pytest.mark.parametrize("version", range(6))
def test_leave_group_fields_a_version_lacks_are_ignored(version: int) -> None:
    hand_built = {
        "group_id": "g",
        "member_id": "old-style",
        "members": [{"member_id": "m", "group_instance_id": "i", "reason": "r"}],
    }
    request = leave_group_request(hand_built, version)
    if version < 3:
        assert list(request.members) == [LeavingMember("old-style")]
    else:
        assert list(request.members) == [LeavingMember("m", "i", "r" if version >= 5 else None)]


# ---- shape errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "version"),
    [
        (lambda v: join_group_request({}, v), 10),
        (lambda v: join_group_request({}, v), -1),
        (lambda v: sync_group_request({}, v), 6),
        (lambda v: heartbeat_request({}, v), 5),
        (lambda v: leave_group_request({}, v), 6),
        (lambda v: join_group_response(JoinGroupResponse(), v), 10),
        (lambda v: sync_group_response(SyncGroupResponse(), v), 6),
        (lambda v: heartbeat_response(HeartbeatResponse(), v), 5),
        (lambda v: leave_group_response(LeaveGroupResponse(), v), 6),
    ],
)
def test_unsupported_versions_raise_bridge_error(call: Any, version: int) -> None:
    with pytest.raises(ShapeError, match="not supported"):
        call(version)


BAD_SHAPES = {
    "missing key": ({"group_id": "g", "member_id": "m", "protocol_type": "consumer"}, "missing"),
    "wrong type": (
        {
            "group_id": 1,
            "session_timeout_ms": 1,
            "member_id": "m",
            "protocol_type": "consumer",
            "protocols": [],
        },
        "not a string",
    ),
    "protocols not a list": (
        {
            "group_id": "g",
            "session_timeout_ms": 1,
            "member_id": "m",
            "protocol_type": "consumer",
            "protocols": "range",
        },
        "expected a list",
    ),
    "protocol not a dict": (
        {
            "group_id": "g",
            "session_timeout_ms": 1,
            "member_id": "m",
            "protocol_type": "consumer",
            "protocols": [("range", b"")],
        },
        "expected a dict",
    ),
    "bool timeout": (
        {
            "group_id": "g",
            "session_timeout_ms": True,
            "member_id": "m",
            "protocol_type": "consumer",
            "protocols": [],
        },
        "not an integer",
    ),
}


@pytest.mark.parametrize(("value", "message"), list(BAD_SHAPES.values()), ids=list(BAD_SHAPES))
def test_bad_request_shapes_raise_bridge_error(value: dict[str, Any], message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        join_group_request(value, 9)


def test_bad_leave_member_shape_raises_bridge_error() -> None:
    with pytest.raises(ShapeError, match=r"members\[0\]"):
        leave_group_request({"group_id": "g", "members": [{"group_instance_id": "i"}]}, 3)


# ---- through the engine ----------------------------------------------------------------------


def test_join_sync_heartbeat_leave_through_the_engine() -> None:
    assignor = ScriptedAssignor("range")
    c = Classic.of(image(foo=(FOO, 4), bar=(BAR, 2)), assignor, member_id_factory=lambda: "m-1")
    assignor.next = target(**{"m-1": {FOO: [0, 2], BAR: [1]}})
    sub = KpSubscription(version=2, topics=["foo", "bar"], user_data=b"", generation_id=-1)

    # v3: no MEMBER_ID_REQUIRED round; a kafka-python subscription at version 2.
    join_body_v3 = wire_request(
        JOIN,
        3,
        {
            "group_id": "grp",
            "session_timeout_ms": 10_000,
            "rebalance_timeout_ms": 30_000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": _kp_bytes(sub)}],
        },
    )
    joined, _ = c.classic.join_group(join_group_request(join_body_v3, 3, client_id="c"), 0)
    assert joined is not None and joined.error_code == 0
    join_out = wire_response(JOIN, 3, join_group_response(joined, 3))
    assert join_out["member_id"] == "m-1" and join_out["protocol_name"] == "range"
    generation = join_out["generation_id"]
    assert generation == c.engine.groups["grp"].members["m-1"].member_epoch

    sync_body = wire_request(
        SYNC, 2, {"group_id": "grp", "generation_id": generation, "member_id": "m-1"}
    )
    synced, _ = c.classic.sync_group(sync_group_request(sync_body, 2), 0)
    assert synced.error_code == 0 and synced.assignment is not None
    sync_out = wire_response(SYNC, 2, sync_group_response(synced, 2))
    wire_version, decoded = decode_data(ASSIGNMENT_SCHEMA, sync_out["assignment"])
    # At the subscription's version, exactly the engine's partitions, no userData.
    assert wire_version == 2 == synced.assignment.version
    assert [(tp["topic"], tp["partitions"]) for tp in decoded["assigned_partitions"]] == [
        (t, list(ps)) for t, ps in synced.assignment.partitions
    ]
    assert dict(synced.assignment.partitions) == {"bar": [1], "foo": [0, 2]}
    assert decoded["user_data"] is None

    beat_body = wire_request(
        HEARTBEAT, 1, {"group_id": "grp", "generation_id": generation, "member_id": "m-1"}
    )
    beat, _ = c.classic.heartbeat(heartbeat_request(beat_body, 1), 0)
    assert wire_response(HEARTBEAT, 1, heartbeat_response(beat, 1))["error_code"] == 0
    stale = heartbeat_request(dict(beat_body, generation_id=generation - 1), 1)
    beat, _ = c.classic.heartbeat(stale, 0)
    assert heartbeat_response(beat, 1)["error_code"] == ErrorCode.ILLEGAL_GENERATION

    leave_body = wire_request(
        LEAVE, 5, {"group_id": "grp", "members": [{"member_id": "m-1"}, {"member_id": "zz"}]}
    )
    left, _ = c.classic.leave_group(leave_group_request(leave_body, 5), 0)
    leave_out = wire_response(LEAVE, 5, leave_group_response(left, 5))
    assert [(m["member_id"], m["error_code"]) for m in leave_out["members"]] == [
        ("m-1", 0),
        ("zz", ErrorCode.UNKNOWN_MEMBER_ID),
    ]


@pytest.mark.parametrize("metadata", [b"", b"\x00\x00\x00\x00\x00\x01\x00\x09foo"])
def test_malformed_subscription_gets_inconsistent_group_protocol_from_the_engine(
    metadata: bytes,
) -> None:
    assignor = ScriptedAssignor("range")
    c = Classic.of(image(foo=(FOO, 4)), assignor)
    ok = join_group_request(join_body(9, [{"name": "range", "metadata": RANGE}], member_id=""), 9)
    first, _ = c.classic.join_group(ok, 0)
    assert first is not None and first.error_code == 0
    body = join_body(
        9, [{"name": "range", "metadata": metadata}], member_id="m-2", group_instance_id="inst-2"
    )
    request = join_group_request(body, 9)
    assert request.protocols[0].subscription is None
    response, _ = c.classic.join_group(request, 0)
    assert response is not None
    assert response.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    out = wire_response(JOIN, 9, join_group_response(response, 9))
    assert out["error_code"] == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
