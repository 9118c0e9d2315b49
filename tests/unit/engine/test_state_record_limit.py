"""Members whose state record would not fit the state log (``GroupConfig.max_state_record_bytes``,
:func:`translation.limits.check_member_record`): refused before they are admitted or changed,
in both protocols, with the group, the other members and the member's own earlier state left as
they were; the limit measured exactly as the drained record; no limit without one."""

from __future__ import annotations

from dataclasses import replace

from translation.classic.coordinator import ClassicGroupCoordinator
from translation.classic.messages import JoinGroupResponse
from translation.classic.routing import classify_classic_join
from translation.coordinator import GroupCoordinator
from translation.effects import MemberTooLarge
from translation.errors import ErrorCode
from translation.records import RecordKind, StateRecord, record_bytes

from .classic.helpers import Classic, join_req, subscription
from .helpers import FOO, ScriptedAssignor, hb, image, join, make_engine

G = "g"
WALL = 1_700_000_000_000
LIMIT = 64 * 1024
TOPICS = image(foo=(FOO, 6))
HUGE = [f"topic-{i:05d}-" + "x" * 200 for i in range(400)]
"""400 legal topic names of 212 characters: about 86 KB of member record."""


def engine(limit: int | None = LIMIT) -> GroupCoordinator:
    return make_engine(TOPICS, ScriptedAssignor(), durable_state=True,
                       max_state_record_bytes=limit)


def member_record(records: list[StateRecord], member_id: str) -> StateRecord:
    (record,) = [r for r in records
                 if r.key.kind is RecordKind.MEMBER and r.key.member_id == member_id]
    return record


def test_a_joining_member_too_large_for_the_log_is_refused_and_nothing_changes() -> None:
    e = engine()
    ok, _ = e.heartbeat(join(G, "m1"), 0)
    assert ok.error_code == 0
    e.drain_records(WALL)
    epoch = e.groups[G].group_epoch

    refused, effects = e.heartbeat(join(G, "big", topics=HUGE), 10)

    assert refused.error_code == ErrorCode.INVALID_REQUEST
    assert refused.error_message is not None and str(LIMIT) in refused.error_message
    assert "400 subscribed topic names" in refused.error_message
    (too_large,) = [x for x in effects if isinstance(x, MemberTooLarge)]
    assert too_large.api == "consumer-group-heartbeat" and too_large.limit == LIMIT
    assert too_large.record_bytes > LIMIT and too_large.group_id == G
    group = e.groups[G]
    assert set(group.members) == {"m1"} and group.group_epoch == epoch
    assert e.drain_records(WALL) == []  # nothing to write: the group's writes go on
    # the member that was there goes on undisturbed
    again, _ = e.heartbeat(hb(G, "m1", ok.member_epoch, {}), 20)
    assert again.error_code == 0


def test_a_refused_join_creates_no_group() -> None:
    e = engine()
    refused, _ = e.heartbeat(join(G, "big", topics=HUGE), 0)
    assert refused.error_code == ErrorCode.INVALID_REQUEST
    assert G not in e.groups and e.drain_records(WALL) == []


def test_a_member_s_change_that_would_not_fit_is_refused_and_its_state_kept() -> None:
    e = engine()
    joined, _ = e.heartbeat(join(G, "m1"), 0)
    e.heartbeat(hb(G, "m1", joined.member_epoch, {}), 5)
    e.drain_records(WALL)
    member = e.groups[G].members["m1"]
    before = (member.subscribed_topic_names, member.member_epoch, dict(member.assigned),
              e.groups[G].group_epoch)

    refused, effects = e.heartbeat(hb(G, "m1", joined.member_epoch, None,
                                      subscribed_topic_names=HUGE), 10)

    assert refused.error_code == ErrorCode.INVALID_REQUEST
    assert any(isinstance(x, MemberTooLarge) for x in effects)
    member = e.groups[G].members["m1"]
    assert (member.subscribed_topic_names, member.member_epoch, dict(member.assigned),
            e.groups[G].group_epoch) == before
    assert e.drain_records(WALL) == []
    steady, _ = e.heartbeat(hb(G, "m1", joined.member_epoch, None), 20)
    assert steady.error_code == 0 and steady.member_epoch == joined.member_epoch


def test_a_huge_rack_id_counts_too() -> None:
    e = engine()
    joined, _ = e.heartbeat(join(G, "m1"), 0)
    refused, _ = e.heartbeat(hb(G, "m1", joined.member_epoch, None, rack_id="r" * LIMIT), 10)
    assert refused.error_code == ErrorCode.INVALID_REQUEST
    assert e.groups[G].members["m1"].rack_id is None


def test_the_limit_is_the_drained_record_s_size_exactly() -> None:
    """A member whose record is exactly the limit joins; one byte less and it is refused."""
    probe = engine(limit=None)
    request = join(G, "m1", topics=HUGE[:50])
    probe.heartbeat(request, 0)
    size = record_bytes(member_record(probe.drain_records(WALL), "m1"))

    refused, _ = engine(limit=size - 1).heartbeat(request, 0)
    assert refused.error_code == ErrorCode.INVALID_REQUEST
    at_limit = engine(limit=size)
    accepted, _ = at_limit.heartbeat(request, 0)
    assert accepted.error_code == 0
    assert record_bytes(member_record(at_limit.drain_records(WALL), "m1")) == size

    # a later heartbeat changing the rack: sized as the record it leaves
    changed = hb(G, "m1", accepted.member_epoch, None, rack_id="rack-1")
    probe.heartbeat(changed, 10)
    grown = record_bytes(member_record(probe.drain_records(WALL), "m1"))
    refused, _ = at_limit.heartbeat(replace(changed), 10)
    assert grown > size and refused.error_code == ErrorCode.INVALID_REQUEST


def test_without_a_limit_any_member_is_admitted() -> None:
    e = engine(limit=None)
    response, _ = e.heartbeat(join(G, "big", topics=HUGE), 0)
    assert response.error_code == 0


# ------------------------------------------------------------------------------ classic

def classic(limit: int | None = LIMIT) -> Classic:
    c = Classic.of(TOPICS, ScriptedAssignor(), durable_state=True,
                   max_state_record_bytes=limit)
    return c


def with_user_data(member_id: str, user_data: bytes) -> object:
    request = join_req(member_id)
    protocol = request.protocols[0]
    sub = subscription(user_data=user_data)
    return replace(request, protocols=[replace(protocol, subscription=sub)])


def test_a_classic_member_with_userdata_too_large_is_refused_invalid_request() -> None:
    c = classic()
    c.joined(join_req("m1"))
    c.engine.drain_records(WALL)
    epoch = c.engine.groups["grp"].group_epoch

    response, effects = c.classic.join_group(with_user_data("big", b"u" * LIMIT), 10)  # type: ignore[arg-type]

    assert isinstance(response, JoinGroupResponse)
    assert response.error_code == ErrorCode.INVALID_REQUEST
    (too_large,) = [x for x in effects if isinstance(x, MemberTooLarge)]
    assert too_large.api == "join-group" and too_large.limit == LIMIT
    group = c.engine.groups["grp"]
    assert set(group.members) == {"m1"} and group.group_epoch == epoch
    assert c.engine.drain_records(WALL) == []


def test_a_classic_member_rejoining_with_too_much_is_refused_and_keeps_its_state() -> None:
    c = classic()
    first = c.joined(join_req("m1"))
    c.engine.drain_records(WALL)
    member = c.engine.groups["grp"].members["m1"]
    meta = member.classic
    assert meta is not None
    before = (member.subscribed_topic_names, member.member_epoch, meta.user_data,
              meta.state, c.engine.groups["grp"].group_epoch)

    response, _ = c.classic.join_group(join_req("m1", topics=HUGE), 10)

    assert isinstance(response, JoinGroupResponse)
    assert response.error_code == ErrorCode.INVALID_REQUEST
    member = c.engine.groups["grp"].members["m1"]
    assert member.classic is not None
    assert (member.subscribed_topic_names, member.member_epoch, member.classic.user_data,
            member.classic.state, c.engine.groups["grp"].group_epoch) == before
    assert c.engine.drain_records(WALL) == []
    assert c.beat("m1", first.generation_id) == ErrorCode.NONE


def test_a_classic_join_at_the_limit_is_admitted_one_byte_over_is_not() -> None:
    request = with_user_data("m1", b"u" * 1000)
    probe = classic(limit=None)
    probe.joined(request)  # type: ignore[arg-type]
    size = record_bytes(member_record(probe.engine.drain_records(WALL), "m1"))
    refused, _ = classic(limit=size - 1).classic.join_group(request, 0)  # type: ignore[arg-type]
    assert isinstance(refused, JoinGroupResponse)
    assert refused.error_code == ErrorCode.INVALID_REQUEST
    classic(limit=size).joined(request)  # type: ignore[arg-type]


def test_a_classic_join_too_large_for_a_group_nobody_serves_goes_to_the_broker() -> None:
    e = engine()
    ClassicGroupCoordinator(e)
    big = join_req("", topics=HUGE)
    routing = classify_classic_join(e, big)
    assert not routing.to_engine and str(LIMIT) in routing.reason
    assert classify_classic_join(e, join_req("")).to_engine
