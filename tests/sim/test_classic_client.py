"""The simulated classic consumer (eager and cooperative), transition by transition."""

from __future__ import annotations

import uuid

from translation.classic.messages import (
    ClassicAssignment,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from translation.errors import ErrorCode
from translation.simulation.classic_client import SimulatedClassicConsumer
from translation.simulation.client import TP, ClientState
from translation.topics import TopicMetadata, TopicsImage

T = uuid.UUID(int=3)
IMAGE = TopicsImage.of([TopicMetadata(T, "t", 4)])


def make(
    cooperative: bool, instance_id: str | None = None
) -> tuple[SimulatedClassicConsumer, list[tuple[str, TP, str]]]:
    log: list[tuple[str, TP, str]] = []
    client = SimulatedClassicConsumer(
        "c",
        "g",
        topics=frozenset({"t"}),
        instance_id=instance_id,
        cooperative=cooperative,
        session_timeout_ms=6000,
        rebalance_timeout_ms=3000,
        heartbeat_interval_ms=500,
        image=lambda: IMAGE,
        on_acquire=lambda c, tp: log.append(("acquire", tp, "")),
        on_release=lambda c, tp, why: log.append(("release", tp, why)),
    )
    client.subscribe(0)
    return client, log


def joined(client: SimulatedClassicConsumer, generation: int, partitions: list[int]) -> None:
    """Drive JoinGroup -> SyncGroup to a Stable client owning ``partitions``."""
    request = client.build_request()
    assert isinstance(request, JoinGroupRequest)
    response = JoinGroupResponse(generation_id=generation, member_id="m1", protocol_type="consumer")
    assert client.on_response(response, 0) == ["heartbeat-now"]
    sync = client.build_request()
    assert isinstance(sync, SyncGroupRequest) and sync.generation_id == generation
    client.on_response(SyncGroupResponse(assignment=ClassicAssignment(3, [("t", partitions)])), 0)


def test_member_id_required_then_join_sync_heartbeat() -> None:
    client, _ = make(cooperative=False)
    first = client.build_request()
    assert isinstance(first, JoinGroupRequest) and first.member_id == ""
    assert [p.name for p in first.protocols] == ["range", "cooperative-sticky"]
    client.on_response(JoinGroupResponse(error_code=79, member_id="m1"), 0)
    joined(client, 5, [0, 1])
    assert client.member_id == "m1" and client.epoch == 5
    assert client.state is ClientState.STABLE and client.owned == {(T, 0), (T, 1)}
    beat = client.build_request()
    assert isinstance(beat, HeartbeatRequest) and beat.generation_id == 5
    assert client.on_response(HeartbeatResponse(), 0) == []


def test_eager_revokes_everything_before_rejoining() -> None:
    client, log = make(cooperative=False)
    joined(client, 5, [0, 1])
    client.build_request()
    assert client.on_response(HeartbeatResponse(error_code=27), 0) == ["heartbeat-now"]
    assert client.owned == set() and [e[0] for e in log[-2:]] == ["release", "release"]
    request = client.build_request()
    assert isinstance(request, JoinGroupRequest)
    sub = request.protocols[0].subscription
    assert sub is not None and sub.owned_partitions == () and sub.generation_id == 5


def test_cooperative_keeps_partitions_reports_them_and_revokes_after_sync() -> None:
    client, log = make(cooperative=True)
    joined(client, 5, [0, 1])
    client.build_request()
    client.on_response(HeartbeatResponse(error_code=27), 0)
    assert client.owned == {(T, 0), (T, 1)}
    request = client.build_request()
    assert isinstance(request, JoinGroupRequest)
    sub = request.protocols[0].subscription
    assert sub is not None and sub.owned_partitions == (("t", (0, 1)),)
    client.on_response(JoinGroupResponse(generation_id=5, member_id="m1"), 0)
    client.build_request()
    actions = client.on_response(
        SyncGroupResponse(assignment=ClassicAssignment(3, [("t", [0, 2])])), 0
    )
    # foo-2 is added at once; foo-1 is revoked by the callback, then the client rejoins.
    assert actions == ["revoke"] and (T, 2) in client.owned and (T, 1) in client.owned
    assert client.state is ClientState.RECONCILING
    assert ("release", (T, 1), "revoked") not in log  # still processing foo-1
    assert client.finish_revocation(client.revocation_token) == ["heartbeat-now"]
    assert client.owned == {(T, 0), (T, 2)} and log[-1] == ("release", (T, 1), "revoked")
    again = client.build_request()
    assert isinstance(again, JoinGroupRequest)
    assert again.protocols[0].subscription is not None
    assert again.protocols[0].subscription.owned_partitions == (("t", (0, 2)),)


def test_errors() -> None:
    client, _ = make(cooperative=True)
    joined(client, 5, [0])
    client.build_request()
    assert client.on_response(HeartbeatResponse(error_code=22), 0) == ["heartbeat-now"]
    assert client.owned == set() and client.member_id == "m1"  # ILLEGAL_GENERATION
    joined(client, 6, [0])
    client.build_request()
    client.on_response(HeartbeatResponse(error_code=int(ErrorCode.UNKNOWN_MEMBER_ID)), 0)
    assert client.owned == set() and client.member_id == ""
    joined(client, 7, [0])
    client.build_request()
    client.on_response(HeartbeatResponse(error_code=int(ErrorCode.FENCED_INSTANCE_ID)), 0)
    assert client.state is ClientState.FATAL and client.owned == set()


def test_leaving_static_sends_nothing_dynamic_sends_leave_group() -> None:
    static, _ = make(cooperative=False, instance_id="i1")
    joined(static, 5, [0])
    static.start_leave(static=True)
    assert static.state is ClientState.LEFT and not static.alive and static.owned == set()
    dynamic, _ = make(cooperative=False)
    joined(dynamic, 5, [0])
    dynamic.start_leave(static=False)
    leave = dynamic.build_request()
    assert isinstance(leave, LeaveGroupRequest) and leave.members[0].member_id == "m1"
    dynamic.on_response(LeaveGroupResponse(), 0)
    assert dynamic.state is ClientState.LEFT


def test_a_subscription_change_during_a_join_triggers_another_join() -> None:
    client, _ = make(cooperative=True)
    request = client.build_request()
    assert isinstance(request, JoinGroupRequest)
    client.change_subscription(frozenset({"t", "u"}), None, None)
    # The JoinGroup in flight carried the old subscription: finish the round, then rejoin.
    client.on_response(JoinGroupResponse(generation_id=5, member_id="m1"), 0)
    assert isinstance(client.build_request(), SyncGroupRequest)
    actions = client.on_response(SyncGroupResponse(assignment=ClassicAssignment(3, [])), 0)
    assert actions == ["heartbeat-now"]
    again = client.build_request()
    assert isinstance(again, JoinGroupRequest)
    assert again.protocols[0].subscription is not None
    assert again.protocols[0].subscription.topics == ("t", "u")
