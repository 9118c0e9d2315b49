"""Decision record 0018's ordering claim for the conversion, on the engine.

"Nobody is called back": once the converter adopted the broker's group at generation *g*, the
first request each member sends (at the generation it already had) is answered as if nothing
happened: no REBALANCE_IN_PROGRESS, no ILLEGAL_GENERATION, the SyncGroup of a member that was
still syncing returns its assignment, and commits at *g* pass, for eager and cooperative,
static and dynamic members. The group only moves when its membership changes (a new member).
"""

from __future__ import annotations

from translation.classic.messages import ClassicAssignment, ClassicProtocol, HeldRequest
from translation.classic.migration import (
    ClassicGroupMemberSnapshot,
    ClassicGroupSnapshot,
    convert_classic_group,
)

from ..helpers import FOO, ScriptedAssignor, image, parts, target
from .helpers import Classic, E, G, join_req, names, subscription

GENERATION = 7


def snapshot_member(member_id: str, protocols: tuple[str, ...], partitions: list[int],
                    instance_id: str | None = None) -> ClassicGroupMemberSnapshot:
    owned = {"foo": partitions} if protocols[0] == "cooperative-sticky" else None
    return ClassicGroupMemberSnapshot(
        member_id=member_id,
        protocols=[ClassicProtocol(p, subscription(("foo",), owned)) for p in protocols],
        assignment=ClassicAssignment(3, [("foo", partitions)]),
        group_instance_id=instance_id, session_timeout_ms=45_000,
        rebalance_timeout_ms=300_000)


def converted(protocol: str) -> Classic:
    c = Classic.of(image(foo=(FOO, 6)), ScriptedAssignor())
    members = [
        # eager librdkafka / Java defaults list range first; cooperative lists only
        # cooperative-sticky; one static member
        snapshot_member("eager", (protocol, "roundrobin"), [0, 1]),
        snapshot_member("static", (protocol,), [2, 3], instance_id="pod-2"),
        snapshot_member("third", (protocol,), [4, 5]),
    ]
    refusal, _ = convert_classic_group(
        c.engine, ClassicGroupSnapshot(G, GENERATION, "consumer", protocol, members), 0)
    assert refusal is None
    return c


def test_eager_members_of_a_converted_group_are_not_called_back() -> None:
    c = converted("range")
    group = c.engine.groups[G]
    for now, member in enumerate(("eager", "static", "third"), start=1):
        instance = "pod-2" if member == "static" else None
        assert c.beat(member, GENERATION, now * 1000, instance_id=instance) == E.NONE
    assert {m: parts(group.members[m]) for m in group.members} == {
        "eager": {FOO: [0, 1]}, "static": {FOO: [2, 3]}, "third": {FOO: [4, 5]}}
    # a SyncGroup at the adopted generation (a member whose sync raced the conversion) gets
    # its assignment back, not a rebalance
    assert names(c.sync("third", GENERATION, 4000)) == {"foo": [4, 5]}
    # commits at the adopted generation pass for every partition the member holds
    for member, ps in (("eager", [0, 1]), ("static", [2, 3]), ("third", [4, 5])):
        instance = "pod-2" if member == "static" else None
        assert c.engine.validate_offset_commit(
            G, member, GENERATION, [(FOO, p) for p in ps], instance_id=instance,
            api_version=7) == E.NONE
    assert (group.group_epoch, group.target.epoch) == (GENERATION, GENERATION)


def test_cooperative_members_keep_everything_until_the_membership_changes() -> None:
    c = converted("cooperative-sticky")
    group = c.engine.groups[G]
    for now in range(1, 4):  # three heartbeat rounds: nothing moves
        for member in ("eager", "static", "third"):
            instance = "pod-2" if member == "static" else None
            assert c.beat(member, GENERATION, now * 3000, instance_id=instance) == E.NONE
    assert group.group_epoch == GENERATION
    # a new member is what moves the group: only then are members told to rebalance
    assignor = c.engine.config.assignors[0]
    assert isinstance(assignor, ScriptedAssignor)
    assignor.next = target(eager={FOO: [0]}, static={FOO: [2, 3]}, third={FOO: [4, 5]},
                           new={FOO: [1]})
    first = c.join(join_req("", protocols=("cooperative-sticky",)), now=10_000)
    assert not isinstance(first, HeldRequest)
    assert first.error_code == E.MEMBER_ID_REQUIRED
    c.join(join_req(first.member_id, protocols=("cooperative-sticky",)), now=10_001)
    assert group.group_epoch == GENERATION + 1
    assert c.beat("eager", GENERATION, 11_000) == E.REBALANCE_IN_PROGRESS


def test_a_bridged_member_is_adopted_as_its_kip848_client_at_the_generation() -> None:
    """A member a sidecar ran in the broker's group for a KIP-848 client is adopted under the
    client's member id as a consumer-protocol member; the client's next heartbeat, at the
    epoch its bridged member told it (the generation), changes nothing, and neither do the
    classic members' requests."""
    from translation.member import MemberProtocol

    from ..helpers import hb

    c = Classic.of(image(foo=(FOO, 6)), ScriptedAssignor())
    members = [snapshot_member("classic", ("range",), [0, 1, 2]),
               ClassicGroupMemberSnapshot(
                   member_id="gg3|10.0.0.9:9191|kip848-m1|app-gg3-uuid",
                   protocols=[ClassicProtocol("range", subscription(("foo",), None))],
                   assignment=ClassicAssignment(3, [("foo", [3, 4, 5])]),
                   session_timeout_ms=45_000, rebalance_timeout_ms=30_000,
                   kip848_member_id="kip848-m1")]
    refusal, _ = convert_classic_group(
        c.engine, ClassicGroupSnapshot(G, GENERATION, "consumer", "range", members), 0)
    assert refusal is None
    group = c.engine.groups[G]
    assert set(group.members) == {"classic", "kip848-m1"}
    adopted = group.members["kip848-m1"]
    assert adopted.protocol is MemberProtocol.CONSUMER and adopted.classic is None
    assert (adopted.member_epoch, parts(adopted)) == (GENERATION, {FOO: [3, 4, 5]})
    answer = c.engine.heartbeat(hb(G, "kip848-m1", GENERATION, {FOO: [3, 4, 5]}), 1000)[0]
    assert answer.error_code == E.NONE and answer.member_epoch == GENERATION
    assert c.beat("classic", GENERATION, 1500) == E.NONE
    assert group.group_epoch == GENERATION


def test_an_adopted_eager_member_advanced_quietly_keeps_the_generation_it_was_given() -> None:
    """A member adopted at *g* whose target does not change when the membership does is moved
    to the new epoch in place (quiet advance) and keeps the generation its client was given:
    its next heartbeat and commit at *g* pass. (The migration roll's eager members behind the
    converting sidecar got ILLEGAL_GENERATION here, 'lost' to librdkafka: the adopted member
    had no generation of its own, so the advanced epoch was checked instead.)"""
    c = converted("range")
    group = c.engine.groups[G]
    assignor = c.engine.config.assignors[0]
    assert isinstance(assignor, ScriptedAssignor)
    # the new member takes one of third's partitions; eager and static keep theirs
    assignor.next = target(eager={FOO: [0, 1]}, static={FOO: [2, 3]}, third={FOO: [4]},
                           new={FOO: [5]})
    first = c.join(join_req("", protocols=("range",)), now=1000)
    assert not isinstance(first, HeldRequest) and first.error_code == E.MEMBER_ID_REQUIRED
    c.join(join_req(first.member_id, protocols=("range",)), now=1001)
    assert group.target.epoch == GENERATION + 1
    for now in (2000, 5000, 8000):  # advanced in place at the first, unchanged after
        assert c.beat("eager", GENERATION, now) == E.NONE
        assert c.beat("static", GENERATION, now, instance_id="pod-2") == E.NONE
    assert group.members["eager"].member_epoch == GENERATION + 1
    assert c.beat("third", GENERATION, 8000) == E.REBALANCE_IN_PROGRESS  # it loses one
    assert c.engine.validate_offset_commit(G, "eager", GENERATION, [(FOO, 0), (FOO, 1)],
                                           instance_id=None, api_version=7) == E.NONE
    assert names(c.sync("eager", GENERATION, 9000)) == {"foo": [0, 1]}
