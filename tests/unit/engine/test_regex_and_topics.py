"""Regex subscriptions (RE2, full match) and topic metadata changes (partitions added, topics
created, deleted, recreated with a new id)."""

from __future__ import annotations

import uuid
from dataclasses import replace

from translation.effects import GroupEpochBumped
from translation.errors import ErrorCode
from translation.regex import TopicRights, resolve

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


def rights(checked: set[str], allowed: set[str]) -> TopicRights:
    return TopicRights(frozenset(checked), frozenset(allowed))


def test_a_regex_resolves_to_the_topics_its_member_may_describe() -> None:
    """Kafka keeps of a regex's matches only the topics the member whose heartbeat resolved it
    may DESCRIBE: the regex matches foo and fizz, the member may describe only foo."""
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2), fizz=(BAZ, 1), bar=(BAR, 1)), a)
    assert engine.regex_topics_to_check(G, "f.*") == {"foo", "fizz"}
    a.next = target(m={FOO: [0, 1]})
    resp, _ = engine.heartbeat(replace(join(G, "m", topics=None, regex="f.*"),
                                       topic_rights=rights({"foo", "fizz"}, {"foo"})), 0)
    group = engine.groups[G]
    assert group.resolved_regex == {"f.*": frozenset({"foo"})}
    assert a.calls[-1].members["m"].subscribed_topic_ids == {FOO}
    assert group.subscription_metadata == {FOO: 2}
    assert assignment(resp) == {FOO: [0, 1]}  # progress: the allowed topic is assigned
    # nothing left to check: a steady heartbeat asks for no rights
    assert engine.regex_topics_to_check(G, None) is None


def test_a_topic_created_later_waits_for_a_heartbeat_with_rights_for_it() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a)
    engine.heartbeat(replace(join(G, "m", topics=None, regex="f.*"),
                             topic_rights=rights({"foo"}, {"foo"})), 0)
    group = engine.groups[G]
    # fizz appears: not checked under the member's rights, so not resolved (no bump)
    assert engine.update_topics(image(foo=(FOO, 2), fizz=(BAZ, 3)), 10) == []
    assert group.resolved_regex == {"f.*": frozenset({"foo"})}
    assert engine.regex_topics_to_check(G, None) == {"foo", "fizz"}
    # the member's next heartbeat brings its rights, which allow fizz: resolved, one bump
    a.next = target(m={FOO: [0, 1], BAZ: [0, 1, 2]})
    resp, effects = engine.heartbeat(replace(hb(G, "m", 1),
                                             topic_rights=rights({"foo", "fizz"},
                                                                 {"foo", "fizz"})), 30)
    assert group.resolved_regex == {"f.*": frozenset({"foo", "fizz"})}
    assert [e.group_epoch for e in effects if isinstance(e, GroupEpochBumped)] == [2]
    assert assignment(resp) == {FOO: [0, 1], BAZ: [0, 1, 2]}
    assert engine.regex_topics_to_check(G, None) is None


def test_the_group_regexes_resolve_under_the_rights_of_the_member_that_triggers_it() -> None:
    """As at Kafka: a member bringing a new regex resolves every regex of the group under its
    own rights (the other member's regex loses a topic this one may not describe)."""
    engine = make_engine(image(foo=(FOO, 2), fizz=(BAZ, 1), bar=(BAR, 1)),
                         ScriptedAssignor())
    engine.heartbeat(replace(join(G, "m1", topics=None, regex="f.*"),
                             topic_rights=rights({"foo", "fizz"}, {"foo", "fizz"})), 0)
    group = engine.groups[G]
    assert group.resolved_regex == {"f.*": frozenset({"foo", "fizz"})}
    assert engine.regex_topics_to_check(G, "b.*") == {"foo", "fizz", "bar"}
    engine.heartbeat(replace(join(G, "m2", topics=None, regex="b.*"),
                             topic_rights=rights({"foo", "fizz", "bar"}, {"foo", "bar"})), 10)
    assert group.resolved_regex == {"f.*": frozenset({"foo"}), "b.*": frozenset({"bar"})}
    # the last regex member leaves: the rights are forgotten with the regexes
    engine.heartbeat(hb(G, "m1", -1), 20)
    engine.heartbeat(hb(G, "m2", -1), 20)
    assert group.regex_rights is None and not group.resolved_regex


def test_a_group_resolved_without_rights_is_resolved_again_under_the_first_ones() -> None:
    """A group loaded from the state log (or taken over) has its regexes resolved without
    rights: the first heartbeat that brings rights resolves them under those."""
    engine = make_engine(image(foo=(FOO, 2), fizz=(BAZ, 1)), ScriptedAssignor())
    engine.heartbeat(join(G, "m", topics=None, regex="f.*"), 0)
    group = engine.groups[G]
    assert group.resolved_regex == {"f.*": frozenset({"foo", "fizz"})}
    assert engine.regex_topics_to_check(G, None) == {"foo", "fizz"}
    _, effects = engine.heartbeat(replace(hb(G, "m", 1),
                                          topic_rights=rights({"foo", "fizz"}, {"foo"})), 10)
    assert group.resolved_regex == {"f.*": frozenset({"foo"})}
    assert any(isinstance(e, GroupEpochBumped) for e in effects)


def test_topics_the_rights_did_not_check_keep_their_resolution() -> None:
    """A member joining a group taken over (its other regex resolved without rights) brings
    rights for its own regex only: the other regex keeps its topics (no revocation) until a
    heartbeat brings rights for them too."""
    engine = make_engine(image(foo=(FOO, 2), fizz=(BAZ, 1), bar=(BAR, 1)),
                         ScriptedAssignor())
    engine.heartbeat(join(G, "m1", topics=None, regex="f.*"), 0)
    group = engine.groups[G]
    engine.heartbeat(replace(join(G, "m2", topics=None, regex="b.*"),
                             topic_rights=rights({"bar"}, {"bar"})), 10)
    assert group.resolved_regex == {"f.*": frozenset({"foo", "fizz"}),
                                    "b.*": frozenset({"bar"})}
    assert engine.regex_topics_to_check(G, None) == {"foo", "fizz", "bar"}
    engine.heartbeat(replace(hb(G, "m1", group.members["m1"].member_epoch),
                             topic_rights=rights({"foo", "fizz", "bar"}, {"foo", "bar"})), 20)
    assert group.resolved_regex == {"f.*": frozenset({"foo"}), "b.*": frozenset({"bar"})}


def test_a_new_regex_is_resolved_under_the_rights_even_for_topics_they_did_not_check() -> None:
    """The proxy asked before its metadata had the topics (nothing checked); by the time the
    engine resolves the regex they exist: none is resolved until rights that checked it come."""
    engine = make_engine(image(foo=(FOO, 2), fizz=(BAZ, 1)), ScriptedAssignor())
    engine.heartbeat(replace(join(G, "m", topics=None, regex="f.*"),
                             topic_rights=rights(set(), set())), 0)
    group = engine.groups[G]
    assert group.resolved_regex == {"f.*": frozenset()}
    assert engine.regex_topics_to_check(G, None) == {"foo", "fizz"}
    engine.heartbeat(replace(hb(G, "m", 1), topic_rights=rights({"foo", "fizz"}, {"foo"})), 10)
    assert group.resolved_regex == {"f.*": frozenset({"foo"})}


def test_a_heartbeat_without_rights_resolves_what_is_due_over_every_topic() -> None:
    """A member behind another sidecar brings no rights: a topic created since the group's
    rights were asked does not wait for a member whose rights come along (the group may have
    none left); it is resolved as without authorization, and filtered again by the next
    rights."""
    engine = make_engine(image(foo=(FOO, 2)), ScriptedAssignor())
    engine.heartbeat(replace(join(G, "local", topics=None, regex="f.*"),
                             topic_rights=rights({"foo"}, {"foo"})), 0)
    engine.heartbeat(join(G, "relayed", topics=None, regex="f.*"), 1)
    group = engine.groups[G]
    engine.update_topics(image(foo=(FOO, 2), fizz=(BAZ, 1)), 10)
    assert group.resolved_regex == {"f.*": frozenset({"foo"})}
    _, effects = engine.heartbeat(hb(G, "relayed", group.members["relayed"].member_epoch), 20)
    assert group.resolved_regex == {"f.*": frozenset({"foo", "fizz"})}
    assert any(isinstance(e, GroupEpochBumped) for e in effects)
    engine.heartbeat(replace(hb(G, "local", group.members["local"].member_epoch),
                             topic_rights=rights({"foo", "fizz"}, {"foo"})), 30)
    assert group.resolved_regex == {"f.*": frozenset({"foo"})}
