"""One test per member-state transition of the reconciliation (``translation.reconciliation``)."""

from __future__ import annotations

import pytest

from translation.errors import ErrorCode, GroupError
from translation.member import ConsumerGroupMember, MemberState
from translation.ownership import PartitionOwners
from translation.reconciliation import OwnedPartitions, reconcile

from .helpers import FOO

S = MemberState


def member(
    epoch: int,
    assigned: list[int],
    state: MemberState = S.STABLE,
    revoking: list[int] | None = None,
    assignment_epoch: int | None = None,
) -> tuple[ConsumerGroupMember, PartitionOwners]:
    m = ConsumerGroupMember("m", member_epoch=epoch, previous_member_epoch=epoch - 1, state=state)
    ae = epoch if assignment_epoch is None else assignment_epoch
    m.assigned = {FOO: dict.fromkeys(assigned, ae)} if assigned else {}
    m.pending_revocation = {FOO: dict.fromkeys(revoking, ae)} if revoking else {}
    owners = PartitionOwners()
    owners.add("m", FOO, assigned + (revoking or []))
    return m, owners


def tgt(*ps: int) -> dict:
    return {FOO: frozenset(ps)} if ps else {}


def owned(*ps: int) -> list:
    return [(FOO, list(ps))]


def test_stable_at_target_epoch_stays() -> None:
    m, owners = member(5, [0, 1])
    assert not reconcile(m, 5, tgt(0, 1), owners, owned(0, 1))
    assert (m.state, m.member_epoch) == (S.STABLE, 5)


def test_stable_to_stable_at_new_epoch() -> None:
    m, owners = member(5, [0], assignment_epoch=3)
    assert reconcile(m, 6, tgt(0, 1), owners, owned(0))
    assert (m.state, m.member_epoch, m.previous_member_epoch) == (S.STABLE, 6, 5)
    # kept partitions keep their assignment epoch; new ones get the target epoch
    assert m.assigned == {FOO: {0: 3, 1: 6}}
    assert owners.owner(FOO, 1) == "m"


def test_stable_to_unrevoked_partitions() -> None:
    m, owners = member(5, [0, 1, 2])
    assert reconcile(m, 6, tgt(0, 3), owners, owned(0, 1, 2))
    assert (m.state, m.member_epoch) == (S.UNREVOKED_PARTITIONS, 5)
    assert m.assigned == {FOO: {0: 5}} and m.pending_revocation == {FOO: {1: 5, 2: 5}}
    # revoking partitions stay held; foo-3 is not handed out before the revocation
    assert owners.owner(FOO, 1) == "m" and owners.owner(FOO, 3) is None


def test_stable_to_unreleased_partitions() -> None:
    m, owners = member(5, [0])
    owners.add("other", FOO, [1])
    assert reconcile(m, 6, tgt(0, 1, 2), owners, owned(0))
    assert (m.state, m.member_epoch) == (S.UNRELEASED_PARTITIONS, 6)
    assert m.assigned == {FOO: {0: 5, 2: 6}}


def test_unrevoked_stays_while_member_still_owns_revoked_partitions() -> None:
    m, owners = member(5, [0], S.UNREVOKED_PARTITIONS, revoking=[1])
    assert not reconcile(m, 6, tgt(0), owners, owned(0, 1))
    # a null owned list counts as "still owns"
    assert not reconcile(m, 6, tgt(0), owners, None)
    assert (m.state, m.member_epoch, owners.owner(FOO, 1)) == (S.UNREVOKED_PARTITIONS, 5, "m")


def test_unrevoked_to_stable_once_revoked() -> None:
    m, owners = member(5, [0], S.UNREVOKED_PARTITIONS, revoking=[1])
    assert reconcile(m, 6, tgt(0, 2), owners, owned(0))
    assert (m.state, m.member_epoch) == (S.STABLE, 6)
    assert m.assigned == {FOO: {0: 5, 2: 6}} and m.pending_revocation == {}
    assert owners.owner(FOO, 1) is None


def test_unrevoked_to_unreleased() -> None:
    m, owners = member(5, [0], S.UNREVOKED_PARTITIONS, revoking=[1])
    owners.add("other", FOO, [2])
    assert reconcile(m, 6, tgt(0, 2), owners, owned(0))
    assert (m.state, m.member_epoch, m.assigned) == (S.UNRELEASED_PARTITIONS, 6, {FOO: {0: 5}})


def test_unreleased_stays_while_partitions_are_held() -> None:
    m, owners = member(6, [0], S.UNRELEASED_PARTITIONS)
    owners.add("other", FOO, [1])
    reconcile(m, 6, tgt(0, 1), owners, owned(0))
    assert (m.state, m.member_epoch, m.assigned) == (S.UNRELEASED_PARTITIONS, 6, {FOO: {0: 6}})


def test_unreleased_to_stable_when_released() -> None:
    m, owners = member(6, [0], S.UNRELEASED_PARTITIONS)
    owners.add("other", FOO, [1])
    owners.remove("other", FOO, [1])
    assert reconcile(m, 6, tgt(0, 1), owners, owned(0))
    assert (m.state, m.assigned) == (S.STABLE, {FOO: {0: 6, 1: 6}})


def test_unreleased_to_unrevoked_when_the_target_moves_on() -> None:
    m, owners = member(6, [0, 1], S.UNRELEASED_PARTITIONS)
    owners.add("other", FOO, [2])
    assert reconcile(m, 7, tgt(0, 2), owners, owned(0, 1))
    assert (m.state, m.member_epoch) == (S.UNREVOKED_PARTITIONS, 6)
    assert m.pending_revocation == {FOO: {1: 6}}


def test_revocation_already_done_moves_straight_on() -> None:
    # The member reports it no longer owns foo-1 (e.g. it rejoined): no UNREVOKED detour.
    m, owners = member(5, [0, 1])
    assert reconcile(m, 6, tgt(0), owners, owned(0))
    assert (m.state, m.member_epoch, m.pending_revocation) == (S.STABLE, 6, {})
    assert owners.owner(FOO, 1) is None


def test_unknown_state_is_fenced_unless_it_owns_nothing() -> None:
    m, owners = member(5, [0], S.UNKNOWN)
    with pytest.raises(GroupError) as err:
        reconcile(m, 6, tgt(0), owners, owned(0))
    assert err.value.code is ErrorCode.FENCED_MEMBER_EPOCH
    with pytest.raises(GroupError):
        reconcile(m, 6, tgt(0), owners, None)
    assert reconcile(m, 6, tgt(0, 1), owners, [])
    assert (m.state, m.member_epoch) == (S.STABLE, 6)


def test_a_member_in_unknown_state_is_fenced_by_the_heartbeat_without_side_effects() -> None:
    from .helpers import ScriptedAssignor, hb, image, join, make_engine, target

    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a)
    a.next = target(m={FOO: [0, 1]})
    engine.heartbeat(join("g", "m"), 0)
    group = engine.groups["g"]
    group.members["m"].state = S.UNKNOWN
    resp, effects = engine.heartbeat(hb("g", "m", 1, {FOO: [0, 1]}), 1)
    assert resp.error_code == ErrorCode.FENCED_MEMBER_EPOCH and effects == []
    # Rejoining with nothing owned reconciles it from scratch.
    resp, _ = engine.heartbeat(join("g", "m"), 2)
    assert (resp.error_code, resp.member_epoch, group.members["m"].state) == (0, 1, S.STABLE)


@pytest.mark.parametrize(
    ("start", "target_epoch", "target", "reported", "bump_only"),
    [
        pytest.param((5, [0, 1], S.STABLE, None), 6, (0, 1), None, True, id="epoch-only"),
        pytest.param((5, [0], S.UNRELEASED_PARTITIONS, None), 6, (0,), owned(0), True,
                     id="unreleased-to-stable"),
        pytest.param((5, [0], S.STABLE, None), 6, (0, 1), None, False, id="added"),
        pytest.param((5, [0, 1], S.STABLE, None), 6, (0,), owned(0), False,
                     id="revoked-at-once"),
        pytest.param((5, [0], S.UNREVOKED_PARTITIONS, [1]), 6, (0,), owned(0), False,
                     id="revocation-acknowledged"),
        pytest.param((5, [0], S.UNREVOKED_PARTITIONS, [1]), 6, (0, 1), owned(0), False,
                     id="revoked-then-given-back"),
        pytest.param((5, [0, 1], S.STABLE, None), 6, (0,), None, False,
                     id="revoking-at-the-same-epoch"),
    ],
)
def test_whether_the_move_to_the_new_epoch_changed_only_the_epoch(
    start: tuple[int, list[int], MemberState, list[int] | None],
    target_epoch: int,
    target: tuple[int, ...],
    reported: OwnedPartitions | None,
    bump_only: bool,
) -> None:
    """What lets the lost-response rule accept the previous epoch without owned partitions."""
    epoch, assigned, state, revoking = start
    m, owners = member(epoch, assigned, state, revoking=revoking)
    m.epoch_bump_only = not bump_only
    assert reconcile(m, target_epoch, tgt(*target), owners, reported)
    assert m.epoch_bump_only is bump_only
