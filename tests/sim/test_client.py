"""The simulated consumer's member state machine, transition by transition."""

from __future__ import annotations

import uuid

from translation.errors import ErrorCode
from translation.heartbeat import ConsumerGroupHeartbeatResponse, TopicPartitions
from translation.simulation.client import TP, ClientState, SimulatedConsumer

T = uuid.UUID(int=3)


def make(instance_id: str | None = None) -> tuple[SimulatedConsumer, list[tuple[str, TP, str]]]:
    log: list[tuple[str, TP, str]] = []
    client = SimulatedConsumer(
        "c",
        "member-1",
        "g",
        topics=frozenset({"t"}),
        regex=None,
        instance_id=instance_id,
        server_assignor=None,
        rebalance_timeout_ms=3000,
        on_acquire=lambda c, tp: log.append(("acquire", tp, "")),
        on_release=lambda c, tp, why: log.append(("release", tp, why)),
    )
    client.subscribe(0)
    return client, log


def ok(epoch: int, partitions: list[int] | None) -> ConsumerGroupHeartbeatResponse:
    assignment = None if partitions is None else [TopicPartitions(T, partitions)]
    return ConsumerGroupHeartbeatResponse(
        member_id="member-1", member_epoch=epoch, heartbeat_interval_ms=500, assignment=assignment
    )


def test_join_assign_acknowledge() -> None:
    client, log = make()
    request = client.build_request()
    assert (request.member_epoch, request.topic_partitions) == (0, [])
    assert request.subscribed_topic_names == ["t"] and request.rebalance_timeout_ms == 3000
    assert client.on_response(ok(1, [0, 1]), 10) == ["heartbeat-now"]
    assert client.state is ClientState.ACKNOWLEDGING and client.owned == {(T, 0), (T, 1)}
    assert [e[0] for e in log] == ["acquire", "acquire"]
    ack = client.build_request()
    assert (ack.member_epoch, ack.topic_partitions) == (1, [(T, [0, 1])])
    assert ack.subscribed_topic_names is None and ack.rebalance_timeout_ms == -1
    assert client.on_response(ok(1, None), 20) == []
    assert client.state is ClientState.STABLE
    steady = client.build_request()
    assert steady.topic_partitions is None  # unchanged fields are not sent


def test_revoke_before_assign() -> None:
    client, log = make()
    client.build_request()
    client.on_response(ok(1, [0, 1]), 10)
    client.build_request()
    client.on_response(ok(1, None), 20)
    client.build_request()
    assert client.on_response(ok(1, [0]), 30) == ["revoke"]
    assert client.state is ClientState.RECONCILING and client.owned == {(T, 0), (T, 1)}
    assert client.awaiting_ack == {(T, 1)}
    # A newer assignment while revoking waits for the revocation.
    client.build_request()
    assert client.on_response(ok(1, [0]), 40) == []
    assert client.finish_revocation(client.revocation_token) == ["heartbeat-now"]
    assert client.owned == {(T, 0)} and log[-1] == ("release", (T, 1), "revoked")
    ack = client.build_request()
    assert ack.topic_partitions == [(T, [0])]
    client.on_response(ok(2, None), 50)
    assert client.epoch == 2 and client.awaiting_ack == frozenset()
    # New partitions arrive once released elsewhere.
    client.build_request()
    assert client.on_response(ok(2, [0, 2]), 60) == ["heartbeat-now"]
    assert client.owned == {(T, 0), (T, 2)}


def test_fenced_member_drops_everything_and_rejoins_with_epoch_zero() -> None:
    client, log = make()
    client.build_request()
    client.on_response(ok(1, [0]), 10)
    client.build_request()
    fenced = ConsumerGroupHeartbeatResponse(error_code=ErrorCode.FENCED_MEMBER_EPOCH)
    assert client.on_response(fenced, 20) == ["heartbeat-now"]
    assert (client.state, client.epoch, client.owned) == (ClientState.JOINING, 0, set())
    assert log[-1] == ("release", (T, 0), "fenced")
    rejoin = client.build_request()
    assert (rejoin.member_id, rejoin.member_epoch, rejoin.topic_partitions) == (
        "member-1",
        0,
        [],
    )


def test_fatal_errors_and_leaving() -> None:
    client, _ = make("i1")
    client.build_request()
    client.on_response(ConsumerGroupHeartbeatResponse(error_code=111), 10)
    assert client.state is ClientState.FATAL and not client.alive

    client, log = make("i1")
    client.build_request()
    client.on_response(ok(1, [0]), 10)
    client.start_leave(static=True)
    assert client.owned == set() and log[-1] == ("release", (T, 0), "left")
    leave = client.build_request()
    assert (leave.member_epoch, leave.instance_id) == (-2, "i1")
    client.on_response(ConsumerGroupHeartbeatResponse(member_id="member-1", member_epoch=-2), 20)
    assert client.state is ClientState.LEFT


def test_a_lost_response_makes_the_next_request_full() -> None:
    client, _ = make()
    client.build_request()
    client.on_response(ok(1, [0]), 10)
    client.build_request()
    client.on_response(ok(1, None), 20)
    client.build_request()
    client.on_request_lost()
    full = client.build_request()
    assert full.rebalance_timeout_ms == 3000 and full.subscribed_topic_names == ["t"]
    assert full.subscribed_topic_regex == "" and full.topic_partitions == [(T, [0])]


def test_subscription_change_is_sent_until_acknowledged() -> None:
    client, _ = make()
    client.build_request()
    client.change_subscription(frozenset({"t", "u"}), "v.*", "range")
    client.on_response(ok(1, []), 10)  # the response to the join does not cover the change
    request = client.build_request()
    assert request.subscribed_topic_names == ["t", "u"]
    assert (request.subscribed_topic_regex, request.server_assignor) == ("v.*", "range")
    client.on_response(ok(2, None), 20)
    assert client.build_request().subscribed_topic_names is None
