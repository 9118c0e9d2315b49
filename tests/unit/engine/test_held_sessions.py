"""A member's session does not run while its request is inside the proxy
(:mod:`translation.held_sessions`): the engine half of the rule that ties the proxy's waits
to member sessions (docs/operations.md, "How long a request can wait")."""

from __future__ import annotations

from translation.assignors.uniform import UniformAssignor
from translation.effects import MemberFenced

from .helpers import FOO, hb, image, join, make_engine

G = "g"
SESSION = 6_000


def engine_with_member():  # type: ignore[no-untyped-def]
    engine = make_engine(image(foo=(FOO, 2)), UniformAssignor(), session_timeout_ms=SESSION)
    response, _ = engine.heartbeat(join(G, "m", rebalance_timeout_ms=60_000), 0)
    assert response.error_code == 0
    return engine


def fenced(effects: list[object]) -> bool:
    return any(isinstance(e, MemberFenced) for e in effects)


def test_a_session_does_not_expire_while_the_members_request_is_inside() -> None:
    engine = engine_with_member()
    engine.request_arrived(G, "m", 1_000)  # 5 s of its session left
    assert not fenced(engine.tick(20_000))  # held 19 s: far past the session
    assert "m" in engine.groups[G].members
    effects = engine.request_left(G, "m", 20_000)
    assert engine.next_deadline() == 25_000  # the 5 s it had left
    assert not fenced(effects + engine.tick(24_999))
    assert fenced(engine.tick(25_000))


def test_a_heartbeat_handled_while_held_leaves_a_full_session() -> None:
    engine = engine_with_member()
    engine.request_arrived(G, "m", 5_500)  # a commit waits; 0.5 s left
    engine.request_arrived(G, "m", 5_600)  # the heartbeat behind it
    engine.heartbeat(hb(G, "m", 1, {FOO: [0, 1]}), 12_000)
    engine.request_left(G, "m", 12_001)
    assert not fenced(engine.tick(12_500))
    engine.request_left(G, "m", 12_002)
    assert not fenced(engine.tick(18_001))
    assert fenced(engine.tick(18_002))  # a full session after the last one left


def test_a_hold_that_outlives_the_rebalance_timeout_stops_protecting() -> None:
    engine = engine_with_member()
    engine.request_arrived(G, "m", 0)
    assert not fenced(engine.tick(59_999))
    assert fenced(engine.tick(60_000))  # its end was never reported: bounded


def test_requests_of_unknown_members_and_groups_are_ignored() -> None:
    engine = engine_with_member()
    engine.request_arrived("other", "m", 0)
    engine.request_arrived(G, "stranger", 0)
    assert engine.request_left(G, "stranger", 1) == []
    assert len(engine.groups[G].held_sessions) == 0
    assert fenced(engine.tick(6_000))  # nothing held: fenced on time
