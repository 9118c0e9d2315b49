"""Offset commits from classic members: the generation is the member epoch; a mismatch or a
zombie commit is ILLEGAL_GENERATION (never STALE_MEMBER_EPOCH, which classic clients do not
know); old OffsetCommit versions are fine for them."""

from __future__ import annotations

from translation.config import OffsetCommitRule

from ..helpers import FOO, ScriptedAssignor, image, target
from .helpers import Classic, E, G, join_req


def group(rule: OffsetCommitRule = OffsetCommitRule.RELAXED) -> Classic:
    """m1 held foo-0..3 at epoch 1; m2 joined (epoch 2) and took foo-2,3 after m1 revoked."""
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a, rule=rule)
    a.next = target(m1={FOO: [0, 1, 2, 3]})
    c.joined(join_req("m1"))
    c.sync("m1", 1)
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2, 3]})
    c.joined(join_req("m2"))
    c.beat("m1", 1)
    c.joined(join_req("m1", owned={"foo": [0, 1]}))
    c.sync("m1", 2)
    c.beat("m2", 2)
    c.joined(join_req("m2"))
    c.sync("m2", 2)
    return c


def commit(c: Classic, member: str, generation: int, *ps: int, **kw: object) -> E:
    return c.engine.validate_offset_commit(G, member, generation, [(FOO, p) for p in ps], **kw)  # type: ignore[arg-type]


def test_generation_equal_to_the_member_epoch_is_accepted_with_any_version() -> None:
    c = group()
    assert commit(c, "m1", 2, 0, 1) is E.NONE
    assert commit(c, "m1", 2, 0, api_version=2) is E.NONE  # classic clients use old versions


def test_generation_mismatch_is_illegal_generation() -> None:
    c = group()
    assert commit(c, "m1", 3, 0) is E.ILLEGAL_GENERATION
    strict = group(OffsetCommitRule.STRICT)
    assert commit(strict, "m1", 1, 0) is E.ILLEGAL_GENERATION


def test_zombie_commit_for_a_partition_now_held_by_another_member() -> None:
    c = group()
    # m1 owned foo-2 at generation 1 and 2; it is m2's now.
    assert commit(c, "m1", 2, 2) is E.ILLEGAL_GENERATION
    assert commit(c, "m1", 1, 2) is E.ILLEGAL_GENERATION
    assert commit(c, "m2", 2, 2) is E.NONE


def test_unknown_member() -> None:
    c = group()
    assert commit(c, "nobody", 2, 0) is E.UNKNOWN_MEMBER_ID
