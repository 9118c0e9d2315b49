"""The bridged member: the broker requests it sends and what the KIP-848 client is told, through
eager and cooperative rebalances, leadership, the broker's errors, leaving and a regex whose
names change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from translation.bridge import (
    BridgedMember,
    BridgeState,
    BrokerJoinAnswer,
    ClientHeartbeat,
    LeaderSyncGroupRequest,
)
from translation.bridge.messages import BrokerRequest
from translation.classic.client_assignors import ClassicGroupMember
from translation.classic.messages import (
    ClassicAssignment,
    ClassicSubscription,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    LeaveGroupRequest,
    SyncGroupResponse,
)
from translation.errors import ErrorCode

SESSION = 30_000


def _member(protocol: str | None = "range", instance: str | None = None) -> BridgedMember:
    return BridgedMember(group_id="g", fleet_address="10.0.0.1:9092", member_id="kip848-a",
                         client_id="app", subscribed_names=["t"], session_timeout_ms=SESSION,
                         rebalance_timeout_ms=60_000, current_protocol=protocol,
                         group_instance_id=instance)


def _state(m: BridgedMember) -> BridgeState:
    return m.state


def _one(requests: Sequence[BrokerRequest]) -> BrokerRequest:
    assert len(requests) == 1, requests
    return requests[0]


def _join(requests: Sequence[BrokerRequest]) -> JoinGroupRequest:
    request = _one(requests)
    assert isinstance(request, JoinGroupRequest)
    return request


def _owned_in(join: JoinGroupRequest) -> dict[str, list[int]]:
    sub = join.protocols[0].subscription
    assert sub is not None
    return {t: list(p) for t, p in sub.owned_partitions}


def _sync(m: BridgedMember, parts: Mapping[str, Sequence[int]], now: int = 0
          ) -> list[BrokerRequest]:
    return m.on_sync_answer(SyncGroupResponse(
        assignment=ClassicAssignment(3, [(t, list(p)) for t, p in parts.items()])), now)


def _stable(m: BridgedMember, generation: int, parts: Mapping[str, Sequence[int]],
            protocol: str = "range") -> None:
    """Drive ``m`` from a JoinGroup outstanding to STABLE at ``generation`` with ``parts``."""
    sync = _one(m.on_join_answer(BrokerJoinAnswer(
        generation_id=generation, protocol_name=protocol, leader="other", member_id="b-1"),
        {}, 0))
    assert isinstance(sync, LeaderSyncGroupRequest)
    assert sync.generation_id == generation and sync.assignments == []
    assert _sync(m, parts) == []
    assert _state(m) is BridgeState.STABLE


def _shown(m: BridgedMember) -> tuple[int, dict[str, list[int]]]:
    answer = m.client_answer()
    assert answer is not None and answer.assignment is not None
    return answer.member_epoch, {t: sorted(p) for t, p in answer.assignment.items()}


def test_join_sync_and_heartbeat_as_a_follower() -> None:
    m = _member(protocol="roundrobin")
    join = _join(m.client_heartbeat(ClientHeartbeat(0, {}, ["t"]), 0))
    assert join.client_id == "gg3|10.0.0.1:9092|kip848-a|app"
    assert [p.name for p in join.protocols] == [
        "roundrobin", "cooperative-sticky", "range", "sticky"]
    assert join.member_id == "" and join.protocol_type == "consumer"
    assert m.client_answer() is None  # no epoch yet
    _stable(m, 5, {"t": [0, 1]}, "roundrobin")
    assert _shown(m) == (5, {"t": [0, 1]})
    assert m.poll(SESSION // 3 - 1) == []
    heartbeat = _one(m.poll(SESSION // 3))
    assert isinstance(heartbeat, HeartbeatRequest)
    assert (heartbeat.member_id, heartbeat.generation_id) == ("b-1", 5)
    assert m.poll(SESSION) == []  # one heartbeat outstanding at a time
    assert m.on_heartbeat_answer(HeartbeatResponse(), SESSION) == []
    assert m.next_deadline_ms == SESSION + SESSION // 3


def test_a_new_group_lists_cooperative_sticky_first() -> None:
    join = _join(_member(protocol=None).client_heartbeat(ClientHeartbeat(0, {}), 0))
    assert [p.name for p in join.protocols] == [
        "cooperative-sticky", "range", "roundrobin", "sticky"]


def test_member_id_required_joins_again_with_the_given_id() -> None:
    m = _member()
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    join = _join(m.on_join_answer(BrokerJoinAnswer(
        error_code=ErrorCode.MEMBER_ID_REQUIRED, member_id="b-1"), {}, 0))
    assert join.member_id == "b-1"


def test_elected_leader_runs_the_selected_client_assignor() -> None:
    m = _member()
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    members = [ClassicGroupMember(mid, None, ClassicSubscription(3, ["t"]))
               for mid in ("b-1", "b-0")]
    sync = _one(m.on_join_answer(BrokerJoinAnswer(
        generation_id=1, protocol_name="range", leader="b-1", member_id="b-1",
        members=members), {"t": 3}, 0))
    assert isinstance(sync, LeaderSyncGroupRequest) and m.leader
    assert [(mid, list(a.partitions)) for mid, a in sync.assignments] == [
        ("b-0", [("t", [0, 1])]), ("b-1", [("t", [2])])]


def test_eager_rebalance_releases_everything_before_rejoining() -> None:
    m = _member()
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0, 1]})
    m.client_heartbeat(ClientHeartbeat(3, {"t": [0, 1]}), 10)
    assert m.on_heartbeat_answer(HeartbeatResponse(), 10) == []  # not outstanding: stale
    m.poll(SESSION)
    assert m.on_heartbeat_answer(
        HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS), SESSION) == []
    assert _state(m) is BridgeState.RELEASING
    assert _shown(m) == (3, {})
    assert m.client_heartbeat(ClientHeartbeat(3, {"t": [0]}), SESSION) == []  # still owns 0
    join = _join(m.client_heartbeat(ClientHeartbeat(3, {}), SESSION))
    assert _owned_in(join) == {}
    assert _shown(m) == (3, {})
    _stable(m, 4, {"t": [1, 2]})
    assert _shown(m) == (4, {"t": [1, 2]})


def test_cooperative_rebalance_revokes_first_then_adds_and_rejoins() -> None:
    m = _member(protocol="cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0, 1]}, "cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(3, {"t": [0, 1]}), 10)
    m.poll(SESSION)
    join = _join(m.on_heartbeat_answer(
        HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS), SESSION))
    assert _owned_in(join) == {"t": [0, 1]}
    sub = join.protocols[0].subscription
    assert sub is not None and sub.generation_id == 3
    assert _shown(m) == (3, {"t": [0, 1]})  # keeps everything while rejoining
    _stable(m, 4, {"t": [1, 2]}, "cooperative-sticky")
    assert _shown(m) == (4, {"t": [1]})  # the revocation only
    follow_up = _join(m.client_heartbeat(ClientHeartbeat(4, {"t": [1]}), SESSION))
    assert _owned_in(follow_up) == {"t": [1]}
    assert _shown(m) == (4, {"t": [1, 2]})  # the addition once 0 is released


def test_cooperative_rebalance_without_revocation_does_not_rejoin_again() -> None:
    m = _member(protocol="cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0]}, "cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(3, {"t": [0]}), 10)
    m.poll(SESSION)
    _join(m.on_heartbeat_answer(
        HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS), SESSION))
    _stable(m, 4, {"t": [0, 1]}, "cooperative-sticky")
    assert _shown(m) == (4, {"t": [0, 1]})
    assert m.client_heartbeat(ClientHeartbeat(4, {"t": [0, 1]}), SESSION) == []


def test_rebalance_in_progress_on_sync_rejoins() -> None:
    m = _member(protocol="cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    m.on_join_answer(BrokerJoinAnswer(generation_id=1, protocol_name="cooperative-sticky",
                                      leader="x", member_id="b-1"), {}, 0)
    join = _join(m.on_sync_answer(
        SyncGroupResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS), 0))
    assert join.member_id == "b-1"
    assert _state(m) is BridgeState.JOINING


@pytest.mark.parametrize("error", [ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION])
def test_fenced_member_loses_its_partitions_and_rejoins(error: ErrorCode) -> None:
    m = _member(protocol="cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0, 1]}, "cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(3, {"t": [0, 1]}), 10)
    m.poll(SESSION)
    join = _join(m.on_heartbeat_answer(HeartbeatResponse(error_code=error), SESSION))
    assert _owned_in(join) == {}
    sub = join.protocols[0].subscription
    assert sub is not None and sub.generation_id == -1
    assert join.member_id == ("" if error == ErrorCode.UNKNOWN_MEMBER_ID else "b-1")
    assert _shown(m) == (3, {})
    _stable(m, 5, {"t": [1, 2]}, "cooperative-sticky")
    assert _shown(m) == (5, {"t": [1]})  # 0 still held by the client: no addition yet
    m.client_heartbeat(ClientHeartbeat(5, {}), SESSION)
    assert _shown(m) == (5, {"t": [1, 2]})


def test_unknown_member_id_on_join_rejoins_without_a_member_id() -> None:
    m = _member()
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    m.on_join_answer(BrokerJoinAnswer(error_code=ErrorCode.MEMBER_ID_REQUIRED,
                                      member_id="b-1"), {}, 0)
    join = _join(m.on_join_answer(
        BrokerJoinAnswer(error_code=ErrorCode.UNKNOWN_MEMBER_ID), {}, 0))
    assert join.member_id == ""


def test_the_client_leaving_sends_leave_group() -> None:
    m = _member()
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0]})
    leave = _one(m.client_heartbeat(ClientHeartbeat(-1), 10))
    assert isinstance(leave, LeaveGroupRequest)
    assert [x.member_id for x in leave.members] == ["b-1"]
    assert _state(m) is BridgeState.LEAVING
    assert m.poll(SESSION) == []
    m.on_leave_answer(20)
    assert _state(m) is BridgeState.LEFT
    answer = m.client_answer()
    assert answer is not None and answer.member_epoch == -1


def test_leaving_before_the_first_join_is_answered_leaves_once_the_id_is_known() -> None:
    m = _member()
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    assert m.client_heartbeat(ClientHeartbeat(-1), 1) == []
    leave = _one(m.on_join_answer(BrokerJoinAnswer(
        error_code=ErrorCode.MEMBER_ID_REQUIRED, member_id="b-9"), {}, 2))
    assert isinstance(leave, LeaveGroupRequest) and leave.members[0].member_id == "b-9"
    m.on_leave_answer(3)
    assert _state(m) is BridgeState.LEFT


def test_a_static_member_leaving_for_now_sends_nothing() -> None:
    m = _member(instance="i-1")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0]})
    assert m.client_heartbeat(ClientHeartbeat(-2), 10) == []
    assert _state(m) is BridgeState.LEFT


def test_regex_resolved_to_other_names_rejoins() -> None:
    m = _member(protocol="cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0]}, "cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(3, {"t": [0]}), 10)
    assert m.set_subscription(["t"], 11) == []  # same names
    join = _join(m.set_subscription(["t", "t-new"], 12))
    assert list(join.protocols[0].subscription.topics) == ["t", "t-new"]  # type: ignore[union-attr]
    assert _owned_in(join) == {"t": [0]}


def test_names_changing_while_joining_rejoin_after_the_sync() -> None:
    m = _member(protocol="cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    assert m.client_heartbeat(ClientHeartbeat(0, {}, ["t", "u"]), 1) == []
    m.on_join_answer(BrokerJoinAnswer(generation_id=1, protocol_name="cooperative-sticky",
                                      leader="x", member_id="b-1"), {}, 2)
    join = _join(_sync(m, {"t": [0]}, 3))
    assert list(join.protocols[0].subscription.topics) == ["t", "u"]  # type: ignore[union-attr]


def test_eager_subscription_change_releases_first() -> None:
    m = _member()
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0]})
    assert m.client_heartbeat(ClientHeartbeat(3, {"t": [0]}, ["t", "u"]), 10) == []
    assert _state(m) is BridgeState.RELEASING
    join = _join(m.client_heartbeat(ClientHeartbeat(3, {}), 11))
    assert list(join.protocols[0].subscription.topics) == ["t", "u"]  # type: ignore[union-attr]


def test_a_group_on_another_assignor_takes_no_bridged_member() -> None:
    m = _member(protocol="stream")
    assert m.client_heartbeat(ClientHeartbeat(0, {}), 0) == []
    answer = m.client_answer()
    assert answer is not None and answer.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    m2 = _member()
    m2.client_heartbeat(ClientHeartbeat(0, {}), 0)
    assert m2.on_join_answer(BrokerJoinAnswer(generation_id=1, protocol_name="custom",
                                              member_id="b", leader="b"), {}, 0) == []
    assert _state(m2) is BridgeState.LEFT


def test_sticky_user_data_carries_what_the_member_owns() -> None:
    m = _member(protocol="cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0]}, "cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(3, {"t": [0]}), 10)
    join = _join(m.set_subscription(["t", "u"], 11))
    by_name = {p.name: p.subscription for p in join.protocols}
    sticky, coop = by_name["sticky"], by_name["cooperative-sticky"]
    assert sticky is not None and coop is not None
    assert coop.user_data == (3).to_bytes(4, "big")
    assert sticky.user_data is not None and sticky.user_data.endswith((3).to_bytes(4, "big"))


def test_coordinator_errors_keep_the_member_id_and_generation() -> None:
    m = _member(protocol="cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    m.on_join_answer(BrokerJoinAnswer(error_code=ErrorCode.MEMBER_ID_REQUIRED,
                                      member_id="b-1"), {}, 0)
    join = _join(m.on_join_answer(
        BrokerJoinAnswer(error_code=ErrorCode.NOT_COORDINATOR), {}, 1))
    assert join.member_id == "b-1"
    _stable(m, 3, {"t": [0]}, "cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(3, {"t": [0]}), 10)
    m.poll(SESSION)
    assert m.on_heartbeat_answer(
        HeartbeatResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE), SESSION) == []
    assert _state(m) is BridgeState.STABLE
    m.poll(2 * SESSION)
    _join(m.on_heartbeat_answer(
        HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS), 2 * SESSION))
    m.on_join_answer(BrokerJoinAnswer(generation_id=4, protocol_name="cooperative-sticky",
                                      leader="x", member_id="b-1"), {}, 0)
    join = _join(m.on_sync_answer(
        SyncGroupResponse(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), 0))
    assert join.member_id == "b-1" and _owned_in(join) == {"t": [0]}
    assert _shown(m) == (3, {"t": [0]})  # nothing lost


def test_a_fenced_instance_id_ends_the_member() -> None:
    m = _member(instance="i-1")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0]})
    m.poll(SESSION)
    assert m.on_heartbeat_answer(
        HeartbeatResponse(error_code=ErrorCode.FENCED_INSTANCE_ID), SESSION) == []
    assert _state(m) is BridgeState.LEFT
    answer = m.client_answer()
    assert answer is not None and answer.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert m.poll(2 * SESSION) == []


def test_the_leader_rejoins_when_partition_counts_change() -> None:
    m = _member(protocol="cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    members = [ClassicGroupMember("b-1", None, ClassicSubscription(3, ["t"]))]
    m.on_join_answer(BrokerJoinAnswer(generation_id=1, protocol_name="cooperative-sticky",
                                      leader="b-1", member_id="b-1", members=members),
                     {"t": 2}, 0)
    _sync(m, {"t": [0, 1]})
    join = _join(m.metadata_changed(10))
    assert join.member_id == "b-1"
    follower = _member()
    follower.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(follower, 1, {"t": [0]})
    assert follower.metadata_changed(10) == []


def test_a_heartbeat_at_an_epoch_never_given_is_fenced_and_changes_nothing() -> None:
    m = _member(protocol="cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(0, {}), 0)
    _stable(m, 3, {"t": [0, 1]}, "cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(3, {"t": [0, 1]}), 10)
    assert m.client_heartbeat(ClientHeartbeat(7, {}), 11) == []
    answer = m.client_answer()
    assert answer is not None and answer.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert m.client_owned == {"t": frozenset({0, 1})}
    m.poll(SESSION)
    _join(m.on_heartbeat_answer(
        HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS), SESSION))
    _stable(m, 4, {"t": [0, 1]}, "cooperative-sticky")
    m.client_heartbeat(ClientHeartbeat(3, {"t": [0, 1]}), SESSION)  # the answer at 4 was lost
    assert _shown(m) == (4, {"t": [0, 1]})
    m.client_heartbeat(ClientHeartbeat(0, {}), SESSION)  # a fenced client comes back at 0
    assert _shown(m) == (4, {"t": [0, 1]})


# ---- carried over from the engine (a release) --------------------------------------------------


def _carried(protocol: str, owned: Mapping[str, Sequence[int]], epoch: int = 12
             ) -> BridgedMember:
    return BridgedMember(group_id="g", fleet_address="10.0.0.1:9092", member_id="kip848-a",
                         client_id="app", subscribed_names=["t"], session_timeout_ms=SESSION,
                         rebalance_timeout_ms=60_000, current_protocol=protocol,
                         epoch=epoch, owned=owned)


def test_carried_over_cooperatively_it_joins_at_once_with_what_it_owns() -> None:
    m = _carried("cooperative-sticky", {"t": [0, 1]})
    # not before the broker's group is free (the lock still held): the client's heartbeat
    # alone does not start it
    assert m.client_heartbeat(ClientHeartbeat(12, {"t": [0, 1]}), 0) == []
    assert _state(m) is BridgeState.UNJOINED and _shown(m) == (12, {"t": [0, 1]})
    join = _join(m.carry_over(0))
    assert _owned_in(join) == {"t": [0, 1]}
    assert join.protocols[0].name == "cooperative-sticky"
    # until the broker's first generation the client keeps its epoch and partitions
    assert m.client_heartbeat(ClientHeartbeat(12, {"t": [0, 1]}), 10) == []
    assert _shown(m) == (12, {"t": [0, 1]})
    _stable(m, 3, {"t": [0, 1]}, "cooperative-sticky")
    assert _shown(m) == (3, {"t": [0, 1]})
    # the old epoch is still a heartbeat the member takes (its answer may have been lost)
    assert m.client_heartbeat(ClientHeartbeat(12, {"t": [0, 1]}), 20) == []
    assert _shown(m) == (3, {"t": [0, 1]})


def test_carried_over_it_is_never_shown_more_than_it_still_owns() -> None:
    """The engine may have told the client to revoke a partition (pending revocation): once the
    client reports it released, it is not given it back before the broker gives it."""
    m = _carried("cooperative-sticky", {"t": [0, 1, 2]})
    _join(m.carry_over(0))
    m.client_heartbeat(ClientHeartbeat(12, {"t": [0, 1]}), 10)
    assert _shown(m) == (12, {"t": [0, 1]})
    m.client_heartbeat(ClientHeartbeat(12, {"t": [0, 1, 2]}), 20)
    assert _shown(m) == (12, {"t": [0, 1]})


def test_carried_over_eagerly_the_client_releases_everything_before_the_join() -> None:
    m = _carried("range", {"t": [0, 1]})
    assert m.carry_over(0) == []
    assert _state(m) is BridgeState.RELEASING
    assert _shown(m) == (12, {})  # told to release at its own epoch
    assert m.client_heartbeat(ClientHeartbeat(12, {"t": [0, 1]}), 10) == []
    join = _join(m.client_heartbeat(ClientHeartbeat(12, {}), 20))
    assert _owned_in(join) == {}
    assert _state(m) is BridgeState.JOINING


def test_carried_over_owning_nothing_joins_at_once_under_any_protocol() -> None:
    m = _carried("range", {})
    assert _owned_in(_join(m.carry_over(0))) == {}


def test_a_carried_over_commit_waits_for_the_first_generation() -> None:
    m = _carried("cooperative-sticky", {"t": [0]})
    _join(m.carry_over(0))
    assert m.generation != m.epoch  # the proxy answers its commits "retry" meanwhile
    _stable(m, 3, {"t": [0]}, "cooperative-sticky")
    assert m.generation == m.epoch == 3
