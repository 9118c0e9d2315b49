"""Regex subscriptions (RE2, full match) and topic metadata changes (partitions added, topics
created, deleted, recreated with a new id)."""

from __future__ import annotations

import uuid

from translation.effects import GroupEpochBumped
from translation.errors import ErrorCode
from translation.regex import resolve

from .helpers import BAR, FOO, ScriptedAssignor, assignment, hb, image, join, make_engine, target

G = "g"
BAZ = uuid.UUID(int=0xBA3)


def test_regex_is_a_full_match_with_re2_syntax() -> None:
    topics = image(foo=(FOO, 1), foobar=(BAR, 1), __consumer_offsets=(BAZ, 50))
    assert resolve("foo", topics) == {"foo"}
    assert resolve("foo.*", topics) == {"foo", "foobar"}
    assert resolve(".*", topics) == {"foo", "foobar"}  # internal topics never match


def test_invalid_regex_is_rejected() -> None:
    engine = make_engine(image(foo=(FOO, 1)), ScriptedAssignor())
    for bad in ("(", "a{2,1}", "(?=lookahead)", "\\"):
        resp, _ = engine.heartbeat(join(G, "m", topics=None, regex=bad), 0)
        assert resp.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION, bad


def test_regex_subscription_gets_the_matching_topics() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2), bar=(BAR, 1)), a)
    a.next = target(m={FOO: [0, 1]})
    engine.heartbeat(join(G, "m", topics=None, regex="f.."), 0)
    assert a.calls[-1].members["m"].subscribed_topic_ids == {FOO}
    group = engine.groups[G]
    assert group.subscription_metadata == {FOO: 2} and group.group_epoch == 1


def test_epoch_bumped_once_a_new_topic_matches_the_regex() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a)
    engine.heartbeat(join(G, "m", topics=None, regex="f.*"), 0)
    group = engine.groups[G]
    # A topic the regex does not match: nothing happens.
    assert engine.update_topics(image(foo=(FOO, 2), bar=(BAR, 1)), 10) == []
    assert group.group_epoch == 1
    # A matching topic: one bump (resolution and metadata change together).
    effects = engine.update_topics(image(foo=(FOO, 2), bar=(BAR, 1), fizz=(BAZ, 3)), 20)
    assert [e.group_epoch for e in effects if isinstance(e, GroupEpochBumped)] == [2]
    assert group.resolved_regex == {"f.*": frozenset({"foo", "fizz"})}
    a.next = target(m={FOO: [0, 1], BAZ: [0, 1, 2]})
    resp, _ = engine.heartbeat(hb(G, "m", 1), 30)
    assert a.calls[-1].members["m"].subscribed_topic_ids == {FOO, BAZ}
    assert assignment(resp) == {FOO: [0, 1], BAZ: [0, 1, 2]}


def test_partitions_added_to_an_unsubscribed_topic_do_not_bump() -> None:
    engine = make_engine(image(foo=(FOO, 2), bar=(BAR, 1)), ScriptedAssignor())
    engine.heartbeat(join(G, "m"), 0)
    assert engine.update_topics(image(foo=(FOO, 2), bar=(BAR, 5)), 10) == []
    assert engine.groups[G].group_epoch == 1


def test_topic_deleted_and_recreated_with_a_new_id() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a)
    a.next = target(m={FOO: [0, 1]})
    engine.heartbeat(join(G, "m"), 0)
    group = engine.groups[G]

    new_foo = uuid.UUID(int=0xF01)
    effects = engine.update_topics(image(foo=(new_foo, 2)), 10)
    assert any(isinstance(e, GroupEpochBumped) for e in effects)
    assert group.subscription_metadata == {new_foo: 2}
    a.next = target(m={new_foo: [0, 1]})
    # The old topic's partitions are revoked first, then the new topic's are assigned.
    resp, _ = engine.heartbeat(hb(G, "m", 1, {FOO: [0, 1]}), 20)
    assert (resp.member_epoch, assignment(resp)) == (1, {})
    resp, _ = engine.heartbeat(hb(G, "m", 1, {}), 30)
    assert (resp.member_epoch, assignment(resp)) == (2, {new_foo: [0, 1]})

    effects = engine.update_topics(image(), 40)
    assert any(isinstance(e, GroupEpochBumped) for e in effects)
    assert group.subscription_metadata == {}


def test_the_compiled_regex_cache_is_bounded_by_pattern_length() -> None:
    from translation import regex

    regex._compiled.clear()
    for i in range(300):  # 300 distinct 5 KiB patterns: 1.5 MB of pattern text
        regex.compile_regex(f"topic-{i}-" + "a?" * 2500)
    assert regex._compiled.currsize <= regex.CACHE_PATTERN_BYTES
    assert 0 < len(regex._compiled) < 300
    assert regex.compile_regex("topic-299-" + "a?" * 2500) is not None  # still compiles
