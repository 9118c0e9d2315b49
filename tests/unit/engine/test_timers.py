"""Timers: the lazy timer store, session timeout, rebalance timeout, empty-group expiry."""

from __future__ import annotations

from translation.effects import GroupExpired, MemberFenced, TimerArmed, TimerCancelled
from translation.group import GroupState
from translation.timers import TimerKey, TimerKind, Timers

from .helpers import FOO, ScriptedAssignor, hb, image, join, make_engine, target

G = "g"


def key(kind: TimerKind, member: str = "") -> TimerKey:
    return TimerKey(kind, G, member)


def test_timer_store() -> None:
    timers = Timers()
    a, b = key(TimerKind.SESSION, "a"), key(TimerKind.SESSION, "b")
    timers.schedule(a, 100)
    timers.schedule(b, 50)
    timers.schedule(a, 200)  # re-armed later: no heap push, found lazily
    assert timers.next_deadline() == 50
    assert timers.pop_due(99) == [(b, 0)]
    assert timers.pop_due(199) == []
    assert timers.next_deadline() == 200
    timers.schedule(a, 150, payload=7)  # earlier again
    assert timers.pop_due(1000) == [(a, 7)]
    timers.schedule(b, 10)
    assert timers.cancel(b) and not timers.cancel(b)
    assert timers.pop_due(1000) == [] and timers.next_deadline() is None
    timers.schedule(a, 10)
    assert timers.take_if_due(a, 9) == (False, 0)
    assert timers.take_if_due(a, 10) == (True, 0) and a not in timers


def test_session_timeout_is_rearmed_by_heartbeats() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a, session_timeout_ms=1000)
    a.next = target(m={FOO: [0, 1]})
    engine.heartbeat(join(G, "m"), 0)
    for t in (500, 1000, 1500):
        engine.heartbeat(hb(G, "m", 1), t)
        assert engine.tick(t) == []
    assert engine.next_deadline() == 2500
    assert engine.tick(2499) == []
    effects = engine.tick(2500)
    assert MemberFenced(G, "m", "session-timeout") in effects
    group = engine.groups[G]
    assert group.state is GroupState.EMPTY and group.owners.owner(FOO, 0) is None


def test_fire_matches_tick_and_ignores_rearmed_timers() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a, session_timeout_ms=1000)
    _, effects = engine.heartbeat(join(G, "m"), 0)
    armed = [e for e in effects if isinstance(e, TimerArmed)][-1]
    engine.heartbeat(hb(G, "m", 1), 600)
    assert engine.fire(armed.key, armed.deadline_ms) == []  # re-armed to 1600 since
    assert MemberFenced(G, "m", "session-timeout") in engine.fire(armed.key, 1600)


def test_rebalance_timeout_fences_a_member_that_does_not_revoke() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a, session_timeout_ms=60_000)
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(join(G, "m1", rebalance_timeout_ms=3000), 0)
    a.next = target(m1={FOO: [0]}, m2={FOO: [1]})
    engine.heartbeat(join(G, "m2"), 100)
    _, effects = engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 200)
    assert TimerArmed(key(TimerKind.REBALANCE, "m1"), 3200) in effects
    # Heartbeats that still report foo-1 do not extend the deadline.
    engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 2000)
    engine.heartbeat(hb(G, "m2", 2), 2000)
    effects = engine.tick(3200)
    assert MemberFenced(G, "m1", "rebalance-timeout") in effects
    group = engine.groups[G]
    assert "m1" not in group.members and group.owners.owner(FOO, 1) is None


def test_revoking_in_time_cancels_the_rebalance_timeout() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a)
    a.next = target(m1={FOO: [0, 1]})
    engine.heartbeat(join(G, "m1", rebalance_timeout_ms=3000), 0)
    a.next = target(m1={FOO: [0]}, m2={FOO: [1]})
    engine.heartbeat(join(G, "m2"), 100)
    engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 200)
    _, effects = engine.heartbeat(hb(G, "m1", 1, {FOO: [0]}), 1000)
    assert TimerCancelled(key(TimerKind.REBALANCE, "m1")) in effects
    assert not any(isinstance(e, MemberFenced) for e in engine.tick(3200))


def test_empty_group_expires_unless_someone_joins() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a, empty_group_expiry_ms=10_000)
    engine.heartbeat(join(G, "m"), 0)
    engine.heartbeat(hb(G, "m", -1), 100)
    assert engine.groups[G].state is GroupState.EMPTY
    engine.heartbeat(join(G, "n"), 5000)  # cancels the expiry
    _, _effects = engine.heartbeat(hb(G, "n", 2), 6000)
    assert engine.tick(10_100) == []
    engine.heartbeat(hb(G, "n", -1), 11_000)
    assert engine.tick(20_999) == []
    assert engine.tick(21_000) == [GroupExpired(G)]
    assert G not in engine.groups
    described = engine.describe([G])[0]
    assert described.group_state == "Dead" and described.error_code == 69


def test_target_computations_are_batched_by_the_assignment_interval() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 4)), a, assignment_interval_ms=1000)
    a.next = target(m0={FOO: [0, 1, 2, 3]})
    engine.heartbeat(join(G, "m0"), 0)
    assert len(a.calls) == 1  # the first computation is immediate
    group = engine.groups[G]
    for i in range(1, 4):
        resp, _ = engine.heartbeat(join(G, f"m{i}"), 10 * i)
        assert resp.member_epoch == 1 and resp.assignment == []  # old target, nothing yet
    assert len(a.calls) == 1 and group.group_epoch == 4 and group.target.epoch == 1
    assert group.state is GroupState.ASSIGNING
    assert engine.next_deadline() == 1000
    # The assignment timer runs the one computation that covers the three joins.
    a.next = target(m0={FOO: [0]}, m1={FOO: [1]}, m2={FOO: [2]}, m3={FOO: [3]})
    engine.tick(1000)
    assert len(a.calls) == 1 + 1 and group.target.epoch == 4
    assert set(a.calls[-1].members) == {"m0", "m1", "m2", "m3"}
    # A heartbeat after the interval computes directly.
    engine.heartbeat(hb(G, "m1", 1, {}), 1500)
    engine.heartbeat(hb(G, "m1", 4, {FOO: [1]}, subscribed_topic_names=["foo", "bar"]), 2100)
    assert len(a.calls) == 3 and group.target.epoch == 5


def test_timer_store_matches_a_simple_model() -> None:
    """Random schedule / cancel / pop sequences against a plain dict of deadlines."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    keys = [key(TimerKind.SESSION, str(i)) for i in range(4)]
    op = st.one_of(
        st.tuples(st.just("schedule"), st.sampled_from(keys), st.integers(0, 50)),
        st.tuples(st.just("cancel"), st.sampled_from(keys), st.just(0)),
        st.tuples(st.just("pop"), st.just(keys[0]), st.integers(0, 10)),
    )

    @settings(max_examples=300, deadline=None)
    @given(st.lists(op, max_size=40))
    def check(ops: list[tuple[str, TimerKey, int]]) -> None:
        timers, model, now = Timers(), {}, 0
        for name, k, value in ops:
            if name == "schedule":
                timers.schedule(k, now + value)
                model[k] = now + value
            elif name == "cancel":
                assert timers.cancel(k) == (k in model)
                model.pop(k, None)
            else:
                now += value
                due = sorted(k2 for k2, d in model.items() if d <= now)
                assert sorted(k2 for k2, _ in timers.pop_due(now)) == due
                for k2 in due:
                    del model[k2]
            assert timers.next_deadline() == (min(model.values()) if model else None)
            assert len(timers) == len(model)

    check()


def test_a_suspended_group_fences_nobody_and_resumes_with_full_sessions() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 2)), a, session_timeout_ms=1000)
    a.next = target(m={FOO: [0, 1]})
    engine.heartbeat(join(G, "m"), 0)
    engine.suspend(G)
    assert engine.tick(5000) == []  # the session timer came due, and waits
    assert "m" in engine.groups[G].members
    effects = engine.resume(G, 6000)
    assert TimerArmed(key(TimerKind.SESSION, "m"), 7000) in effects
    assert engine.tick(6999) == []
    assert MemberFenced(G, "m", "session-timeout") in engine.tick(7000)
    assert engine.resume(G, 8000) == []  # not suspended: nothing to do
