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
``group.consumer.migration.policy``; where the policy allows the downgrade too
(``bidirectional``), the cases end with it (below). groupgate answers as Kafka under every
policy: under ``downgrade`` the consumer-protocol member is refused, in the engine and in the
broker phase alike (a KIP-848 member the engine had when it handed the group back is not: it
takes part in the broker's group as a bridged member).

Behind groupgate these requests reach the engine (the proxy holds the group: every member
connects through it), which is what these cases exercise on Kafka 4.x. Not played here: the
ListGroups group types and state names of Kafka's assertions before the downgrade (the engine's
group is listed as a consumer group from the start), and the cases whose classic members are
connected straight to the broker (groupgate's broker phase: ``test_mixed_phase.py``; with
``migration-policy=disabled`` the KIP-848 member is answered GROUP_ID_NOT_FOUND there, as
Kafka answers it, ``tests/unit/coordination/test_bridged.py``).

**The downgrade cases.** Kafka's cases end with the downgrade: the last consumer-protocol
member leaves (or, static, a classic member takes its instance id) and the group is a classic
group again; ``testDowngradeFromEmptyConsumerToClassicGroup`` (any policy: an emptied
consumer group takes a classic member) and ``testDowngradeMigrationPolicy`` (policy
``downgrade``: then a consumer-protocol join is refused, GROUP_ID_NOT_FOUND) are the others.
Behind groupgate the downgrade is the hand-back (``proxy/coordination/release.py``): the group
goes to the broker's classic coordinator (ListGroups lists it as a classic group on both), but
where Kafka keeps the classic members in the group it converts (PreparingRebalance; Stable
after a static replacement), groupgate tells them to rejoin the broker's group
(ILLEGAL_GENERATION on their next Heartbeat, their JoinGroup answered REBALANCE_IN_PROGRESS
once the lock left: the broker's group is Empty meanwhile), and they join it with a member id
the broker gives. So both are played to the same end: the classic member rejoins, leads the
classic group, owns every partition, and finds the offsets it committed; the state names of
Kafka's assertion right after the downgrade are asserted on Kafka only, and groupgate's own
answers (the hand-back's) where they differ. An emptied engine group stays the engine's when a
classic member joins it (every member is behind groupgate: nothing to hand back), so there the
answers are compared, not the group type.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.codec import messages
from tests.conftest import BrokerPool, _pooled
from tests.integration.conftest import StartProxy
from tests.integration.test_classic_translation import FLAGS
from tests.integration.test_new_protocol import Wire, coordinator_of
from tests.testbed.broker import KafkaBroker

NONE, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID = 0, 22, 25
REBALANCE_IN_PROGRESS, INCONSISTENT_GROUP_PROTOCOL, MEMBER_ID_REQUIRED = 27, 23, 79
GROUP_ID_NOT_FOUND = 69
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
        """Join a new group and lead it with every partition; the generation (retried while
        the coordinator is not ready, as a client does: a broker just started loads its
        offsets partitions)."""
        if self.instance is None:
            required = retried(lambda: self.join([]))
            assert required["error_code"] == MEMBER_ID_REQUIRED, required
            self.member_id = required["member_id"]
        joined = retried(lambda: self.join([]))
        assert joined["error_code"] == NONE, joined
        self.member_id = joined["member_id"]
        generation = int(joined["generation_id"])
        synced = self.sync(generation, assignments=[
            {"member_id": self.member_id, "assignment": assignment(self.topic, partitions)}])
        assert synced["error_code"] == NONE, synced
        assert assigned(synced["assignment"]) == partitions
        return generation


NOT_READY = (14, 15, 16)
"""COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR: a client retries."""


def retried(send: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``send()`` again while the answer says the coordinator is not ready (a broker that just
    started, a proxy still taking the group over)."""
    for _ in range(100):
        answer = send()
        if answer["error_code"] not in NOT_READY:
            return answer
        time.sleep(0.2)
    return answer


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
    joined = retried(lambda: consumer_heartbeat(wire, group, uuid.uuid4().hex[:22], 0, topic,
                                                instance2))
    assert joined["error_code"] == NONE, joined
    return member1, joined["member_id"], instance2


def eager(bootstrap: str, topic: str, static: bool, behind: bool,
          downgrades: bool) -> None:
    """Kafka's ``testOnlineMigrationWithEagerAssignmentStrategy`` (``behind``: through
    groupgate; ``downgrades``: the policy allows the downgrade at its end)."""
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

        if downgrades:
            downgrade(wire, group, topic, member1, 2, member2, instance2, behind)
    finally:
        wire.close()


def cooperative(bootstrap: str, topic: str, static: bool, behind: bool,
                downgrades: bool) -> None:
    """Kafka's ``testOnlineMigrationWithCooperativeAssignmentStrategy`` (``behind``: through
    groupgate; ``downgrades``: the policy allows the downgrade at its end)."""
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

        if downgrades:
            downgrade(wire, group, topic, member1, 2, member2, instance2, behind)
    finally:
        wire.close()


def consumer_leave(wire: Wire, group: str, member_id: str, instance: str | None
                   ) -> dict[str, Any]:
    """A consumer-protocol member leaves (epoch -1, as Kafka's ``leaveGroupWithNewProtocol``)."""
    return wire.request(68, 0, {
        "group_id": group, "member_id": member_id, "member_epoch": -1,
        "instance_id": instance, "rack_id": None, "rebalance_timeout_ms": -1,
        "subscribed_topic_names": None, "server_assignor": None, "topic_partitions": None})


def listed(wire: Wire, group: str) -> tuple[str, str] | None:
    """(group type, state) ListGroups v5 gives ``group``; None if it lists no such group."""
    answer = wire.request(16, 5, {"states_filter": [], "types_filter": []})
    for entry in answer["groups"]:
        if entry["group_id"] == group:
            return str(entry["group_type"]).lower(), entry["group_state"]
    return None


def listed_soon(wire: Wire, group: str, expected: tuple[str, str]) -> tuple[str, str] | None:
    """:func:`listed`, asked again for a few seconds until it is ``expected`` (the hand-back
    ends in the background, a moment after the request that completed it)."""
    seen = None
    for _ in range(50):
        seen = listed(wire, group)
        if seen == expected:
            break
        time.sleep(0.1)
    return seen


def rejoined(member: Classic, owned: list[int], partitions: list[int]) -> int:
    """The classic member joins the classic group again (asking for the member id it is told
    to, retrying while the coordinator rebalances), leads it, and gives itself ``partitions``;
    its generation."""
    for _ in range(50):
        joined = member.join(owned)
        error = joined["error_code"]
        if error == MEMBER_ID_REQUIRED:
            member.member_id = joined["member_id"]
            continue
        if error in (REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID):
            if error == UNKNOWN_MEMBER_ID:
                member.member_id = ""
            time.sleep(0.1)
            continue
        assert error == NONE, joined
        member.member_id = joined["member_id"]
        assert joined["leader"] == member.member_id, joined
        generation = int(joined["generation_id"])
        synced = member.sync(generation, assignments=[
            {"member_id": member.member_id, "assignment": assignment(member.topic, partitions)}])
        assert synced["error_code"] == NONE, synced
        assert assigned(synced["assignment"]) == partitions
        return generation
    raise AssertionError("the classic member could not join the classic group again")


def downgrade(wire: Wire, group: str, topic: str, member1: Classic, generation: int,
              member2: str, instance2: str | None, behind: bool) -> None:
    """The end of Kafka's online-migration cases: the consumer-protocol member leaves
    (dynamic), or a classic member takes its instance id (static), and the group is a classic
    group; then (beyond Kafka's case) the classic member rejoins it, leads it with every
    partition and finds its committed offsets."""
    static = instance2 is not None
    if not static:
        left = consumer_leave(wire, group, member2, None)
        assert left["error_code"] == NONE, left
    else:
        replacement = Classic(wire, group, topic, instance2)
        replaced = replacement.join([])
        # Kafka takes the replacement into the group it converts; groupgate's engine takes it
        # too and starts the hand-back (the replacement owns nothing: nothing to wait for)
        assert replaced["error_code"] == NONE, replaced
    if not behind:
        assert listed(wire, group) == ("classic", "Stable" if static else
                                       "PreparingRebalance")
        if static:
            return  # Kafka's case ends here, the group Stable with both members
        # (not in Kafka's case: either answer makes the member rejoin)
        assert member1.heartbeat(generation) in (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION)
    else:
        # the hand-back: told to give everything up and rejoin (its partitions are lost);
        # its join waits until the lock left the broker's group
        assert member1.heartbeat(generation) == ILLEGAL_GENERATION
        told = member1.join([])
        assert told["error_code"] == REBALANCE_IN_PROGRESS, told
        assert listed_soon(wire, group, ("classic", "Empty")) == ("classic", "Empty")
    rejoined(member1, [], [0, 1, 2])
    assert listed(wire, group) == ("classic", "Stable")
    assert fetched(wire, group, "", -1, topic, False) == [(0, 180), (1, 181), (2, 182)]


def empty_downgrade(bootstrap: str, topic: str, behind: bool) -> None:
    """Kafka's ``testDowngradeFromEmptyConsumerToClassicGroup`` (every policy): a consumer
    group whose member left takes a classic member. groupgate's engine keeps such a group
    (all its members are behind groupgate): listed as a consumer group, where Kafka lists a
    classic one; the classic member's answers are the same."""
    group = f"downgrade-empty-{uuid.uuid4().hex[:8]}"
    wire = coordinator_of(bootstrap, group)
    try:
        member_id = uuid.uuid4().hex[:22]
        joined = retried(lambda: consumer_heartbeat(wire, group, member_id, 0, topic, None))
        assert joined["error_code"] == NONE, joined
        left = consumer_leave(wire, group, joined["member_id"], None)
        assert left["error_code"] == NONE, left
        assert listed(wire, group) == ("consumer", "Empty")
        settle_assignment_interval()
        assert Classic(wire, group, topic, None).first_join([0, 1, 2]) >= 1
        assert listed(wire, group) == ("consumer" if behind else "classic", "Stable")
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


def downgrade_policy(bootstrap: str, topic: str, behind: bool) -> None:
    """Kafka's ``testDowngradeMigrationPolicy`` (policy ``downgrade``): a consumer-protocol
    member and a classic one; the first revokes and leaves, the group is a classic group
    again, and a consumer-protocol join is refused (GROUP_ID_NOT_FOUND). Then (beyond Kafka's
    case) the classic member rejoins the classic group and leads it with every partition."""
    group = f"downgrade-policy-{uuid.uuid4().hex[:8]}"
    wire = coordinator_of(bootstrap, group)
    try:
        member1 = uuid.uuid4().hex[:22]
        joined = retried(lambda: consumer_heartbeat(wire, group, member1, 0, topic, None))
        assert joined["error_code"] == NONE, joined
        member1, epoch1 = joined["member_id"], joined["member_epoch"]
        settle_assignment_interval()
        member2 = Classic(wire, group, topic, None)
        required = member2.join([])
        assert required["error_code"] == MEMBER_ID_REQUIRED, required
        member2.member_id = required["member_id"]
        joined2 = member2.join([])
        # (Kafka's case sees generation 2; a group epoch bumped meanwhile, e.g. by the new
        # topic's metadata, makes it one more: the member goes on with what it was given)
        assert joined2["error_code"] == NONE and joined2["generation_id"] >= 2, joined2
        generation = int(joined2["generation_id"])
        synced = member2.sync(generation)
        assert synced["error_code"] == NONE and assigned(synced["assignment"]) == [], synced
        assert member2.heartbeat(generation) == NONE
        revoked = consumer_heartbeat(wire, group, member1, epoch1, topic, None)
        assert revoked["error_code"] == NONE, revoked
        assert member2.heartbeat(generation) == REBALANCE_IN_PROGRESS
        left = consumer_leave(wire, group, member1, None)
        assert left["error_code"] == NONE, left
        if behind:  # the hand-back (member 2 owns nothing: nobody to wait for)
            assert listed_soon(wire, group, ("classic", "Empty")) == ("classic", "Empty")
        else:
            assert listed(wire, group) == ("classic", "PreparingRebalance")
        refused = consumer_heartbeat(wire, group, member1, 0, topic, None)
        assert refused["error_code"] == GROUP_ID_NOT_FOUND, refused
        if behind:
            assert member2.heartbeat(generation) == ILLEGAL_GENERATION  # the hand-back's
        else:  # (not in Kafka's case: either answer makes the member rejoin)
            assert member2.heartbeat(generation) in (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION)
        rejoined(member2, [], [0, 1, 2])
        assert listed(wire, group) == ("classic", "Stable")
    finally:
        wire.close()


CASES: dict[str, Callable[[str, str, bool, bool, bool], None]] = {
    "eager": eager, "cooperative": cooperative}
POLICIES = ("upgrade", "downgrade", "disabled")
"""The policies other than ``bidirectional`` (the cases above run under it)."""
UPGRADES = {"bidirectional": True, "upgrade": True, "downgrade": False, "disabled": False}
DOWNGRADES = {"bidirectional": True, "upgrade": False, "downgrade": True, "disabled": False}
"""What each policy allows, on Kafka and through groupgate alike."""


def every_case(bootstrap: str, topic: Callable[[], str], policy: str, behind: bool) -> None:
    """The four upgrade cases (eager and cooperative, dynamic and static) where the policy
    lets the group upgrade (ending in the downgrade where it allows that too), else the
    refusal, dynamic and static."""
    for static in (False, True):
        if UPGRADES[policy]:
            for case in sorted(CASES):
                CASES[case](bootstrap, topic(), static, behind, DOWNGRADES[policy])
        else:
            refused(bootstrap, topic(), static)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_through_groupgate(kafka39: KafkaBroker, start_proxy: StartProxy,
                           topic: Callable[..., str], case: str, static: bool) -> None:
    proxy = start_proxy(kafka39, *FLAGS, "--migration-policy", "bidirectional")
    CASES[case](proxy.bootstrap, topic(kafka39, partitions=3), static, True, True)


@pytest.mark.slow
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_on_kafka_4_4(kafka4: KafkaBroker, topic: Callable[..., str], case: str,
                      static: bool) -> None:
    """The reference: the same requests straight at Kafka 4.4 (migration policy
    ``bidirectional``, its default)."""
    CASES[case](kafka4.bootstrap, topic(kafka4, partitions=3), static, False, True)


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_through_groupgate(kafka39: KafkaBroker, start_proxy: StartProxy,
                                       topic: Callable[..., str], policy: str) -> None:
    """The cases under each other ``migration-policy``, one proxy per policy."""
    proxy = start_proxy(kafka39, *FLAGS, "--migration-policy", policy)
    every_case(proxy.bootstrap, lambda: topic(kafka39, partitions=3), policy, True)


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

        every_case(broker.bootstrap, fresh, policy, False)


@pytest.mark.parametrize("policy", ("bidirectional", *POLICIES))
def test_an_emptied_group_takes_a_classic_member_through_groupgate(
        kafka39: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        policy: str) -> None:
    proxy = start_proxy(kafka39, *FLAGS, "--migration-policy", policy)
    empty_downgrade(proxy.bootstrap, topic(kafka39, partitions=3), True)


def test_the_downgrade_policy_through_groupgate(kafka39: KafkaBroker, start_proxy: StartProxy,
                                                topic: Callable[..., str]) -> None:
    proxy = start_proxy(kafka39, *FLAGS, "--migration-policy", "downgrade")
    downgrade_policy(proxy.bootstrap, topic(kafka39, partitions=3), True)


DOWNGRADE_KEY = "4.4-downgrade"


@pytest.fixture
def kafka4_downgrade(broker_pool: BrokerPool) -> Iterator[KafkaBroker]:
    """Kafka 4.4 with ``group.consumer.migration.policy=downgrade``."""
    broker_pool.factories.setdefault(DOWNGRADE_KEY, lambda d: KafkaBroker.start(
        "4.4", d, properties={"group.consumer.migration.policy": "downgrade"}))
    for cluster in _pooled(broker_pool, DOWNGRADE_KEY):
        assert isinstance(cluster, KafkaBroker)
        yield cluster


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["bidirectional", "downgrade"])
def test_an_emptied_group_takes_a_classic_member_on_kafka_4_4(
        request: pytest.FixtureRequest, topic: Callable[..., str], policy: str) -> None:
    """The reference, on the broker's default policy and on ``downgrade`` (Kafka's case runs
    all four; ``upgrade`` and ``disabled`` would need two more brokers)."""
    broker: KafkaBroker = request.getfixturevalue(
        "kafka4" if policy == "bidirectional" else "kafka4_downgrade")
    empty_downgrade(broker.bootstrap, topic(broker, partitions=3), False)


@pytest.mark.slow
def test_the_downgrade_policy_on_kafka_4_4(kafka4_downgrade: KafkaBroker,
                                           topic: Callable[..., str]) -> None:
    downgrade_policy(kafka4_downgrade.bootstrap, topic(kafka4_downgrade, partitions=3), False)
