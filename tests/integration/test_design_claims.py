"""The broker behaviour decision record 0018 builds on, checked on real brokers.

The lock, the bypass fence and fleet protocol 3 rest on a few things Kafka's classic
coordinator does that no document promises. Each test here plays the members at the wire level
(exactly the requests a sidecar or a client sends) and asserts what the record claims, so that a
broker that behaves otherwise fails here first:

* DescribeGroups names every member's client id in every group state (the member mark: how the
  fleet tells members behind sidecars from direct ones);
* a LeaveGroup naming other members' ids removes them, dynamic by member id and static by
  instance id; the lock's JoinGroup right after holds the emptied group; every later request
  of a removed member is refused without changing anything, commits included (the conversion's
  "empty and lock" step and its safety net);
* a commit stamped with the lock member's id and generation is accepted from any connection
  (commits sent by the member's own sidecar on the client's connection);
* on Kafka 4.4, the lock member's assignment user data keeps a direct KIP-848 client out of a
  group the engine coordinates (GROUP_ID_NOT_FOUND), where without it the broker converts the
  group and hands the client partitions (``--run-slow``: the 4.4 reference).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.upstream import UpstreamClient
from tests.testbed.broker import KafkaBroker
from translation.errors import ErrorCode

pytestmark = pytest.mark.broker

SESSION_MS = 10_000
LOCK_PROTOCOL = "groupgate-coordinated"


def member_mark(client_id: str, kip848_member: str = "-") -> str:
    """The client id a sidecar gives a member it forwards or bridges (record 0018, section 5)."""
    return f"gg3|10.0.0.9:9095|{kip848_member}|{client_id}"


async def connect(address: tuple[str, int]) -> UpstreamClient:
    stream = await trio.open_tcp_stream(*address)
    return UpstreamClient(stream, max_frame_bytes=8 << 20)


async def coordinator_of(bootstrap: str, group_id: str) -> tuple[str, int]:
    host, _, port = bootstrap.rpartition(":")
    client = await connect((host, int(port)))
    try:
        with trio.fail_after(30):  # a fresh broker creates its offsets topic first
            while True:
                found = await client.request(ApiKey.FIND_COORDINATOR, 3,
                                             {"key": group_id, "key_type": 0})
                if found["error_code"] != ErrorCode.COORDINATOR_NOT_AVAILABLE:
                    break
                await trio.sleep(0.2)
    finally:
        await client.aclose()
    assert found["error_code"] == 0, found
    return found["host"], found["port"]


def subscription(topics: list[str], user_data: bytes | None = None) -> bytes:
    return messages.encode_data("ConsumerProtocolSubscription", 0,
                                {"topics": topics, "user_data": user_data})


def assignment(partitions: dict[str, list[int]], user_data: bytes | None = None) -> bytes:
    return messages.encode_data("ConsumerProtocolAssignment", 0, {
        "assigned_partitions": [{"topic": t, "partitions": ps} for t, ps in partitions.items()],
        "user_data": user_data})


@dataclass
class RawMember:
    """One classic member of the broker's group, request by request."""

    client: UpstreamClient
    group_id: str
    client_id: str
    protocols: list[tuple[str, bytes]]
    instance_id: str | None = None
    member_id: str = ""
    generation: int = -1
    leader: bool = False
    members: list[dict[str, Any]] = field(default_factory=list)

    async def join(self) -> int:
        """JoinGroup until it is answered with something other than MEMBER_ID_REQUIRED."""
        while True:
            answer = await self.client.request(ApiKey.JOIN_GROUP, 5, {
                "group_id": self.group_id, "session_timeout_ms": SESSION_MS,
                "rebalance_timeout_ms": SESSION_MS, "member_id": self.member_id,
                "group_instance_id": self.instance_id, "protocol_type": "consumer",
                "protocols": [{"name": n, "metadata": m} for n, m in self.protocols]},
                client_id=self.client_id)
            if answer["error_code"] == ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = answer["member_id"]
                continue
            if answer["error_code"] == ErrorCode.NONE:
                self.member_id = answer["member_id"]
                self.generation = answer["generation_id"]
                self.leader = answer["leader"] == self.member_id
                self.members = answer["members"]
            return int(answer["error_code"])

    async def sync(self, assignments: dict[str, bytes] | None = None) -> int:
        answer = await self.client.request(ApiKey.SYNC_GROUP, 3, {
            "group_id": self.group_id, "generation_id": self.generation,
            "member_id": self.member_id, "group_instance_id": self.instance_id,
            "assignments": [{"member_id": m, "assignment": a}
                            for m, a in (assignments or {}).items()]},
            client_id=self.client_id)
        return int(answer["error_code"])

    async def heartbeat(self) -> int:
        answer = await self.client.request(ApiKey.HEARTBEAT, 3, {
            "group_id": self.group_id, "generation_id": self.generation,
            "member_id": self.member_id, "group_instance_id": self.instance_id},
            client_id=self.client_id)
        return int(answer["error_code"])

    async def commit(self, topic: str, partition: int, offset: int,
                     member_id: str | None = None, generation: int | None = None) -> int:
        answer = await self.client.request(ApiKey.OFFSET_COMMIT, 7, {
            "group_id": self.group_id,
            "generation_id_or_member_epoch": (self.generation if generation is None
                                              else generation),
            "member_id": self.member_id if member_id is None else member_id,
            "group_instance_id": None,
            "topics": [{"name": topic, "partitions": [{
                "partition_index": partition, "committed_offset": offset,
                "committed_leader_epoch": -1, "committed_metadata": None}]}]},
            client_id=self.client_id)
        return int(answer["topics"][0]["partitions"][0]["error_code"])


async def describe(client: UpstreamClient, group_id: str) -> dict[str, Any]:
    answer = await client.request(ApiKey.DESCRIBE_GROUPS, 5, {
        "groups": [group_id], "include_authorized_operations": False})
    described: dict[str, Any] = answer["groups"][0]
    return described


async def committed(client: UpstreamClient, group_id: str, topic: str, partition: int) -> int:
    answer = await client.request(ApiKey.OFFSET_FETCH, 7, {
        "group_id": group_id, "topics": [{"name": topic, "partition_indexes": [partition]}],
        "require_stable": False})
    return int(answer["topics"][0]["partitions"][0]["committed_offset"])


async def stable_pair(broker: KafkaBroker, group_id: str, topic: str
                      ) -> tuple[RawMember, RawMember]:
    """Two members behind sidecars (marked client ids), `range`, the second one static, both
    Stable at one generation with one partition each."""
    coordinator = await coordinator_of(broker.bootstrap, group_id)
    metadata = subscription([topic])
    a = RawMember(await connect(coordinator), group_id, member_mark("app-a"),
                  [("range", metadata)])
    b = RawMember(await connect(coordinator), group_id, member_mark("app-b", "kip848-b"),
                  [("range", metadata)], instance_id="pod-b")
    assert await a.join() == ErrorCode.NONE
    assert await a.sync({a.member_id: assignment({topic: [0, 1]})}) == ErrorCode.NONE
    async with trio.open_nursery() as nursery:  # B's join rebalances: both join again
        errors: list[int] = []

        async def rejoin(m: RawMember) -> None:
            errors.append(await m.join())

        nursery.start_soon(rejoin, b)
        await trio.sleep(0.5)
        assert await a.heartbeat() == ErrorCode.REBALANCE_IN_PROGRESS
        nursery.start_soon(rejoin, a)
    assert errors == [ErrorCode.NONE, ErrorCode.NONE]
    assert a.generation == b.generation
    leader, follower = (a, b) if a.leader else (b, a)
    plan = {a.member_id: assignment({topic: [0]}), b.member_id: assignment({topic: [1]})}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower.sync)
        await trio.sleep(0.2)
        assert await leader.sync(plan) == ErrorCode.NONE
    return a, b


async def test_describe_groups_names_every_members_client_id_in_every_state(
        kafka39: KafkaBroker, topic: Any) -> None:
    name = topic(kafka39, partitions=2)
    group_id = f"claims-{uuid.uuid4().hex[:8]}"
    a, b = await stable_pair(kafka39, group_id, name)
    observer = await connect(await coordinator_of(kafka39.bootstrap, group_id))
    stable = await describe(observer, group_id)
    assert stable["group_state"] == "Stable"
    assert sorted(m["client_id"] for m in stable["members"]) == sorted(
        [member_mark("app-a"), member_mark("app-b", "kip848-b")])
    # a third member joins: the group rebalances, and its members are still named, marks and
    # all, although their metadata is withheld
    c = RawMember(await connect(await coordinator_of(kafka39.bootstrap, group_id)), group_id,
                  "direct-client", [("range", subscription([name]))])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(c.join)
        await trio.sleep(0.5)
        rebalancing = await describe(observer, group_id)
        assert rebalancing["group_state"] == "PreparingRebalance"
        assert {m["client_id"] for m in rebalancing["members"]} >= {
            member_mark("app-a"), member_mark("app-b", "kip848-b")}
        assert all(not m["member_metadata"] for m in rebalancing["members"])
        nursery.cancel_scope.cancel()
    for m in (a, b, c):
        await m.client.aclose()
    await observer.aclose()


async def test_leaving_for_every_member_empties_the_group_for_the_lock(
        kafka39: KafkaBroker, topic: Any) -> None:
    name = topic(kafka39, partitions=2)
    group_id = f"claims-{uuid.uuid4().hex[:8]}"
    a, b = await stable_pair(kafka39, group_id, name)
    assert await a.commit(name, 0, 5) == ErrorCode.NONE
    coordinator = await coordinator_of(kafka39.bootstrap, group_id)
    converter = await connect(coordinator)

    # Empty and lock: one LeaveGroup names both members (B by its instance id), then the
    # lock's JoinGroup on the same connection.
    left = await converter.request(ApiKey.LEAVE_GROUP, 3, {"group_id": group_id, "members": [
        {"member_id": a.member_id, "group_instance_id": None},
        {"member_id": b.member_id, "group_instance_id": "pod-b"}]})
    assert left["error_code"] == 0 and [m["error_code"] for m in left["members"]] == [0, 0]
    assert (await describe(converter, group_id))["group_state"] == "Empty"
    lock = RawMember(converter, group_id, "groupgate", [(LOCK_PROTOCOL, subscription([name]))])
    assert await lock.join() == ErrorCode.NONE and lock.leader
    assert await lock.sync({lock.member_id: assignment({}, b"card")}) == ErrorCode.NONE

    # Every later request of a removed member is refused and changes nothing.
    assert await a.heartbeat() in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION)
    assert await b.sync() in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION,
                              ErrorCode.FENCED_INSTANCE_ID)
    assert await a.commit(name, 0, 3) != ErrorCode.NONE
    rejoin = RawMember(a.client, group_id, a.client_id, a.protocols)
    assert await rejoin.join() == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    held = await describe(converter, group_id)
    assert held["group_state"] == "Stable" and held["protocol_data"] == LOCK_PROTOCOL
    assert [m["member_id"] for m in held["members"]] == [lock.member_id]
    assert await committed(converter, group_id, name, 0) == 5  # the refused commit wrote nothing

    # The lock's stamp commits from any connection (a member's own sidecar, section 3).
    elsewhere = RawMember(await connect(coordinator), group_id, "app-a", [])
    assert await elsewhere.commit(name, 0, 9, lock.member_id, lock.generation) == ErrorCode.NONE
    assert await committed(converter, group_id, name, 0) == 9
    assert await lock.heartbeat() == ErrorCode.NONE  # and the lock never noticed
    for client in (a.client, b.client, converter, elsewhere.client):
        await client.aclose()


async def kip848_join(client: UpstreamClient, group_id: str, topic: str) -> dict[str, Any]:
    answer: dict[str, Any] = await client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, {
        "group_id": group_id, "member_id": uuid.uuid4().hex[:22], "member_epoch": 0,
        "instance_id": None, "rack_id": None, "rebalance_timeout_ms": 30_000,
        "subscribed_topic_names": [topic], "subscribed_topic_regex": None,
        "server_assignor": None, "topic_partitions": []})
    return answer


@pytest.mark.slow
@pytest.mark.parametrize("card_in_assignment", [True, False], ids=["lock-card", "no-card"])
async def test_a_lock_with_assignment_user_data_blocks_a_native_upgrade(
        kafka4: KafkaBroker, topic: Any, card_in_assignment: bool) -> None:
    name = topic(kafka4, partitions=2)
    group_id = f"claims-{uuid.uuid4().hex[:8]}"
    coordinator = await coordinator_of(kafka4.bootstrap, group_id)
    lock = RawMember(await connect(coordinator), group_id, "groupgate",
                     [(LOCK_PROTOCOL, subscription([name], b"card"))])
    assert await lock.join() == ErrorCode.NONE
    user_data = b"groupgate-fleet:{}" if card_in_assignment else None
    assert await lock.sync({lock.member_id: assignment({}, user_data)}) == ErrorCode.NONE

    direct = await connect(coordinator)
    answer = await kip848_join(direct, group_id, name)
    if card_in_assignment:
        assert answer["error_code"] == ErrorCode.GROUP_ID_NOT_FOUND, answer
        assert answer["assignment"] is None
        assert await lock.heartbeat() == ErrorCode.NONE  # the broker's group is untouched
    else:
        # what groupgate 0.2.0 allowed: the broker converts the group the lock holds
        assert answer["error_code"] == ErrorCode.NONE, answer
        assert answer["member_epoch"] > 0
    await direct.aclose()
    await lock.client.aclose()
