"""Only members that lose or gain partitions are disturbed: quiet advance and held SyncGroups.

A classic member whose target the new group epoch leaves untouched is advanced in place and
keeps its generation; a member waiting for partitions others still own has its SyncGroup held
and answered the moment they are released (or, with what is free, when the hold runs out).
"""

from __future__ import annotations

from translation.classic.messages import HeldRequest, LeavingMember
from translation.config import OffsetCommitRule
from translation.effects import MemberFenced, SyncCompleted

from ..helpers import FOO, ScriptedAssignor, hb, image, join, target
from .helpers import Classic, E, G, join_req, names


def stable_pair(**config: object) -> tuple[Classic, ScriptedAssignor]:
    """m1 holds foo-0,1,2 and m2 foo-3,4,5, both stable at generation 2."""
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 6)), a, **config)
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4, 5]})
    r1 = c.joined(join_req("m1"))
    assert names(c.sync("m1", r1.generation_id)) == {"foo": [0, 1, 2]}
    r2 = c.joined(join_req("m2"))
    assert names(c.sync("m2", r2.generation_id)) == {"foo": [3, 4, 5]}
    if c.beat("m1", r1.generation_id) == E.REBALANCE_IN_PROGRESS:  # Kafka's behaviour
        r1 = c.joined(join_req("m1", owned={"foo": [0, 1, 2]}))
        assert names(c.sync("m1", r1.generation_id)) == {"foo": [0, 1, 2]}
    assert c.beat("m1", r1.generation_id) == E.NONE and c.beat("m2", 2) == E.NONE
    return c, a


# -- quiet advance ------------------------------------------------------------------------------


def test_a_member_whose_partitions_stay_is_not_asked_to_rejoin() -> None:
    c, a = stable_pair()
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4]}, m3={FOO: [5]})
    c.joined(join_req("m3"))
    group = c.engine.groups[G]
    assert c.beat("m1", 1) == E.NONE  # untouched: advanced in place
    m1 = group.members["m1"]
    assert m1.member_epoch == group.target.epoch == 3
    assert m1.classic is not None and m1.classic.generation == 1
    assert c.beat("m2", 2) == E.REBALANCE_IN_PROGRESS  # loses foo-5
    # m1's commits at the generation it knows stay valid for what it owns ...
    assert c.engine.validate_offset_commit(G, "m1", 1, [(FOO, 0), (FOO, 2)]) == E.NONE
    # ... and still fence partitions it does not own.
    assert c.engine.validate_offset_commit(G, "m1", 1, [(FOO, 3)]) == E.ILLEGAL_GENERATION
    # The generation the client does not know is refused as before.
    assert c.beat("m1", 3) == E.ILLEGAL_GENERATION


def test_kafka_behaviour_when_quiet_advance_is_off() -> None:
    c, a = stable_pair(quiet_classic_advance=False)
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4]}, m3={FOO: [5]})
    c.joined(join_req("m3"))
    assert c.beat("m1", 2) == E.REBALANCE_IN_PROGRESS


def test_no_quiet_advance_under_the_strict_commit_rule() -> None:
    c, a = stable_pair(rule=OffsetCommitRule.STRICT)
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4]}, m3={FOO: [5]})
    c.joined(join_req("m3"))
    assert c.beat("m1", 2) == E.REBALANCE_IN_PROGRESS


def test_a_member_that_gains_partitions_still_rejoins() -> None:
    c, a = stable_pair()
    a.next = target(m1={FOO: [0, 1, 2, 3, 4, 5]})
    c.leave(LeavingMember("m2"))
    assert c.beat("m1", 1) == E.REBALANCE_IN_PROGRESS


# -- held SyncGroup -------------------------------------------------------------------------------


def scale_out(**config: object) -> Classic:
    """m3 joins and is to get foo-2 (from m1) and foo-5 (from m2); its SyncGroup is held."""
    c, a = stable_pair(**config)
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [3, 4]}, m3={FOO: [2, 5]})
    r3 = c.joined(join_req("m3", session_timeout_ms=10_000), now=100)
    assert r3.generation_id == 3
    assert isinstance(c.sync("m3", 3, now=100), HeldRequest)
    return c


def test_held_sync_is_answered_when_the_last_partition_is_released() -> None:
    c = scale_out()
    assert c.beat("m1", 1, now=200) == E.REBALANCE_IN_PROGRESS
    c.joined(join_req("m1", owned={}), now=210)  # eager: gives up everything
    assert "m3" not in c.synced()  # foo-5 is still m2's
    assert c.beat("m3", 3, now=300) == E.NONE  # a heartbeat while held keeps the session
    assert c.beat("m2", 2, now=400) == E.REBALANCE_IN_PROGRESS
    c.joined(join_req("m2", owned={"foo": [3, 4]}), now=410)  # cooperative: revoked foo-5
    assert names(c.synced()["m3"]) == {"foo": [2, 5]}
    assert c.engine.groups[G].members["m3"].classic.generation == 3  # type: ignore[union-attr]


def test_held_sync_is_answered_when_the_owner_leaves() -> None:
    c = scale_out()
    c.joined(join_req("m1", owned={}), now=200)
    c.leave(LeavingMember("m2"), now=300)
    response = c.synced()["m3"]
    # m2's departure bumped the epoch again: m3 is told to rejoin for the new target.
    assert response.error_code in (E.NONE, E.REBALANCE_IN_PROGRESS)
    assert c.engine.groups[G].owners.owner(FOO, 5) != "m2"


def test_held_sync_is_answered_when_the_owners_session_expires() -> None:
    c = scale_out()
    c.joined(join_req("m1", owned={}), now=200)
    c.beat("m3", 3, now=2_000)
    effects = c.tick(10_000)  # m2's session (10 s from its last heartbeat at 0)
    assert MemberFenced(G, "m2", "session-timeout") in effects
    assert "m3" in c.synced()


def test_held_sync_is_answered_when_a_new_protocol_owner_revokes() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a)
    a.next = target(n1={FOO: [0, 1, 2, 3]})
    c.engine.heartbeat(join(G, "n1"), 0)
    a.next = target(n1={FOO: [0, 1]}, m1={FOO: [2, 3]})
    r = c.joined(join_req("m1"), now=10)
    assert isinstance(c.sync("m1", r.generation_id, now=10), HeldRequest)
    _, effects = c.engine.heartbeat(hb(G, "n1", 1, {FOO: {0, 1, 2, 3}}), 20)
    assert not any(isinstance(e, SyncCompleted) for e in effects)  # n1 still owns foo-2,3
    _, effects = c.engine.heartbeat(hb(G, "n1", 1, {FOO: {0, 1}}), 30)
    done = [e for e in effects if isinstance(e, SyncCompleted)]
    assert len(done) == 1 and names(done[0].response) == {"foo": [2, 3]}


def test_held_sync_gets_what_is_free_when_the_hold_runs_out() -> None:
    c = scale_out()
    c.joined(join_req("m1", owned={}), now=200)  # foo-2 free; m2 never revokes foo-5
    c.tick(3_099)
    assert "m3" not in c.synced()
    c.tick(3_100)  # classic_sync_hold_ms = 3 s after the SyncGroup at 100
    assert names(c.synced()["m3"]) == {"foo": [2]}
    # It collects foo-5 later, through a heartbeat and another round.
    assert c.beat("m3", 3, now=3_200) == E.NONE


def test_hold_is_bounded_by_half_the_session_timeout() -> None:
    c, a = stable_pair()
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [3, 4]}, m3={FOO: [2, 5]})
    r3 = c.joined(join_req("m3", session_timeout_ms=6_000), now=0)
    assert isinstance(c.sync("m3", r3.generation_id, now=0), HeldRequest)
    c.tick(2_999)
    assert "m3" not in c.synced()
    c.tick(3_000)
    assert names(c.synced()["m3"]) == {}


def test_holding_can_be_switched_off() -> None:
    c, a = stable_pair(classic_sync_hold_ms=0)
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [3, 4]}, m3={FOO: [2, 5]})
    r3 = c.joined(join_req("m3"))
    assert names(c.sync("m3", r3.generation_id)) == {}


def test_the_held_member_leaving_or_syncing_again_answers_the_held_request() -> None:
    c = scale_out()
    c.leave(LeavingMember("m3"), now=200)
    assert c.synced()["m3"].error_code == E.UNKNOWN_MEMBER_ID
    c = scale_out()
    assert isinstance(c.sync("m3", 3, now=200), HeldRequest)
    assert c.synced()["m3"].error_code == E.REBALANCE_IN_PROGRESS
    c = scale_out()
    assert c.join(join_req("m3"), now=200) is not None
    assert c.synced()["m3"].error_code == E.REBALANCE_IN_PROGRESS


def test_session_is_kept_while_the_sync_is_held() -> None:
    c = scale_out()  # session 10 s, hold 3 s: no heartbeat needed before 13.1 s
    c.joined(join_req("m1", owned={}), now=200)
    c.joined(join_req("m2", owned={}), now=300)
    assert "m3" in c.synced()
    assert not any(
        isinstance(e, MemberFenced) and e.member_id == "m3" for e in c.tick(10_200)
    )


def test_held_sync_stops_waiting_for_a_holder_stuck_in_its_callback() -> None:
    c = scale_out()
    # m1 is told at 200 and is stuck (cooperative: it rejoins still owning foo-2); m2 lets go.
    assert c.beat("m1", 1, now=200) == E.REBALANCE_IN_PROGRESS
    c.joined(join_req("m1", owned={"foo": [0, 1, 2]}), now=210)
    c.joined(join_req("m2", owned={}), now=300)
    assert "m3" not in c.synced()
    c.tick(699)
    assert "m3" not in c.synced()
    c.tick(700)  # m1 has known for SLOW_HOLDER_MS (500 ms): m3 takes what is free
    assert names(c.synced()["m3"]) == {"foo": [5]}
    assert c.engine.groups[G].owners.owner(FOO, 2) == "m1"


def test_an_eager_holder_stuck_before_rejoining_is_not_waited_for_either() -> None:
    c = scale_out()
    assert c.beat("m1", 1, now=200) == E.REBALANCE_IN_PROGRESS  # never rejoins
    c.joined(join_req("m2", owned={}), now=300)
    c.tick(700)
    assert names(c.synced()["m3"]) == {"foo": [5]}


def test_a_member_already_told_to_rejoin_is_not_advanced_quietly() -> None:
    """Its REBALANCE_IN_PROGRESS may have been lost, or its eager client may already have
    revoked everything: it rejoins (and its join timer still guards it)."""
    c, a = stable_pair()
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [3, 4, 5]}, m3={FOO: [2]})
    c.joined(join_req("m3"))
    assert c.beat("m1", 1) == E.REBALANCE_IN_PROGRESS
    a.next = target(m1={FOO: [0, 1, 2]}, m2={FOO: [3, 4, 5]})
    c.leave(LeavingMember("m3"))  # m1's target is its assignment again
    assert c.beat("m1", 1) == E.REBALANCE_IN_PROGRESS
