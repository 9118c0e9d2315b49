"""ConsumerGroupHeartbeat: validation, errors, fencing, null-means-unchanged, group size,
when the response carries the assignment, leaving, assignor selection."""

from __future__ import annotations

from dataclasses import replace

import pytest

from translation.effects import (
    GroupCreated,
    GroupEmptied,
    GroupEpochBumped,
    MemberLeft,
    TimerArmed,
)
from translation.errors import ErrorCode
from translation.group import GroupState
from translation.heartbeat import ConsumerGroupHeartbeatRequest
from translation.member import MemberState
from translation.timers import TimerKind

from .helpers import (
    BAR,
    FOO,
    ScriptedAssignor,
    assignment,
    hb,
    image,
    join,
    make_engine,
    parts,
    target,
)

G = "g"


def engine_with(*names: str, **kwargs: object):  # type: ignore[no-untyped-def]
    assignors = [ScriptedAssignor(n) for n in (names or ("scripted",))]
    return make_engine(image(foo=(FOO, 4), bar=(BAR, 2)), *assignors, **kwargs), assignors


def code(resp) -> ErrorCode:  # type: ignore[no-untyped-def]
    return ErrorCode(resp.error_code)


JOIN = join(G, "m1")


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        (replace(JOIN, member_id=""), ErrorCode.INVALID_REQUEST),
        (replace(JOIN, member_id="  "), ErrorCode.INVALID_REQUEST),
        (replace(JOIN, group_id=" "), ErrorCode.INVALID_REQUEST),
        (replace(JOIN, instance_id=""), ErrorCode.INVALID_REQUEST),
        (replace(JOIN, rack_id=" "), ErrorCode.INVALID_REQUEST),
        (replace(JOIN, rebalance_timeout_ms=-1), ErrorCode.INVALID_REQUEST),
        (replace(JOIN, topic_partitions=None), ErrorCode.INVALID_REQUEST),
        (replace(JOIN, topic_partitions=[(FOO, [0])]), ErrorCode.INVALID_REQUEST),
        (
            replace(JOIN, subscribed_topic_names=None, subscribed_topic_regex=None),
            ErrorCode.INVALID_REQUEST,
        ),
        (hb(G, "m1", -2), ErrorCode.INVALID_REQUEST),
        (hb(G, "m1", -3), ErrorCode.INVALID_REQUEST),
        (hb(G, "", -1), ErrorCode.INVALID_REQUEST),
        (replace(JOIN, server_assignor="nope"), ErrorCode.UNSUPPORTED_ASSIGNOR),
        (replace(JOIN, subscribed_topic_regex="("), ErrorCode.INVALID_REGULAR_EXPRESSION),
        (hb(G, "m1", 3), ErrorCode.GROUP_ID_NOT_FOUND),
    ],
)
def test_invalid_requests(request_: ConsumerGroupHeartbeatRequest, expected: ErrorCode) -> None:
    engine, _ = engine_with()
    resp, effects = engine.heartbeat(request_, 0)
    assert code(resp) is expected
    assert resp.error_message
    assert engine.groups == {} and effects == []


def test_join_with_empty_names_or_empty_regex_is_allowed() -> None:
    engine, _ = engine_with()
    resp, _ = engine.heartbeat(replace(JOIN, subscribed_topic_names=[]), 0)
    assert code(resp) is ErrorCode.NONE
    resp, _ = engine.heartbeat(
        replace(join(G, "m2"), subscribed_topic_names=None, subscribed_topic_regex=""), 0
    )
    assert code(resp) is ErrorCode.NONE


def test_v0_join_without_member_id_gets_one_generated() -> None:
    engine, _ = engine_with(member_id_factory=lambda: "generated-1")
    resp, _ = engine.heartbeat(replace(JOIN, member_id="", api_version=0), 0)
    assert (code(resp), resp.member_id, resp.member_epoch) == (ErrorCode.NONE, "generated-1", 1)


def test_join_creates_group_and_answers_with_assignment() -> None:
    engine, (a,) = engine_with()
    a.next = target(m1={FOO: [0, 1]})
    resp, effects = engine.heartbeat(JOIN, 0)
    assert (resp.member_id, resp.member_epoch, resp.heartbeat_interval_ms) == ("m1", 1, 5000)
    assert assignment(resp) == {FOO: [0, 1]}
    assert GroupCreated(G) in effects
    assert any(isinstance(e, GroupEpochBumped) and e.group_epoch == 1 for e in effects)
    assert any(isinstance(e, TimerArmed) and e.key.kind is TimerKind.SESSION for e in effects)


def test_unknown_member_with_nonzero_epoch() -> None:
    engine, _ = engine_with()
    engine.heartbeat(JOIN, 0)
    resp, _ = engine.heartbeat(hb(G, "stranger", 1), 1)
    assert code(resp) is ErrorCode.UNKNOWN_MEMBER_ID


def test_member_epoch_fencing_and_the_lost_response_rule() -> None:
    engine, (a,) = engine_with()
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(JOIN, 0)  # m1 at epoch 1 with foo-0, foo-1
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2]})
    engine.heartbeat(join(G, "m2"), 1)
    resp, _ = engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 2)
    assert resp.member_epoch == 2  # m1 moved to epoch 2; assume this response is lost
    m1 = engine.groups[G].members["m1"]
    assert (m1.member_epoch, m1.previous_member_epoch) == (2, 1)

    # Greater epoch: fenced.
    assert (
        code(engine.heartbeat(hb(G, "m1", 3, {FOO: [0, 1]}), 3)[0]) is ErrorCode.FENCED_MEMBER_EPOCH
    )
    # Previous epoch with partitions it does not have: fenced.
    assert (
        code(engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1, 2]}), 3)[0])
        is ErrorCode.FENCED_MEMBER_EPOCH
    )
    # Previous epoch with a subset of its assignment: the lost-response case, accepted.
    resp, _ = engine.heartbeat(hb(G, "m1", 1, {FOO: [0]}), 3)
    assert (code(resp), resp.member_epoch) == (ErrorCode.NONE, 2)


def test_previous_epoch_without_owned_partitions_after_an_epoch_bump() -> None:
    """librdkafka gave up on a heartbeat the coordinator still processed (it moved the member
    from epoch 1 to 2 and changed nothing else: another member joined); the next one comes at
    epoch 1 with owned partitions null. Accepted as a lost response: the current epoch and the
    whole assignment."""
    engine, (a,) = engine_with()
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(JOIN, 0)  # m1 at epoch 1 with foo-0, foo-1
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]})
    engine.heartbeat(join(G, "m2"), 1)  # group epoch 2
    group = engine.groups[G]
    resp, _ = engine.heartbeat(hb(G, "m1", 1), 2)  # the heartbeat given up on
    m1 = group.members["m1"]
    assert (resp.member_epoch, m1.previous_member_epoch, parts(m1)) == (2, 1, {FOO: [0, 1]})

    resp, _ = engine.heartbeat(hb(G, "m1", 1), 3)  # the next one, owned null
    assert (code(resp), resp.member_epoch) == (ErrorCode.NONE, 2)
    assert assignment(resp) == {FOO: [0, 1]}
    assert [group.owners.owner(FOO, p) for p in range(4)] == ["m1", "m1", "m2", "m2"]
    # a repeat of it too; the current epoch goes on as ever
    assert engine.heartbeat(hb(G, "m1", 1), 4)[0].member_epoch == 2
    assert engine.heartbeat(hb(G, "m1", 2), 5)[0].assignment is None
    # owning what it is not assigned is fenced, null or not
    resp, _ = engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 2]}), 6)
    assert code(resp) is ErrorCode.FENCED_MEMBER_EPOCH


def test_previous_epoch_without_owned_partitions_after_a_move_that_revoked_is_fenced() -> None:
    """The move from epoch 1 to 2 revoked foo-1, now given to m2: a heartbeat at epoch 1
    that does not say what it owns may come from a member still owning foo-1, and is fenced
    (reporting owned partitions all assigned to it is Kafka's lost-response case)."""
    engine, (a,) = engine_with()
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(JOIN, 0)
    a.next = target(m1={FOO: [0]}, m2={FOO: [1]})
    engine.heartbeat(join(G, "m2"), 1)  # group epoch 2; m2 waits for foo-1
    group = engine.groups[G]
    engine.heartbeat(hb(G, "m1", 1), 2)  # m1 asked to revoke foo-1, still at epoch 1
    resp, _ = engine.heartbeat(hb(G, "m1", 1, {FOO: [0]}), 3)  # revoked; this answer is lost
    m1 = group.members["m1"]
    assert (resp.member_epoch, m1.previous_member_epoch, parts(m1)) == (2, 1, {FOO: [0]})
    engine.heartbeat(hb(G, "m2", group.members["m2"].member_epoch), 4)
    assert group.owners.owner(FOO, 1) == "m2"

    resp, _ = engine.heartbeat(hb(G, "m1", 1), 5)
    assert code(resp) is ErrorCode.FENCED_MEMBER_EPOCH
    assert m1.member_epoch == 2 and group.owners.owner(FOO, 0) == "m1"
    resp, _ = engine.heartbeat(hb(G, "m1", 1, {FOO: [0]}), 6)
    assert (code(resp), resp.member_epoch) == (ErrorCode.NONE, 2)


def test_previous_epoch_without_owned_partitions_after_a_move_that_added_is_fenced() -> None:
    """The move from epoch 1 to 2 gave m1 foo-3 in an answer it never read. Taking its null
    report at epoch 1 as owning foo-3 would have the coordinator wait for it to revoke foo-3
    once the target takes it back (m3 joins) while the member knows nothing of it: fenced, as
    in Kafka; with its owned partitions reported it goes on, and foo-3 is revoked at once."""
    engine, (a,) = engine_with()
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(JOIN, 0)
    a.next = target(m1={FOO: [0, 1, 3]}, m2={FOO: [2]})
    engine.heartbeat(join(G, "m2"), 1)
    group = engine.groups[G]
    engine.heartbeat(hb(G, "m1", 1), 2)  # epoch 2 with foo-3 added; this answer is lost
    assert parts(group.members["m1"]) == {FOO: [0, 1, 3]}
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2]}, m3={FOO: [3]})
    engine.heartbeat(join(G, "m3"), 3)

    assert code(engine.heartbeat(hb(G, "m1", 1), 4)[0]) is ErrorCode.FENCED_MEMBER_EPOCH
    resp, _ = engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 5)
    assert (code(resp), assignment(resp)) == (ErrorCode.NONE, {FOO: [0, 1]})
    assert group.members["m1"].state is MemberState.STABLE
    assert group.owners.owner(FOO, 3) is None


def test_rejoining_with_epoch_zero_rejoins_in_place() -> None:
    engine, (a,) = engine_with()
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(JOIN, 0)
    group = engine.groups[G]
    resp, effects = engine.heartbeat(JOIN, 10)
    assert (resp.member_epoch, assignment(resp)) == (1, {FOO: [0, 1]})
    assert group.group_epoch == 1
    assert not any(isinstance(e, GroupEpochBumped) for e in effects)


def test_rejoin_in_place_releases_partitions_pending_revocation() -> None:
    engine, (a,) = engine_with()
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(JOIN, 0)
    a.next = target(m1={FOO: [0]}, m2={FOO: [1]})
    engine.heartbeat(join(G, "m2"), 1)
    engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 2)
    m1 = engine.groups[G].members["m1"]
    assert m1.state is MemberState.UNREVOKED_PARTITIONS
    # The member was fenced client-side, dropped everything and rejoins with epoch 0.
    resp, _ = engine.heartbeat(JOIN, 3)
    assert (resp.member_epoch, assignment(resp), m1.state) == (2, {FOO: [0]}, MemberState.STABLE)
    resp, _ = engine.heartbeat(hb(G, "m2", 2), 4)
    assert assignment(resp) == {FOO: [1]}


def test_null_fields_mean_unchanged() -> None:
    engine, (_a,) = engine_with()
    engine.heartbeat(replace(JOIN, rack_id="r1", server_assignor="scripted"), 0)
    member = engine.groups[G].members["m1"]
    resp, effects = engine.heartbeat(hb(G, "m1", 1), 1)
    assert code(resp) is ErrorCode.NONE
    assert (member.subscribed_topic_names, member.rack_id, member.rebalance_timeout_ms) == (
        frozenset({"foo"}),
        "r1",
        5000,
    )
    assert member.server_assignor == "scripted"
    assert [type(e) for e in effects] == [TimerArmed]  # the steady heartbeat
    assert resp.assignment is None


def test_subscription_change_bumps_once_and_empty_regex_removes_the_regex() -> None:
    engine, (_a,) = engine_with()
    engine.heartbeat(JOIN, 0)
    group = engine.groups[G]
    engine.heartbeat(hb(G, "m1", 1, subscribed_topic_regex="ba.*"), 1)
    member = group.members["m1"]
    assert member.subscribed_topic_regex == "ba.*" and group.group_epoch == 2
    assert group.subscription_metadata == {FOO: 4, BAR: 2}
    engine.heartbeat(hb(G, "m1", 2, subscribed_topic_regex=""), 2)
    assert member.subscribed_topic_regex is None and group.group_epoch == 3
    assert group.subscription_metadata == {FOO: 4}
    # Same subscription again: no bump.
    engine.heartbeat(hb(G, "m1", 3, subscribed_topic_names=["foo"]), 3)
    assert group.group_epoch == 3


def test_rebalance_timeout_minus_one_is_unchanged() -> None:
    engine, _ = engine_with()
    engine.heartbeat(JOIN, 0)
    engine.heartbeat(hb(G, "m1", 1, rebalance_timeout_ms=-1), 1)
    assert engine.groups[G].members["m1"].rebalance_timeout_ms == 5000
    engine.heartbeat(hb(G, "m1", 1, rebalance_timeout_ms=7000), 2)
    assert engine.groups[G].members["m1"].rebalance_timeout_ms == 7000


def test_group_max_size() -> None:
    engine, _ = engine_with(max_group_size=2)
    engine.heartbeat(JOIN, 0)
    engine.heartbeat(join(G, "m2"), 0)
    resp, _ = engine.heartbeat(join(G, "m3"), 0)
    assert code(resp) is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert "m3" not in engine.groups[G].members
    # Known members are not affected.
    assert code(engine.heartbeat(hb(G, "m1", 1), 1)[0]) is ErrorCode.NONE
    assert code(engine.heartbeat(JOIN, 1)[0]) is ErrorCode.NONE


def test_group_max_size_exempts_a_known_static_instance() -> None:
    engine, _ = engine_with(max_group_size=1)
    engine.heartbeat(join(G, "s1", instance_id="i1"), 0)
    engine.heartbeat(replace(hb(G, "s1", -2), instance_id="i1"), 1)
    resp, _ = engine.heartbeat(join(G, "s2", instance_id="i1"), 2)
    assert code(resp) is ErrorCode.NONE


def test_response_assignment_only_on_full_request_or_change() -> None:
    engine, (a,) = engine_with()
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(JOIN, 0)
    assert engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 1)[0].assignment is None
    full = hb(G, "m1", 1, {FOO: [0, 1]}, rebalance_timeout_ms=5000, subscribed_topic_names=["foo"])
    assert assignment(engine.heartbeat(full, 2)[0]) == {FOO: [0, 1]}
    # A change: only the assigned partitions are listed, never those pending revocation.
    a.next = target(m1={FOO: [0]}, m2={FOO: [1]})
    engine.heartbeat(join(G, "m2"), 3)
    resp, _ = engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 4)
    assert assignment(resp) == {FOO: [0]}
    # While the revocation is pending and unreported, every answer carries the assignment
    # again (the answer that asked for it may have been lost with a coordinator).
    assert assignment(engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 5)[0]) == {FOO: [0]}
    assert assignment(engine.heartbeat(hb(G, "m1", 1), 6)[0]) == {FOO: [0]}  # owned not sent
    resp, _ = engine.heartbeat(hb(G, "m1", 1, {FOO: [0]}), 7)  # revoked: epoch 2
    assert resp.member_epoch == 2 and resp.assignment is None
    assert engine.heartbeat(hb(G, "m1", 2), 8)[0].assignment is None


def test_a_member_answering_with_its_previous_epoch_gets_its_assignment_again() -> None:
    """The answer with its new epoch was lost: the lost-response rule accepts the older epoch,
    and the answer carries the assignment the member missed."""
    engine, (a,) = engine_with()
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(JOIN, 0)
    a.next = target(m1={FOO: [0, 1, 2]})
    engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}, rebalance_timeout_ms=5000,
                        subscribed_topic_names=["foo", "bar"]), 1)  # epoch 2, foo-2 added
    resp, _ = engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 2)  # that answer was lost
    assert resp.member_epoch == 2 and assignment(resp) == {FOO: [0, 1, 2]}
    assert engine.heartbeat(hb(G, "m1", 2), 3)[0].assignment is None


def test_leave_removes_the_member_and_frees_its_partitions() -> None:
    engine, (a,) = engine_with()
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(JOIN, 0)
    group = engine.groups[G]
    resp, effects = engine.heartbeat(hb(G, "m1", -1), 1)
    assert (code(resp), resp.member_id, resp.member_epoch) == (ErrorCode.NONE, "m1", -1)
    assert group.members == {} and group.state is GroupState.EMPTY
    assert group.group_epoch == 2 and group.owners.owner(FOO, 0) is None
    assert MemberLeft(G, "m1", static=False) in effects and GroupEmptied(G) in effects
    assert code(engine.heartbeat(hb(G, "m1", -1), 2)[0]) is ErrorCode.UNKNOWN_MEMBER_ID
    assert code(engine.heartbeat(hb("nope", "m1", -1), 2)[0]) is ErrorCode.GROUP_ID_NOT_FOUND


def test_assignor_selection() -> None:
    engine, (first, second) = engine_with("first", "second")
    engine.heartbeat(JOIN, 0)
    group = engine.groups[G]
    assert group.preferred_assignor == "first" and len(first.calls) == 1
    engine.heartbeat(replace(join(G, "m2"), server_assignor="second"), 1)
    # One vote for "second", none for "first": "second" is the most common.
    assert group.preferred_assignor == "second" and len(second.calls) == 1
    epoch = group.group_epoch
    engine.heartbeat(replace(join(G, "m3"), server_assignor="first"), 2)
    # A tie goes to the configured order.
    assert group.preferred_assignor == "first"
    engine.heartbeat(hb(G, "m3", group.members["m3"].member_epoch, server_assignor="second"), 3)
    assert group.preferred_assignor == "second" and group.group_epoch == epoch + 2
    assert engine.describe([G])[0].assignor_name == "second"


def test_an_error_leaves_the_group_unchanged() -> None:
    engine, _ = engine_with()
    engine.heartbeat(JOIN, 0)
    group = engine.groups[G]
    before = (group.group_epoch,)
    resp, effects = engine.heartbeat(hb(G, "m1", 1, subscribed_topic_regex="(unclosed"), 1)
    assert code(resp) is ErrorCode.INVALID_REGULAR_EXPRESSION and effects == []
    assert group.group_epoch == before[0]
    assert group.members["m1"].subscribed_topic_regex is None


def test_steady_heartbeat_does_no_group_wide_work() -> None:
    engine, (a,) = engine_with()
    a.next = {f"m{i}": {} for i in range(200)}
    for i in range(200):
        engine.heartbeat(join(G, f"m{i}"), 0)
    group = engine.groups[G]
    for i in range(200):
        engine.heartbeat(hb(G, f"m{i}", group.members[f"m{i}"].member_epoch), 1)
    calls = len(a.calls)
    assert group.state is GroupState.STABLE
    resp, effects = engine.heartbeat(hb(G, "m7", 200), 2)
    assert (resp.member_epoch, resp.assignment, len(a.calls)) == (200, None, calls)
    assert [type(e) for e in effects] == [TimerArmed]
    assert parts(group.members["m7"]) == {}
