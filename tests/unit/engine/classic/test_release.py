"""Handing a group back to the broker's classic coordinator (a release): what the engine
says of each member, which protocol the broker's group will select, tombstones, and held
classic requests."""

from __future__ import annotations

import pytest

from translation.classic.messages import HeldRequest
from translation.classic.migration import RELEASED_DEFAULT_PROTOCOL, released_protocol
from translation.config import MigrationPolicy
from translation.effects import GroupReleased, JoinCompleted
from translation.errors import ErrorCode

from ..helpers import FOO, ScriptedAssignor, hb, image, join, target
from .helpers import Classic, G, join_req


def mixed() -> Classic:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a, migration_policy=MigrationPolicy.BIDIRECTIONAL,
                   durable_state=True)
    a.next = target(c1={FOO: [0, 1]}, n1={FOO: [2, 3]})
    c.joined(join_req("c1", protocols=("cooperative-sticky", "range")))
    c.engine.heartbeat(join(G, "n1"), 0)
    c.engine.drain_records(0)
    return c


def test_release_carries_every_member_over_with_what_it_may_own() -> None:
    c = mixed()
    n1 = c.engine.groups[G].members["n1"]
    released, effects = c.classic.release(G, "groupgate release")
    assert released is not None and released in effects
    assert G not in c.engine.groups
    assert c.engine.next_deadline() is None  # no timer of the group is left
    by_id = {m.member_id: m for m in released.members}
    assert set(by_id) == {"c1", "n1"}
    assert not by_id["c1"].consumer_protocol and by_id["n1"].consumer_protocol
    assert by_id["n1"].member_epoch == n1.member_epoch > 0
    assert dict(by_id["n1"].owned) == {"foo": (2, 3)}
    assert by_id["n1"].subscribed_topic_names == ("foo",)
    assert released.protocol == "cooperative-sticky"
    assert released.reason == "groupgate release"


def test_release_writes_tombstones() -> None:
    c = mixed()
    c.classic.release(G, "groupgate release")
    records = c.engine.drain_records(0)
    assert records and all(r.value is None for r in records)


def test_a_partition_pending_revocation_counts_as_owned() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a)
    a.next = target(n1={FOO: [0, 1, 2, 3]})
    c.engine.heartbeat(join(G, "n1"), 0)
    c.engine.heartbeat(hb(G, "n1", 1, {FOO: [0, 1, 2, 3]}), 100)
    a.next = target(n1={FOO: [0, 1]}, n2={FOO: [2, 3]})
    c.engine.heartbeat(join(G, "n2"), 2_000)
    c.engine.heartbeat(hb(G, "n1", 1, {FOO: [0, 1, 2, 3]}), 2_100)  # told to revoke 2, 3
    member = c.engine.groups[G].members["n1"]
    assert {p for ps in member.pending_revocation.values() for p in ps} == {2, 3}
    released, _ = c.classic.release(G, "test")
    assert released is not None
    owned = dict(next(m for m in released.members if m.member_id == "n1").owned)
    assert owned == {"foo": (0, 1, 2, 3)}
    assert dict(next(m for m in released.members if m.member_id == "n2").owned) == {}


def test_a_held_join_is_answered_rebalance_in_progress() -> None:
    a = ScriptedAssignor()
    c = Classic.of(image(foo=(FOO, 4)), a, assignment_interval_ms=1000)
    a.next = target(c1={FOO: [0, 1, 2, 3]})
    r = c.joined(join_req("c1"), now=0)
    c.sync("c1", r.generation_id)
    a.next = target(c1={FOO: [0, 1]}, c2={FOO: [2, 3]})
    assert isinstance(c.join(join_req("c2"), now=100), HeldRequest)
    _released, effects = c.classic.release(G, "test")
    answers = [e for e in effects if isinstance(e, JoinCompleted)]
    assert [(e.member_id, e.response.error_code) for e in answers] == [
        ("c2", ErrorCode.REBALANCE_IN_PROGRESS)]


def test_releasing_an_unknown_group_does_nothing() -> None:
    c = mixed()
    assert c.classic.release("other", "test") == (None, [])


@pytest.mark.parametrize(
    ("protocols", "selected"),
    [
        ([], RELEASED_DEFAULT_PROTOCOL),
        ([("range",)], "range"),
        ([("cooperative-sticky", "range"), ("range",)], "range"),
        ([("cooperative-sticky", "range"), ("cooperative-sticky", "range")],
         "cooperative-sticky"),
        ([("range", "roundrobin"), ("roundrobin", "range")], "range"),
        ([("my-assignor",)], None),
        ([("range",), ("roundrobin",)], None),
    ],
)
def test_the_protocol_the_broker_will_select(protocols: list[tuple[str, ...]],
                                              selected: str | None) -> None:
    assert released_protocol(protocols) == selected


def test_the_effect_is_typed() -> None:
    c = mixed()
    released, _ = c.classic.release(G, "test")
    assert isinstance(released, GroupReleased)


def test_the_release_marker_behind_the_tombstones_loads_no_group() -> None:
    """The record a released group leaves (version 1: a ``GROUP`` record) says where it went
    and when; folded behind the tombstones it is the group's only record, and this build's
    load takes it for what it is: no group."""
    from translation.durable import release_marker, released_to
    from translation.records import decode_record, encode_record, fold

    c = mixed()
    epoch = c.engine.groups[G].group_epoch
    c.classic.release(G, "groupgate release")
    records = [*c.engine.drain_records(0), release_marker(G, "classic", epoch, 1234)]
    read_back = [decode_record(*encode_record(r)) for r in records]
    live = {k: v for k, v in fold(read_back).items() if v is not None}
    assert list(live) == [records[-1].key]
    value = live[records[-1].key]
    assert released_to(value) == "classic"
    assert getattr(value, "empty_since_wall_ms", None) == 1234
    assert released_to(None) is None
    assert c.engine.load_group(G, read_back, 0, 0) == []
    assert G not in c.engine.groups
