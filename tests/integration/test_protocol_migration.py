"""The online-migration cases of Kafka's ``ConsumerProtocolMigrationTest`` that apply, spoken
with hand-made requests to groupgate (Kafka 3.9 behind it, every request through the proxy)
and, with ``--run-slow``, to Kafka 4.4's own coordinator: every step's answer must be the one
Kafka's test asserts, on both.

A classic member (JoinGroup, SyncGroup as the leader with every partition) makes a group; a
consumer-protocol member joins it, and the group upgrades in place. The classic member's
Heartbeats, commits, offset fetches, rejoins and SyncGroups are then answered at each
generation as Kafka answers them (ILLEGAL_GENERATION for a generation it does not have,
UNKNOWN_MEMBER_ID for a member or group nobody knows, REBALANCE_IN_PROGRESS to make it rejoin,
INCONSISTENT_GROUP_PROTOCOL for another protocol type or name), until it gives up what the new
member gets. Eager (the classic member revokes everything and rejoins) and cooperative (it
rejoins with what it owns, keeps part of it, and rejoins again), dynamic and static members.

Each migration policy: the cases above run under ``bidirectional`` (Kafka's default) and again
under ``upgrade`` (groupgate's default); under a policy without upgrades the consumer-protocol
member's first heartbeat is GROUP_ID_NOT_FOUND and the classic member goes on as before
(Kafka's ``validateOnlineUpgrade``), dynamic and static. Through groupgate with
``--migration-policy``; on Kafka 4.4 (``--run-slow``) on a broker started with
``group.consumer.migration.policy``. One answer differs, on purpose: under ``downgrade``
groupgate admits the consumer-protocol member (its sidecars bridge such a member in the broker
phase, so a hand-back never strands a KIP-848 client), where Kafka refuses it.

Behind groupgate these requests reach the engine (the proxy holds the group: every member
connects through it), which is what these cases exercise on Kafka 4.x. Not played here: the
ListGroups group types and state names of Kafka's assertions (the engine's group is listed as a
consumer group from the start), the downgrade at the end of Kafka's cases (a group handed back
goes to the broker's classic coordinator: the release), and the cases whose classic members
are connected straight to the broker (groupgate's broker phase: ``test_mixed_phase.py``; with
``migration-policy=disabled`` the KIP-848 member is answered GROUP_ID_NOT_FOUND there, as
Kafka answers it, ``tests/unit/coordination/test_bridged.py``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.codec import messages
from tests.integration.conftest import StartProxy
from tests.integration.test_classic_translation import FLAGS
from tests.integration.test_new_protocol import Wire, coordinator_of
from tests.testbed.broker import KafkaBroker

NONE, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID = 0, 22, 25
REBALANCE_IN_PROGRESS, INCONSISTENT_GROUP_PROTOCOL, MEMBER_ID_REQUIRED = 27, 23, 79
GROUP_ID_NOT_FOUND = 69
LOADING = frozenset({14, 15, 16})
"""COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR: the first join of a
broker just started is asked again."""
PROTOCOL = "range"
"""The classic member's protocol name (Kafka's test calls it ``consumer-range``: any name)."""
OTHER = "roundrobin"
"""A protocol name the group does not use."""


def subscription(topic: str, owned: list[int]) -> bytes:
    return messages.encode_data("ConsumerProtocolSubscription", 1, {
        "topics": [topic], "user_data": None,
        "owned_partitions": [{"topic": topic, "partitions": owned}]})


def assignment(topic: str, partitions: list[int]) -> bytes:
    return messages.encode_data("ConsumerProtocolAssignment", 1, {
        "assigned_partitions": [{"topic": topic, "partitions": partitions}],
        "user_data": None})


def assigned(data: bytes) -> list[int]:
    _version, value = messages.decode_data("ConsumerProtocolAssignment", data)
    return sorted(p for t in value["assigned_partitions"] for p in t["partitions"])


class Classic:
    """The classic member, request by request (JoinGroup v5, SyncGroup v5, Heartbeat v4). A
    static member names its instance id in its JoinGroups only, as Kafka's test does (its
    SyncGroups, Heartbeats and commits go by member id)."""

    def __init__(self, wire: Wire, group: str, topic: str, instance: str | None) -> None:
        self.wire, self.group, self.topic, self.instance = wire, group, topic, instance
        self.member_id = ""

    def join(self, owned: list[int], *, member_id: str | None = None,
             protocol_type: str = "consumer", protocol: str = PROTOCOL) -> dict[str, Any]:
        """This member's JoinGroup; with another ``member_id`` a stranger's (no instance id,
        as in Kafka's test)."""
        return self.wire.request(11, 5, {
            "group_id": self.group, "session_timeout_ms": 45_000,
            "rebalance_timeout_ms": 300_000,
            "member_id": self.member_id if member_id is None else member_id,
            "group_instance_id": self.instance if member_id is None else None,
            "protocol_type": protocol_type,
            "protocols": [{"name": protocol, "metadata": subscription(self.topic, owned)}]})

    def sync(self, generation: int, *, group: str | None = None, member_id: str | None = None,
             protocol_type: str = "consumer", protocol: str = PROTOCOL,
             assignments: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return self.wire.request(14, 5, {
            "group_id": group or self.group, "generation_id": generation,
            "member_id": self.member_id if member_id is None else member_id,
            "group_instance_id": None, "protocol_type": protocol_type,
            "protocol_name": protocol, "assignments": assignments or []})

    def heartbeat(self, generation: int, *, group: str | None = None,
                  member_id: str | None = None) -> int:
        answer = self.wire.request(12, 4, {
            "group_id": group or self.group, "generation_id": generation,
            "member_id": self.member_id if member_id is None else member_id,
            "group_instance_id": None})
        return int(answer["error_code"])

    def first_join(self, partitions: list[int]) -> int:
        """Join a new group and lead it with every partition; the generation."""
        if self.instance is None:
            required = self.join([])
            for _ in range(100):  # a broker just started loads its group coordinator first
                if required["error_code"] not in LOADING:
                    break
                time.sleep(0.2)
                required = self.join([])
            assert required["error_code"] == MEMBER_ID_REQUIRED, required
            self.member_id = required["member_id"]
        joined = self.join([])
        for _ in range(100):
            if joined["error_code"] not in LOADING:
                break
            time.sleep(0.2)
            joined = self.join([])
        assert joined["error_code"] == NONE, joined
        self.member_id = joined["member_id"]
        generation = int(joined["generation_id"])
        synced = self.sync(generation, assignments=[
            {"member_id": self.member_id, "assignment": assignment(self.topic, partitions)}])
        assert synced["error_code"] == NONE, synced
        assert assigned(synced["assignment"]) == partitions
        return generation


def settle_assignment_interval() -> None:
    """groupgate's engine computes a group's target at most once a second, as Kafka 4.2+ does
    (``assignment_interval_ms``): the classic member's join just computed one, and a join
    within the second would be folded into the next computation, so its first answers would
    come a heartbeat later than on Kafka 4.4, whose group was classic and had computed none.
    Waiting the interval out makes the consumer member's join compute at once on both."""
    time.sleep(1.2)


def consumer_heartbeat(wire: Wire, group: str, member_id: str, epoch: int, topic: str,
                       instance: str | None) -> dict[str, Any]:
    return wire.request(68, 0, {
        "group_id": group, "member_id": member_id, "member_epoch": epoch,
        "instance_id": instance, "rack_id": None, "rebalance_timeout_ms": 300_000,
        "subscribed_topic_names": [topic], "server_assignor": None,
        "topic_partitions": []})


def commit(wire: Wire, group: str, member_id: str, generation: int, topic: str,
           instance: str | None, base: int) -> list[int]:
    answer = wire.request(8, 8, {
        "group_id": group, "generation_id_or_member_epoch": generation, "member_id": member_id,
        "group_instance_id": instance, "topics": [{"name": topic, "partitions": [
            {"partition_index": p, "committed_offset": base + p, "committed_leader_epoch": -1,
             "committed_metadata": ""} for p in range(3)]}]})
    return [p["error_code"] for t in answer["topics"] for p in t["partitions"]]


def fetched(wire: Wire, group: str, member_id: str, epoch: int, topic: str,
            stable: bool) -> list[tuple[int, int]]:
    answer = wire.request(9, 9, {"groups": [{
        "group_id": group, "member_id": member_id, "member_epoch": epoch,
        "topics": [{"name": topic, "partition_indexes": [0, 1, 2]}]}],
        "require_stable": stable})
    entry = answer["groups"][0]
    assert entry["error_code"] == NONE, entry
    return sorted((p["partition_index"], p["committed_offset"])
                  for t in entry["topics"] for p in t["partitions"])


def upgraded(wire: Wire, group: str, topic: str, static: bool
             ) -> tuple[Classic, str, str | None]:
    """Both cases' start: the classic member makes the group with every partition, and a
    consumer-protocol member joins it (accepted: the group upgrades). (The classic member,
    the consumer member's id, its instance id.)"""
    member1 = Classic(wire, group, topic, "instance-id-1" if static else None)
    assert member1.first_join([0, 1, 2]) == 1
    settle_assignment_interval()
    instance2 = "instance-id-2" if static else None
    joined = consumer_heartbeat(wire, group, uuid.uuid4().hex[:22], 0, topic, instance2)
    assert joined["error_code"] == NONE, joined
    return member1, joined["member_id"], instance2


def eager(bootstrap: str, topic: str, static: bool) -> None:
    """Kafka's ``testOnlineMigrationWithEagerAssignmentStrategy``, up to the downgrade."""
    group = f"migration-eager-{uuid.uuid4().hex[:8]}"
    wire = coordinator_of(bootstrap, group)
    try:
        member1, member2, instance2 = upgraded(wire, group, topic, static)

        assert member1.heartbeat(2) == ILLEGAL_GENERATION
        assert member1.heartbeat(1, member_id="unknown-member-id") == UNKNOWN_MEMBER_ID
        assert member1.heartbeat(1, group="unknown-group-id") == UNKNOWN_MEMBER_ID
        assert member1.heartbeat(1, member_id=member2) == UNKNOWN_MEMBER_ID
        assert member1.heartbeat(1) == REBALANCE_IN_PROGRESS
        assert commit(wire, group, member1.member_id, 1, topic, None, 180) == [NONE] * 3
        assert fetched(wire, group, member1.member_id, 1, topic, False) == \
            [(0, 180), (1, 181), (2, 182)]

        connect = member1.join([], protocol_type="connect")
        assert connect["error_code"] == INCONSISTENT_GROUP_PROTOCOL, connect
        rejoined = member1.join([])
        assert (rejoined["error_code"], rejoined["generation_id"], rejoined["member_id"],
                rejoined["protocol_name"]) == (NONE, 2, member1.member_id, PROTOCOL), rejoined
        other = member1.join([], member_id="new-member", protocol=OTHER)
        assert other["error_code"] == INCONSISTENT_GROUP_PROTOCOL, other

        answer = consumer_heartbeat(wire, group, member2, 2, topic, instance2)
        assert answer["error_code"] == NONE, answer
        partitions2 = sorted(p for t in answer["assignment"]["topic_partitions"]
                             for p in t["partitions"])
        assert partitions2, answer

        assert member1.sync(1)["error_code"] == ILLEGAL_GENERATION
        assert member1.sync(2, group="unknown-group-id")["error_code"] == UNKNOWN_MEMBER_ID
        assert member1.sync(2, member_id="unknown-member-id")["error_code"] == \
            UNKNOWN_MEMBER_ID
        assert member1.sync(2, protocol_type="connect")["error_code"] == \
            INCONSISTENT_GROUP_PROTOCOL
        assert member1.sync(2, protocol=OTHER)["error_code"] == INCONSISTENT_GROUP_PROTOCOL
        synced = member1.sync(2)
        assert synced["error_code"] == NONE, synced
        assert assigned(synced["assignment"]) == [p for p in (0, 1, 2) if p not in partitions2]
    finally:
        wire.close()


def cooperative(bootstrap: str, topic: str, static: bool) -> None:
    """Kafka's ``testOnlineMigrationWithCooperativeAssignmentStrategy``, up to the downgrade."""
    group = f"migration-coop-{uuid.uuid4().hex[:8]}"
    wire = coordinator_of(bootstrap, group)
    try:
        member1, member2, instance2 = upgraded(wire, group, topic, static)

        assert member1.heartbeat(1) == REBALANCE_IN_PROGRESS
        assert commit(wire, group, member1.member_id, 1, topic, None, 180) == [NONE] * 3
        assert fetched(wire, group, member1.member_id, 1, topic, True) == \
            [(0, 180), (1, 181), (2, 182)]

        # rejoins with what it owns: the same generation, and it keeps part of it
        rejoined = member1.join([0, 1, 2])
        assert (rejoined["error_code"], rejoined["generation_id"], rejoined["member_id"],
                rejoined["protocol_name"]) == (NONE, 1, member1.member_id, PROTOCOL), rejoined
        synced = member1.sync(1)
        assert synced["error_code"] == NONE, synced
        partitions1 = assigned(synced["assignment"])
        assert partitions1 and len(partitions1) < 3, partitions1
        assert member1.heartbeat(1) == REBALANCE_IN_PROGRESS
        # rejoins with what it kept: the next generation, the same partitions
        again = member1.join(partitions1)
        assert (again["error_code"], again["generation_id"]) == (NONE, 2), again
        synced = member1.sync(2)
        assert synced["error_code"] == NONE and assigned(synced["assignment"]) == partitions1

        answer = consumer_heartbeat(wire, group, member2, 2, topic, instance2)
        assert answer["error_code"] == NONE, answer
        partitions2 = sorted(p for t in answer["assignment"]["topic_partitions"]
                             for p in t["partitions"])
        assert partitions2 == [p for p in (0, 1, 2) if p not in partitions1], answer
    finally:
        wire.close()


def refused(bootstrap: str, topic: str, static: bool) -> None:
    """Kafka's answer to the same start under a policy without upgrades: the consumer-protocol
    member's first heartbeat is GROUP_ID_NOT_FOUND (``validateOnlineUpgrade``), and the
    classic member goes on as if nothing happened (heartbeat, commit and fetch at its
    generation)."""
    group = f"migration-refused-{uuid.uuid4().hex[:8]}"
    wire = coordinator_of(bootstrap, group)
    try:
        member1 = Classic(wire, group, topic, "instance-id-1" if static else None)
        assert member1.first_join([0, 1, 2]) == 1
        settle_assignment_interval()
        answer = consumer_heartbeat(wire, group, uuid.uuid4().hex[:22], 0, topic,
                                    "instance-id-2" if static else None)
        assert answer["error_code"] == GROUP_ID_NOT_FOUND, answer
        assert member1.heartbeat(1) == NONE
        assert commit(wire, group, member1.member_id, 1, topic, None, 180) == [NONE] * 3
        assert fetched(wire, group, member1.member_id, 1, topic, False) == \
            [(0, 180), (1, 181), (2, 182)]
        assert member1.heartbeat(1) == NONE
    finally:
        wire.close()


CASES: dict[str, Callable[[str, str, bool], None]] = {"eager": eager,
                                                      "cooperative": cooperative}
POLICIES = ("upgrade", "downgrade", "disabled")
"""The policies other than ``bidirectional`` (the cases above run under it)."""
UPGRADES_ON_KAFKA = {"bidirectional": True, "upgrade": True, "downgrade": False,
                     "disabled": False}
UPGRADES_THROUGH_GROUPGATE = dict(UPGRADES_ON_KAFKA, downgrade=True)
"""Where groupgate answers otherwise, on purpose: under ``downgrade`` it admits the
consumer-protocol member (its sidecars bridge such a member in the broker phase, so a
hand-back never strands a KIP-848 client; decision record 0018, section 1)."""


def every_case(bootstrap: str, topic: Callable[[], str], upgrades: bool) -> None:
    """The four upgrade cases (eager and cooperative, dynamic and static) where the policy
    lets the group upgrade, else the refusal, dynamic and static."""
    for static in (False, True):
        if upgrades:
            for case in sorted(CASES):
                CASES[case](bootstrap, topic(), static)
        else:
            refused(bootstrap, topic(), static)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_through_groupgate(kafka39: KafkaBroker, start_proxy: StartProxy,
                           topic: Callable[..., str], case: str, static: bool) -> None:
    proxy = start_proxy(kafka39, *FLAGS, "--migration-policy", "bidirectional")
    CASES[case](proxy.bootstrap, topic(kafka39, partitions=3), static)


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_on_kafka_4_4(kafka4: KafkaBroker, topic: Callable[..., str], case: str,
                      static: bool) -> None:
    """The reference: the same requests straight at Kafka 4.4 (migration policy
    ``bidirectional``, its default)."""
    CASES[case](kafka4.bootstrap, topic(kafka4, partitions=3), static)


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_through_groupgate(kafka39: KafkaBroker, start_proxy: StartProxy,
                                       topic: Callable[..., str], policy: str) -> None:
    """The cases under each other ``migration-policy``, one proxy per policy."""
    proxy = start_proxy(kafka39, *FLAGS, "--migration-policy", policy)
    every_case(proxy.bootstrap, lambda: topic(kafka39, partitions=3),
               UPGRADES_THROUGH_GROUPGATE[policy])


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_on_kafka_4_4(tmp_path: Path, policy: str) -> None:
    """The reference: a Kafka 4.4 broker with ``group.consumer.migration.policy`` set."""
    with KafkaBroker.start("4.4", tmp_path / "kafka", properties={
            "group.consumer.migration.policy": policy}) as broker:
        count = iter(range(100))

        def fresh() -> str:
            name = f"migration-{policy}-{next(count)}"
            broker.create_topic(name, 3)
            return name

        every_case(broker.bootstrap, fresh, UPGRADES_ON_KAFKA[policy])
