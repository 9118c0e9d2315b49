"""The fleet core, one scenario at a time: the table in its docstring is the code's, the
election, the lease, the write barrier, letting go, following; and it stays sans-I/O."""

from __future__ import annotations

import subprocess
import sys

import pytest

from proxy.fleet_core import core as core_module
from proxy.fleet_core import events as ev
from proxy.fleet_core.core import (
    TRANSITIONS,
    CoreConfig,
    FleetCoreError,
    GroupCore,
    Role,
    Why,
)
from translation.errors import ErrorCode

CONFIG = CoreConfig(session_ms=3_000, hold_ms=2_000, lookup_ms=1_000, view_ms=10_000,
                    let_go_ms=6_000, retry_ms=200)


def _of(actions: list[ev.Action], kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, kind)]


def _role(core: GroupCore) -> Role:
    """(Read through a call: mypy would narrow ``core.role`` across the events.)"""
    return core.role


def _coordinating(now: float = 0) -> GroupCore:
    """A core that won the election for an unused group and loaded it at ``now``."""
    core = GroupCore("g", "s0", CONFIG)
    out = core.handle(ev.Request(1, "", starts_group=True), now)
    (lookup,) = _of(out, ev.Lookup)
    out = core.handle(ev.LookedUp(lookup.attempt, ev.Shape.UNUSED), now)
    (join,) = _of(out, ev.SendJoin)
    out = core.handle(ev.JoinAnswered(join.attempt, ErrorCode.MEMBER_ID_REQUIRED, "m1"), now)
    (check,) = _of(out, ev.Lookup)
    out = core.handle(ev.LookedUp(check.attempt, ev.Shape.UNUSED), now)
    (join,) = _of(out, ev.SendJoin)
    assert join.member_id == "m1"
    out = core.handle(ev.JoinAnswered(join.attempt, ErrorCode.NONE, "m1", 1, "m1"), now)
    (sync,) = _of(out, ev.SendSync)
    out = core.handle(ev.SyncAnswered(sync.attempt, ErrorCode.NONE), now)
    assert _role(core) is Role.LOADING and _of(out, ev.Load)
    out = core.handle(ev.LoadDone(True), now)
    assert _role(core) is Role.COORDINATING
    assert out == [ev.RunEngine(1)]
    out = core.handle(ev.EngineDone(1, wrote=False), now)
    assert out == [ev.Respond(1)]
    return core


def test_the_documented_table_is_the_code_and_every_role_is_in_it() -> None:
    assert (Role.COORDINATING, Why.LEASE_PASSED) in TRANSITIONS
    assert TRANSITIONS[(Role.INTERRUPTED, Why.SESSION_PASSED)] is Role.LETTING_GO
    assert {r for r, _ in TRANSITIONS} | set(TRANSITIONS.values()) == set(Role)
    rows = [line for line in (core_module.__doc__ or "").splitlines()
            if line.split() and line.split()[0] in {r.value for r in Role} | {"any"}]
    assert len(rows) == 32


def test_a_move_outside_the_table_raises() -> None:
    core = GroupCore("g", "s0", CONFIG)
    with pytest.raises(FleetCoreError):
        core._move(Why.LOADED, 0, [])


def test_the_lease_passes_before_the_session_and_suspends_the_group() -> None:
    core = _coordinating()
    assert core.lease_deadline == 2_400 and core.session_deadline == 3_000
    out = core.tick(1_000)
    (hb,) = _of(out, ev.SendHeartbeat)
    out = core.handle(ev.Request(2, "a"), 2_399)
    assert ev.RunEngine(2) in out  # (with the heartbeat due at 2000)
    core.handle(ev.EngineDone(2, wrote=False), 2_399)
    # No heartbeat answered: at the lease's end nothing is answered any more.
    out = core.handle(ev.Request(3, "a"), 2_400)
    assert ev.Suspend() in out and _role(core) is Role.INTERRUPTED
    assert ev.Fail(3, ErrorCode.COORDINATOR_NOT_AVAILABLE) in out
    assert not core.acting(2_400)
    # The answer to the heartbeat sent at 1000 comes: the group is held again.
    out = core.handle(ev.HeartbeatAnswered(hb.attempt, ErrorCode.NONE), 2_500)
    assert _role(core) is Role.COORDINATING and ev.Resume() in out
    assert core.lease_deadline == 1_000 + 2_400


def test_a_sidecar_frozen_past_its_lease_acts_on_nothing_that_waited() -> None:
    core = _coordinating()
    # Frozen from 100 to 5000: the first thing it handles after waking is a request.
    out = core.handle(ev.Request(2, "a"), 5_000)
    assert ev.RunEngine(2) not in out and _role(core) is Role.LETTING_GO
    assert ev.Forget("no answer from the broker within a session") in out


def test_a_session_without_an_answer_lets_the_members_go_once() -> None:
    core = _coordinating()
    core.tick(2_400)
    assert _role(core) is Role.INTERRUPTED
    out = core.tick(3_000)
    assert _role(core) is Role.LETTING_GO and _of(out, ev.Forget) and _of(out, ev.SendLeave)
    core.handle(ev.Forgotten(frozenset({"a", "b"})), 3_000)
    assert core.handle(ev.Request(5, "a"), 3_100) == [ev.Fail(5, ErrorCode.UNKNOWN_MEMBER_ID)]
    assert core.handle(ev.Request(6, "a"), 3_200) == [
        ev.Fail(6, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
    core.tick(3_000 + CONFIG.let_go_ms)
    assert _role(core) is Role.ABSENT


def test_answers_wait_for_every_earlier_write_and_never_leave_after_the_lease() -> None:
    core = _coordinating()
    out = core.handle(ev.Request(2, "a"), 10)
    out = core.handle(ev.EngineDone(2, wrote=True), 10)
    assert out == [ev.Write(1)]
    core.handle(ev.Request(3, "b"), 20)
    out = core.handle(ev.EngineDone(3, wrote=False), 20)
    assert out == []  # it may carry what the unacknowledged unit 1 decided
    out = core.handle(ev.Written(1), 30)
    assert sorted(_of(out, ev.Respond), key=lambda r: r.rid) == [ev.Respond(2), ev.Respond(3)]
    core.handle(ev.Request(4, "a"), 40)
    core.handle(ev.EngineDone(4, wrote=True), 40)
    out = core.handle(ev.Written(2), 2_400)  # acknowledged after the lease passed
    assert ev.Fail(4, ErrorCode.COORDINATOR_NOT_AVAILABLE) in out
    assert not _of(out, ev.Respond)


def test_a_failed_write_gives_the_group_up() -> None:
    core = _coordinating()
    core.handle(ev.Request(2, "a"), 10)
    core.handle(ev.EngineDone(2, wrote=True), 10)
    out = core.handle(ev.WriteFailed(1), 20)
    assert _role(core) is Role.ABSENT
    assert ev.Fail(2, ErrorCode.COORDINATOR_NOT_AVAILABLE) in out
    assert _of(out, ev.Forget) and ev.SendLeave("m1") in out


def test_the_broker_forgetting_the_lock_member_is_lost_for_good() -> None:
    core = _coordinating()
    (hb,) = _of(core.tick(1_000), ev.SendHeartbeat)
    out = core.handle(ev.HeartbeatAnswered(hb.attempt, ErrorCode.UNKNOWN_MEMBER_ID), 1_010)
    assert _role(core) is Role.LETTING_GO and _of(out, ev.Forget)


def test_a_rebalance_interrupts_and_a_rejoin_as_leader_resumes() -> None:
    core = _coordinating()
    (hb,) = _of(core.tick(1_000), ev.SendHeartbeat)
    out = core.handle(ev.HeartbeatAnswered(hb.attempt, ErrorCode.REBALANCE_IN_PROGRESS), 1_010)
    assert _role(core) is Role.INTERRUPTED and ev.Suspend() in out
    (join,) = _of(out, ev.SendJoin)
    out = core.handle(ev.JoinAnswered(join.attempt, ErrorCode.NONE, "m1", 2, "m1"), 1_020)
    (sync,) = _of(out, ev.SendSync)
    assert sync.generation == 2
    out = core.handle(ev.SyncAnswered(sync.attempt, ErrorCode.NONE), 1_030)
    assert _role(core) is Role.COORDINATING and ev.Resume() in out
    assert core.lease_deadline == 1_020 + 2_400
    # A late answer to a heartbeat of generation 1 changes nothing.
    core.handle(ev.HeartbeatAnswered(hb.attempt, ErrorCode.ILLEGAL_GENERATION), 1_040)
    assert _role(core) is Role.COORDINATING


def test_another_holder_is_followed_and_its_refusal_looked_up_again() -> None:
    core = GroupCore("g", "s1", CONFIG)
    (lookup,) = _of(core.handle(ev.Request(1, "a"), 0), ev.Lookup)
    out = core.handle(ev.LookedUp(lookup.attempt, ev.Shape.HELD, "s0"), 5)
    assert _role(core) is Role.FOLLOWING and out == [ev.Relay(1, "s0")]
    assert core.handle(ev.Request(2, "b", inbound=True), 6) == [
        ev.Fail(2, ErrorCode.NOT_COORDINATOR)]  # never relayed twice
    out = core.handle(ev.RelayDone(1, refused=True), 10)
    assert _role(core) is Role.LOOKING and _of(out, ev.Lookup)
    assert ev.Fail(1, ErrorCode.COORDINATOR_NOT_AVAILABLE) in out


def test_an_election_lost_between_the_member_id_and_the_join_joins_nothing() -> None:
    core = GroupCore("g", "s1", CONFIG)
    (lookup,) = _of(core.handle(ev.Request(1, "", starts_group=True), 0), ev.Lookup)
    (join,) = _of(core.handle(ev.LookedUp(lookup.attempt, ev.Shape.UNUSED), 1), ev.SendJoin)
    out = core.handle(ev.JoinAnswered(join.attempt, ErrorCode.MEMBER_ID_REQUIRED, "m9"), 2)
    (check,) = _of(out, ev.Lookup)
    out = core.handle(ev.LookedUp(check.attempt, ev.Shape.HELD, "s0"), 3)
    assert not _of(out, ev.SendJoin) and _role(core) is Role.LOOKING
    (again,) = _of(out, ev.Lookup)
    out = core.handle(ev.LookedUp(again.attempt, ev.Shape.HELD, "s0"), 4)
    assert _role(core) is Role.FOLLOWING and ev.Relay(1, "s0") in out


def test_a_group_led_by_a_groupgate_without_a_card_is_nobody_s_to_act_for() -> None:
    """A lookup that finds the broker's group held with no holder (a 0.1.0 groupgate, which
    carries no card, leads it) is not this sidecar's own member from before a restart: no
    election, no relay; the held requests are answered COORDINATOR_NOT_AVAILABLE."""
    core = GroupCore("g", "s0", CONFIG)
    (lookup,) = _of(core.handle(ev.Request(1, "", starts_group=True), 0), ev.Lookup)
    out = core.handle(ev.LookedUp(lookup.attempt, ev.Shape.HELD, None), 1)
    assert out == [ev.Fail(1, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
    assert _role(core) is Role.ABSENT and core.holder is None and core.member_id == ""
    # Found so between the member id and the join: the election is lost, nothing joined.
    core = GroupCore("g", "s0", CONFIG)
    (lookup,) = _of(core.handle(ev.Request(1, "", starts_group=True), 0), ev.Lookup)
    (join,) = _of(core.handle(ev.LookedUp(lookup.attempt, ev.Shape.UNUSED), 1), ev.SendJoin)
    out = core.handle(ev.JoinAnswered(join.attempt, ErrorCode.MEMBER_ID_REQUIRED, "m9"), 2)
    (check,) = _of(out, ev.Lookup)
    out = core.handle(ev.LookedUp(check.attempt, ev.Shape.HELD, None), 3)
    assert not _of(out, ev.SendJoin) and _role(core) is Role.LOOKING
    (again,) = _of(out, ev.Lookup)
    out = core.handle(ev.LookedUp(again.attempt, ev.Shape.HELD, None), 4)
    assert ev.Fail(1, ErrorCode.COORDINATOR_NOT_AVAILABLE) in out
    assert not _of(out, ev.SendJoin) and _role(core) is Role.ABSENT


def test_a_member_request_for_an_unused_group_is_not_a_takeover() -> None:
    core = GroupCore("g", "s0", CONFIG)
    (lookup,) = _of(core.handle(ev.Request(1, "made-up"), 0), ev.Lookup)
    out = core.handle(ev.LookedUp(lookup.attempt, ev.Shape.UNUSED), 1)
    assert out == [ev.Fail(1, ErrorCode.UNKNOWN_MEMBER_ID)] and _role(core) is Role.ABSENT


def test_held_requests_are_bounded_in_number_and_time() -> None:
    config = CoreConfig(session_ms=3_000, hold_ms=100, max_held=2)
    core = GroupCore("g", "s0", config)
    core.handle(ev.Request(1, "a"), 0)
    core.handle(ev.Request(2, "b"), 0)
    assert core.handle(ev.Request(3, "c"), 0) == [ev.Fail(3, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
    assert core.next_deadline() == 100
    out = core.tick(100)
    assert {a.rid for a in _of(out, ev.Fail)} == {1, 2} and core.held == 0


def test_the_core_imports_no_io() -> None:
    script = ("import sys, proxy.fleet_core.core, proxy.fleet_core.events\n"
              "bad = ['trio', 'socket', 'ssl', 'asyncio', 'threading', 'selectors',\n"
              "       'proxy.config', 'proxy.coordination', 'proxy.kafka_client']\n"
              "print(','.join(m for m in bad if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == ""


def test_a_stop_leaves_the_lock_and_answers_nothing_more() -> None:
    core = _coordinating()
    out = core.handle(ev.Stop(), 100)
    assert _role(core) is Role.STEPPING_DOWN
    assert _of(out, ev.Forget) and ev.SendLeave("m1") in out
    assert core.handle(ev.Request(7, "a"), 110) == [
        ev.Fail(7, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
    assert not core.acting(110)


def test_letting_go_tells_the_members_at_the_loss_once_and_nobody_else() -> None:
    core = _coordinating()
    core.tick(2_400)
    out = core.tick(3_000)
    assert _role(core) is Role.LETTING_GO and _of(out, ev.Forget)
    assert core.handle(ev.Forgotten(frozenset({"a", "b"})), 3_000) == []
    # a member that joined elsewhere meanwhile holds nothing of this sidecar's
    assert core.handle(ev.Request(5, "c"), 3_100) == [
        ev.Fail(5, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
    assert core.handle(ev.Request(6, "a"), 3_100) == [ev.Fail(6, ErrorCode.UNKNOWN_MEMBER_ID)]
    assert core.handle(ev.Request(7, "a"), 3_200) == [
        ev.Fail(7, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
    # the last one told ends it before the bound
    assert core.handle(ev.Request(8, "b"), 3_300) == [ev.Fail(8, ErrorCode.UNKNOWN_MEMBER_ID)]
    assert _role(core) is Role.ABSENT


def test_a_takeover_that_loads_nothing_of_a_group_held_before_lets_joins_wait() -> None:
    config = CoreConfig(session_ms=60_000, takeover_wait_ms=5_000)  # (no heartbeat due)
    core = GroupCore("g", "s0", config)
    (lookup,) = _of(core.handle(ev.Request(1, "", starts_group=True), 0), ev.Lookup)
    (join,) = _of(core.handle(ev.LookedUp(lookup.attempt, ev.Shape.FREE), 0), ev.SendJoin)
    out = core.handle(ev.JoinAnswered(join.attempt, ErrorCode.MEMBER_ID_REQUIRED, "m1"), 0)
    (check,) = _of(out, ev.Lookup)
    (join,) = _of(core.handle(ev.LookedUp(check.attempt, ev.Shape.FREE), 0), ev.SendJoin)
    # generation 4: someone held the broker's group before
    out = core.handle(ev.JoinAnswered(join.attempt, ErrorCode.NONE, "m1", 4, "m1"), 0)
    (sync,) = _of(out, ev.SendSync)
    core.handle(ev.SyncAnswered(sync.attempt, ErrorCode.NONE), 0)
    core.handle(ev.Request(2, "old-member"), 10)
    out = core.handle(ev.LoadDone(True, complete=False), 20)
    assert _role(core) is Role.COORDINATING
    assert ev.Fail(1, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS) in out
    assert ev.RunEngine(2) in out  # the engine tells an earlier member it is unknown
    assert core.handle(ev.Request(3, "", starts_group=True), 1_000) == [
        ev.Fail(3, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)]
    assert core.handle(ev.Request(4, "", starts_group=True), 5_020) == [ev.RunEngine(4)]


def test_a_complete_load_or_a_group_nobody_held_does_not_wait() -> None:
    core = _coordinating()  # generation 1: nobody held the group before
    assert _of(core.handle(ev.Request(2, "", starts_group=True), 10), ev.RunEngine)


def test_the_table_in_the_architecture_document_is_the_codes() -> None:
    import pathlib

    text = (pathlib.Path(core_module.__file__).parents[2] / "docs" / "architecture.md"
            ).read_text()
    section = text.split("The core's transitions as built")[1].split("\n\n")[1]
    documented = set()
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        froms = ([r for r in Role if r is not Role.STEPPING_DOWN] if cells[0] == "any"
                 else [Role(cells[0])])
        documented |= {(role, Why(cells[1]), Role(cells[2])) for role in froms}
    assert documented == {(a, why, b) for (a, why), b in TRANSITIONS.items()}


def test_stepping_down_with_the_log_leaves_the_lock_once_the_pending_writes_landed() -> None:
    core = _coordinating()
    core.handle(ev.Request(2, "a"), 10)
    assert core.handle(ev.EngineDone(2, wrote=True), 10) == [ev.Write(1)]
    out = core.handle(ev.Stop(), 20)
    assert _role(core) is Role.STEPPING_DOWN and not core.stepped_down
    assert out == [ev.Fail(2, ErrorCode.COORDINATOR_NOT_AVAILABLE)]  # nothing more answered
    assert core.handle(ev.Request(3, "a"), 30) == [
        ev.Fail(3, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
    out = core.handle(ev.Written(1), 40)
    assert core.stepped_down and _of(out, ev.Forget) and ev.SendLeave("m1") in out


def test_stepping_down_leaves_at_once_with_nothing_pending_and_at_its_bound_otherwise() -> None:
    core = _coordinating()
    out = core.handle(ev.Stop(), 20)
    assert core.stepped_down and _of(out, ev.Forget) and ev.SendLeave("m1") in out
    core = _coordinating()
    core.handle(ev.Request(2, "a"), 10)
    core.handle(ev.EngineDone(2, wrote=True), 10)
    core.handle(ev.Stop(), 20)
    assert core.next_deadline() <= 20 + CONFIG.step_down_ms
    out = core.tick(20 + CONFIG.step_down_ms)
    assert core.stepped_down and ev.SendLeave("m1") in out


def test_handing_off_tells_every_member_to_let_go_before_the_lock_is_left() -> None:
    core = _coordinating()
    out = core.handle(ev.Stop(hand_off=True), 20)
    assert _of(out, ev.Forget) and not _of(out, ev.SendLeave)
    core.handle(ev.Forgotten(frozenset({"a", "b"})), 20)
    assert core.handle(ev.Request(3, "a"), 30) == [ev.Fail(3, ErrorCode.UNKNOWN_MEMBER_ID)]
    assert core.handle(ev.Request(4, "x"), 30) == [
        ev.Fail(4, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
    out = core.handle(ev.Request(5, "b"), 40)
    assert ev.Fail(5, ErrorCode.UNKNOWN_MEMBER_ID) in out and ev.SendLeave("m1") in out
    assert core.stepped_down and not _of(out, ev.Forget)  # forgotten at the stop already


def _electing(core: GroupCore) -> ev.SendJoin:
    (lookup,) = _of(core.handle(ev.Request(1, "", starts_group=True), 0), ev.Lookup)
    (join,) = _of(core.handle(ev.LookedUp(lookup.attempt, ev.Shape.UNUSED), 0), ev.SendJoin)
    out = core.handle(ev.JoinAnswered(join.attempt, ErrorCode.MEMBER_ID_REQUIRED, "m1"), 0)
    (check,) = _of(out, ev.Lookup)
    (join,) = _of(core.handle(ev.LookedUp(check.attempt, ev.Shape.UNUSED), 0), ev.SendJoin)
    assert isinstance(join, ev.SendJoin)
    return join


def test_an_elections_join_is_tried_again_while_the_coordinator_moves() -> None:
    core = GroupCore("g", "s0", CONFIG)
    join = _electing(core)
    out = core.handle(ev.JoinAnswered(join.attempt, ErrorCode.NOT_COORDINATOR), 10)
    assert out == [] and _role(core) is Role.ELECTING
    (again,) = _of(core.tick(10 + CONFIG.retry_ms), ev.SendJoin)
    assert again.member_id == "m1"  # the pending member id
    out = core.handle(ev.JoinAnswered(again.attempt, ErrorCode.NONE, "m1", 1, "m1"), 300)
    assert _of(out, ev.SendSync)


def test_members_of_another_protocol_put_the_group_in_the_broker_phase() -> None:
    core = GroupCore("g", "s0", CONFIG)
    join = _electing(core)
    out = core.handle(ev.JoinAnswered(join.attempt, ErrorCode.INCONSISTENT_GROUP_PROTOCOL), 10)
    assert _role(core) is Role.BROKER
    assert ev.Fail(1, ErrorCode.COORDINATOR_NOT_AVAILABLE) in out
