"""The round-trip property of durable group state, over random call sequences: after any
sequence of requests, timers and topic changes (both protocols, static members, regexes),

* the records drained after every call, folded by key, are exactly the records of the state
  the engine is in (dirty tracking misses nothing and leaves no stale key behind);
* a fresh engine loaded from them holds the same group (epochs, members, assignments with
  their epochs, target, owners, static and subscription indexes);
* and both engines answer the next heartbeats of every member the same, and stay the same.

Held requests are not state, so the classic SyncGroup hold is off here (a held request would
make the old engine answer a heartbeat differently until the client sends it again).
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from translation.assignors.range import RangeAssignor
from translation.assignors.uniform import UniformAssignor
from translation.classic.coordinator import ClassicGroupCoordinator
from translation.classic.messages import (
    HeartbeatRequest,
    LeaveGroupRequest,
    LeavingMember,
    SyncGroupRequest,
)
from translation.config import GroupConfig
from translation.coordinator import GroupCoordinator
from translation.heartbeat import ConsumerGroupHeartbeatResponse
from translation.member import MemberProtocol
from translation.records import StateRecord, fold
from translation.simulation.invariants import group_differences
from translation.topics import TopicMetadata, TopicsImage

from .classic.helpers import join_req
from .helpers import hb, join

G = "g"
WALL = 1_700_000_000_000
FOO, BAR, BAZ = (uuid.UUID(int=n) for n in (0xF00, 0xBA2, 0xBA7))
IMAGES = [
    TopicsImage.of([TopicMetadata(FOO, "foo", 6), TopicMetadata(BAR, "bar", 3)]),
    TopicsImage.of([TopicMetadata(FOO, "foo", 8), TopicMetadata(BAR, "bar", 3)]),
    TopicsImage.of([TopicMetadata(FOO, "foo", 8), TopicMetadata(BAR, "bar", 3),
                    TopicMetadata(BAZ, "baz", 4)]),
    TopicsImage.of([TopicMetadata(FOO, "foo", 8), TopicMetadata(BAZ, "baz", 4)]),
]
SUBSCRIPTIONS: list[tuple[list[str], str | None]] = [
    (["foo"], None), (["foo", "bar"], None), (["bar"], None), ([], "ba.*"), (["foo"], "baz"),
]
MEMBERS = [f"m{i}" for i in range(5)]
CLASSIC = ["c0", "c1", "c2"]


def engine(image: TopicsImage) -> tuple[GroupCoordinator, ClassicGroupCoordinator]:
    config = GroupConfig(
        assignors=[UniformAssignor(), RangeAssignor()], session_timeout_ms=6_000,
        assignment_interval_ms=0, classic_sync_hold_ms=0, empty_group_expiry_ms=20_000,
        durable_state=True, member_id_factory=lambda: "generated",
        classic_departure_wait_ms=0)  # not in the records (translation.departures)
    core = GroupCoordinator(config, image)
    return core, ClassicGroupCoordinator(core)


def owned_now(core: GroupCoordinator, member_id: str) -> dict[uuid.UUID, list[int]]:
    """What a client that revoked whatever it was told owns: its assigned partitions."""
    member = core.groups[G].members[member_id]
    return {t: sorted(ps) for t, ps in member.assigned.items()}


class Driver:
    def __init__(self) -> None:
        self.image = IMAGES[0]
        self.core, self.classic = engine(self.image)
        self.now = 0
        self.drained: list[StateRecord] = []

    def member(self, member_id: str) -> Any:
        group = self.core.groups.get(G)
        return None if group is None else group.members.get(member_id)

    def step(self, op: tuple[Any, ...]) -> None:
        kind, who, arg = op
        core, classic, now = self.core, self.classic, self.now
        member = self.member(who)
        if kind == "join":
            names, regex = SUBSCRIPTIONS[arg % len(SUBSCRIPTIONS)]
            core.heartbeat(join(G, who, topics=names, regex=regex,
                                instance_id=f"i-{who}" if who in ("m0", "m1") else None,
                                assignor=("range", None, "uniform")[arg % 3]), now)
        elif kind == "beat" and member is not None and member.member_epoch >= 0:
            if member.protocol is MemberProtocol.CLASSIC:
                classic.heartbeat(HeartbeatRequest(G, who, _generation(member)), now)
            else:
                owned = owned_now(core, who) if arg % 3 else None
                core.heartbeat(hb(G, who, member.member_epoch, owned), now)
        elif kind == "resubscribe" and member is not None and member.member_epoch > 0:
            names, regex = SUBSCRIPTIONS[arg % len(SUBSCRIPTIONS)]
            if member.protocol is MemberProtocol.CONSUMER:
                core.heartbeat(hb(G, who, member.member_epoch, None, subscribed_topic_names=names,
                                  subscribed_topic_regex=regex or ""), now)
        elif kind == "leave" and member is not None:
            if member.protocol is MemberProtocol.CLASSIC:
                classic.leave_group(LeaveGroupRequest(G, [LeavingMember(who)]), now)
            elif arg % 2 and member.instance_id is not None and member.member_epoch >= 0:
                core.heartbeat(hb(G, who, -2, instance_id=member.instance_id), now)
            else:
                core.heartbeat(hb(G, who, -1, instance_id=member.instance_id), now)
        elif kind == "classic-join":
            reported: dict[str, list[int]] | None = None
            if member is not None and member.protocol is MemberProtocol.CLASSIC and arg % 2:
                by_id = self.image.by_id
                reported = {by_id[t].name: ps for t, ps in owned_now(core, who).items()
                            if t in by_id}
            names = SUBSCRIPTIONS[arg % 3][0] or ["foo"]
            classic.join_group(join_req(who, names, reported, group_id=G), now)
        elif kind == "classic-sync" and member is not None and member.classic is not None:
            classic.sync_group(SyncGroupRequest(G, who, _generation(member)), now)
        elif kind == "topics":
            self.image = IMAGES[arg % len(IMAGES)]
            core.update_topics(self.image, now)
        elif kind == "time":
            self.now += arg
            core.tick(self.now)
        self.drained.extend(core.drain_records(WALL + self.now))


def _generation(member: Any) -> int:
    meta = member.classic
    return int(meta.generation) if meta is not None and meta.generation >= 0 \
        else int(member.member_epoch)


OPS = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(MEMBERS), st.integers(0, 20)),
    st.tuples(st.just("beat"), st.sampled_from(MEMBERS + CLASSIC), st.integers(0, 20)),
    st.tuples(st.just("beat"), st.sampled_from(MEMBERS), st.integers(0, 20)),
    st.tuples(st.just("resubscribe"), st.sampled_from(MEMBERS), st.integers(0, 20)),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS + CLASSIC), st.integers(0, 20)),
    st.tuples(st.just("classic-join"), st.sampled_from(CLASSIC), st.integers(0, 20)),
    st.tuples(st.just("classic-sync"), st.sampled_from(CLASSIC), st.integers(0, 20)),
    st.tuples(st.just("topics"), st.just(""), st.integers(0, 20)),
    st.tuples(st.just("time"), st.just(""), st.sampled_from([10, 500, 3_000, 7_000, 25_000])),
)


def _normalized(response: object) -> object:
    if isinstance(response, ConsumerGroupHeartbeatResponse) and response.assignment is not None:
        return (response.error_code, response.member_id, response.member_epoch,
                sorted((str(t), sorted(ps)) for t, ps in response.assignment))
    return response


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=1, max_size=45))
def test_drain_load_round_trip(ops: list[tuple[Any, ...]]) -> None:
    driver = Driver()
    for op in ops:
        driver.step(op)
    core = driver.core
    snapshot = core.group_records(G, WALL + driver.now)
    assert fold(driver.drained) == fold(snapshot)

    fresh, fresh_classic = engine(driver.image)
    fresh.load(driver.drained, driver.now, WALL + driver.now)
    original = core.groups.get(G)
    loaded = fresh.groups.get(G)
    assert (original is None) == (loaded is None)
    if original is None or loaded is None:
        return
    assert group_differences(loaded, original) == []
    # What the examples reach: --hypothesis-show-statistics.
    for member in original.members.values():
        event(f"a member {member.state.name}")
        if member.classic is not None:
            event(f"a classic member {member.classic.state.name}")
        if member.member_epoch == -2:
            event("a static member away")
        if member.subscribed_topic_regex:
            event("a regex subscription")

    now = driver.now + 1
    for member_id in sorted(original.members):
        member = original.members[member_id]
        if member.member_epoch < 0:
            continue
        theirs: object
        mine: object
        if member.protocol is MemberProtocol.CLASSIC:
            request = HeartbeatRequest(G, member_id, _generation(member))
            theirs = driver.classic.heartbeat(request, now)[0]
            mine = fresh_classic.heartbeat(request, now)[0]
        else:
            beat = hb(G, member_id, member.member_epoch, owned_now(core, member_id))
            theirs = core.heartbeat(beat, now)[0]
            mine = fresh.heartbeat(beat, now)[0]
        assert _normalized(mine) == _normalized(theirs), member_id
    assert group_differences(loaded, original) == []
    assert fold(fresh.drain_records(WALL)) == fold(core.drain_records(WALL))
