"""The durable state records (translation.records): keys and values round-trip through bytes,
equal keys are equal bytes, tombstones stay tombstones, and what this code cannot read (an
unknown kind, a newer version, a malformed body, a value under the wrong key) is refused with
RecordError, never another exception."""

from __future__ import annotations

import json
import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from translation.classic.member import ClassicMemberState
from translation.member import MemberProtocol, MemberState
from translation.records import (
    VALUE_VERSION,
    AssignmentValue,
    ClassicMemberValue,
    GroupValue,
    MemberValue,
    RecordError,
    RecordKey,
    RecordKind,
    StateRecord,
    check_record,
    decode_key,
    decode_record,
    decode_value,
    encode_key,
    encode_record,
    encode_value,
    fold,
    key_group_id,
)

T1 = uuid.UUID(int=0xF00)
T2 = uuid.UUID(int=0xBA2)

GROUP = GroupValue(7, 6, "uniform", ((T2, 3), (T1, 6)), None)
EMPTY_GROUP = GroupValue(9, 9, "range", (), 1_700_000_000_123)
MEMBER = MemberValue(
    instance_id="pod-1", rack_id="rack-a", client_id="consumer-1", client_host="/10.0.0.1",
    subscribed_topic_names=("bar", "foo"), subscribed_topic_regex="foo.*",
    server_assignor="uniform", rebalance_timeout_ms=300_000, session_timeout_ms=None,
    protocol=MemberProtocol.CONSUMER, classic=None)
CLASSIC_MEMBER = MemberValue(
    instance_id=None, rack_id=None, client_id="", client_host="", subscribed_topic_names=(),
    subscribed_topic_regex=None, server_assignor=None, rebalance_timeout_ms=60_000,
    session_timeout_ms=10_000, protocol=MemberProtocol.CLASSIC,
    classic=ClassicMemberValue(10_000, ("range", "cooperative-sticky"), 3, b"\x00\xffdata"))
ASSIGNMENT = AssignmentValue(
    member_epoch=6, previous_member_epoch=5, state=MemberState.UNREVOKED_PARTITIONS,
    assigned=((T2, ((0, 4), (1, 6))),), pending_revocation=((T1, ((2, 3),)),),
    target=((T2, (0, 1, 2)),))
CLASSIC_ASSIGNMENT = AssignmentValue(
    member_epoch=6, previous_member_epoch=6, state=MemberState.STABLE, assigned=(),
    pending_revocation=(), target=None, classic_state=ClassicMemberState.COMPLETING_REBALANCE,
    classic_generation=5)

RECORDS = [
    StateRecord(RecordKey(RecordKind.GROUP, "g"), GROUP),
    StateRecord(RecordKey(RecordKind.GROUP, "empty"), EMPTY_GROUP),
    StateRecord(RecordKey(RecordKind.MEMBER, "g", "m1"), MEMBER),
    StateRecord(RecordKey(RecordKind.MEMBER, "g", "c1"), CLASSIC_MEMBER),
    StateRecord(RecordKey(RecordKind.ASSIGNMENT, "g", "m1"), ASSIGNMENT),
    StateRecord(RecordKey(RecordKind.ASSIGNMENT, "g", "c1"), CLASSIC_ASSIGNMENT),
    StateRecord(RecordKey(RecordKind.ASSIGNMENT, "g", "gone"), None),
    StateRecord(RecordKey(RecordKind.MEMBER, "g", "gone"), None),
    StateRecord(RecordKey(RecordKind.GROUP, "deleted"), None),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{r.key.kind.name}-{r.key.member_id}")
def test_every_kind_round_trips_through_bytes(record: StateRecord) -> None:
    key, value = encode_record(record)
    assert isinstance(key, bytes)
    assert (value is None) == (record.value is None)
    assert decode_record(key, value) == record


def test_a_value_starts_with_its_version_and_is_json_after_it() -> None:
    data = encode_value(ASSIGNMENT)
    assert data is not None
    assert struct.unpack_from(">h", data)[0] == VALUE_VERSION
    fields = json.loads(data[2:])
    assert fields[0] == 6 and fields[2] == "unrevoked_partitions"
    assert fields[3] == [[T2.hex, [0, 4, 1, 6]]]  # flat partition, epoch pairs


def test_equal_keys_are_equal_bytes_and_kinds_never_collide() -> None:
    keys = [RecordKey(RecordKind.GROUP, "g"), RecordKey(RecordKind.MEMBER, "g", "m"),
            RecordKey(RecordKind.ASSIGNMENT, "g", "m"), RecordKey(RecordKind.MEMBER, "gm", ""),
            RecordKey(RecordKind.MEMBER, "g", "m2")]
    encoded = [encode_key(k) for k in keys]
    assert len(set(encoded)) == len(keys)
    assert encode_key(RecordKey(RecordKind.MEMBER, "g", "m")) == encoded[1]


@given(st.text(min_size=1, max_size=40), st.text(max_size=40),
       st.sampled_from([RecordKind.MEMBER, RecordKind.ASSIGNMENT]))
def test_any_ids_round_trip_in_keys(group_id: str, member_id: str, kind: RecordKind) -> None:
    key = RecordKey(kind, group_id, member_id)
    assert decode_key(encode_key(key)) == key


def test_a_key_names_its_group() -> None:
    assert key_group_id(encode_key(RecordKey(RecordKind.ASSIGNMENT, "orders", "m1"))) == "orders"
    with pytest.raises(ValueError):
        key_group_id(b"\x00\x07")


def test_an_unknown_kind_is_refused_cleanly() -> None:
    data = struct.pack(">h", 42) + encode_key(RecordKey(RecordKind.GROUP, "g"))[2:]
    with pytest.raises(RecordError, match="unknown record kind 42"):
        decode_key(data)


def test_a_newer_value_version_is_refused_with_both_versions_named() -> None:
    data = encode_value(GROUP)
    assert data is not None
    newer = struct.pack(">h", VALUE_VERSION + 1) + data[2:]
    with pytest.raises(RecordError, match=f"version {VALUE_VERSION + 1}.*1 to {VALUE_VERSION}"):
        decode_value(RecordKind.GROUP, newer)
    with pytest.raises(RecordError, match="version 0"):
        decode_value(RecordKind.GROUP, struct.pack(">h", 0) + data[2:])


@pytest.mark.parametrize("body", [
    b"", b"\x00", b"\x00\x01", b"\x00\x01not json", b"\x00\x01[1,2]", b"\x00\x01{}",
    b"\x00\x01[7,6,\"uniform\",[[\"zz\",3]],null]", b"\x00\x01[7,6,3,[],null]",
    b"\x00\x01[7,6.5,\"uniform\",[],null]", b"\x00\x01[true,6,\"uniform\",[],null]",
    b"\x00\x01\xff\xfe",
])
def test_a_malformed_group_value_is_refused_cleanly(body: bytes) -> None:
    with pytest.raises(RecordError):
        decode_value(RecordKind.GROUP, body)


def test_malformed_member_and_assignment_values_are_refused_cleanly() -> None:
    member = encode_value(CLASSIC_MEMBER)
    assignment = encode_value(ASSIGNMENT)
    assert member is not None and assignment is not None
    bad_state = assignment.replace(b"unrevoked_partitions", b"dancing")
    odd_pairs = assignment.replace(b"[0,4,1,6]", b"[0,4,1]")
    bad_base64 = member.replace(b"AP9kYXRh", b"!!!!")
    for kind, data in [(RecordKind.ASSIGNMENT, bad_state), (RecordKind.ASSIGNMENT, odd_pairs),
                       (RecordKind.MEMBER, bad_base64), (RecordKind.MEMBER, assignment),
                       (RecordKind.ASSIGNMENT, member)]:
        with pytest.raises(RecordError):
            decode_value(kind, data)


@pytest.mark.parametrize("data", [b"", b"\x00\x01", b"\x00\x01\x00\x00\x00\x05ab",
                                  encode_key(RecordKey(RecordKind.GROUP, "g")) + b"x",
                                  b"\x00\x02\x00\x00\x00\x01g"])
def test_a_malformed_key_is_refused_cleanly(data: bytes) -> None:
    with pytest.raises(RecordError):
        decode_key(data)


def test_a_value_under_the_wrong_kind_of_key_is_refused() -> None:
    with pytest.raises(RecordError):
        encode_record(StateRecord(RecordKey(RecordKind.MEMBER, "g", "m"), ASSIGNMENT))
    with pytest.raises(RecordError):
        check_record(StateRecord(RecordKey(RecordKind.GROUP, "g", "m"), GROUP))
    with pytest.raises(RecordError):
        check_record(StateRecord(RecordKey(RecordKind.ASSIGNMENT, "g"), None))


def test_fold_keeps_the_last_value_of_each_key_and_drops_tombstoned_keys() -> None:
    key = RecordKey(RecordKind.ASSIGNMENT, "g", "m1")
    later = AssignmentValue(7, 6, MemberState.STABLE, (), (), ())
    folded = fold([StateRecord(key, ASSIGNMENT), RECORDS[0], StateRecord(key, None),
                   StateRecord(key, later), StateRecord(RecordKey(RecordKind.GROUP, "g"), None)])
    assert folded == {key: later}
