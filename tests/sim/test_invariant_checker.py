"""The invariant checks can fail: fed broken states (or a deliberately broken engine), they
report violations, so a green simulation run is not vacuous."""

from __future__ import annotations

import uuid

import pytest

import translation.offsets
import translation.reconciliation
from translation.errors import ErrorCode
from translation.group import ConsumerGroup
from translation.member import ConsumerGroupMember
from translation.simulation import InvariantViolation, OwnershipTracker, run_seed
from translation.simulation.invariants import (
    EpochMonitor,
    check_commit_verdict,
    check_exclusive_ownership,
    check_group_structure,
    check_quiescent,
)
from translation.topics import TopicMetadata, TopicsImage

T = uuid.UUID(int=7)
IMAGE = TopicsImage.of([TopicMetadata(T, "t0", 2)])


def test_double_ownership_is_caught() -> None:
    tracker = OwnershipTracker()
    tracker.acquire("c1", (T, 0))
    tracker.acquire("c1", (T, 0))  # re-acquiring one's own partition is fine
    with pytest.raises(InvariantViolation, match="owned by c1 and c2"):
        tracker.acquire("c2", (T, 0))
    tracker.release("c1", (T, 0))
    tracker.acquire("c2", (T, 0))
    with pytest.raises(InvariantViolation):
        check_exclusive_ownership({"a": [(T, 0), (T, 1)], "b": [(T, 1)]})
    check_exclusive_ownership({"a": [(T, 0)], "b": [(T, 1)]})


def test_epochs_going_backwards_are_caught() -> None:
    monitor = EpochMonitor()
    group = ConsumerGroup("g", "uniform")
    group.group_epoch = 5
    group.target.epoch = 5
    monitor.observe_group(group)
    group.group_epoch = 4
    with pytest.raises(InvariantViolation, match="group epoch went backwards"):
        monitor.observe_group(group)
    monitor.observe_member("m", 7)
    with pytest.raises(InvariantViolation, match="epoch went backwards"):
        monitor.observe_member("m", 6)


def test_inconsistent_coordinator_state_is_caught() -> None:
    group = ConsumerGroup("g", "uniform")
    a, b = ConsumerGroupMember("a"), ConsumerGroupMember("b")
    group.add_member(a, IMAGE)
    group.add_member(b, IMAGE)
    check_group_structure(group)
    a.assigned = {T: {0: 0}}
    b.assigned = {T: {0: 0}}  # both members hold t0-0, behind the ownership map's back
    with pytest.raises(InvariantViolation):
        check_group_structure(group)


def test_quiescence_checks() -> None:
    group = ConsumerGroup("g", "uniform")
    member = ConsumerGroupMember("m", subscribed_topic_names=frozenset({"t0"}))
    group.add_member(member, IMAGE)
    group.group_epoch = group.target.epoch = 1
    member.member_epoch = 1
    member.assigned = {T: {0: 1}}
    group.owners.add("m", T, [0])
    group.track_all()
    subs = [(frozenset({"t0"}), None)]
    with pytest.raises(InvariantViolation, match="owned by nobody"):
        check_quiescent(group, {"c": ("m", 1, {(T, 0)})}, subs, IMAGE)
    with pytest.raises(InvariantViolation, match="but the coordinator says"):
        check_quiescent(group, {"c": ("m", 1, {(T, 0), (T, 1)})}, subs, IMAGE)
    member.assigned = {T: {0: 1, 1: 1}}
    group.owners.add("m", T, [1])
    check_quiescent(group, {"c": ("m", 1, {(T, 0), (T, 1)})}, subs, IMAGE)


def test_commit_verdicts() -> None:
    check_commit_verdict(ErrorCode.NONE, owner=True, detail="")
    check_commit_verdict(ErrorCode.STALE_MEMBER_EPOCH, owner=False, detail="")
    with pytest.raises(InvariantViolation, match="zombie commit accepted"):
        check_commit_verdict(ErrorCode.NONE, owner=False, detail="")
    with pytest.raises(InvariantViolation, match="current owner rejected"):
        check_commit_verdict(ErrorCode.STALE_MEMBER_EPOCH, owner=True, detail="")


def _first_failure(count: int = 40) -> str:
    for seed in range(count):
        result = run_seed(seed)
        if not result.ok:
            assert result.replay == f"groupgate simulate --seed {seed}"
            assert result.trace
            return result.violation or ""
    raise AssertionError("the broken engine passed every seed")


def test_simulation_catches_an_engine_that_skips_revocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Pretend every member already released what it must revoke: partitions move at once.
    monkeypatch.setattr(translation.reconciliation, "owns_any", lambda owned, partitions: False)
    assert "at the same time" in _first_failure()


def test_simulation_catches_an_engine_that_accepts_zombie_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        translation.offsets, "validate_offset_commit", lambda *args, **kwargs: ErrorCode.NONE
    )
    monkeypatch.setattr(
        "translation.coordinator.offsets_mod.validate_offset_commit",
        lambda *args, **kwargs: ErrorCode.NONE,
    )
    assert "zombie commit accepted" in _first_failure()


def test_cli_lists_failing_seeds_with_their_replay_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from proxy.commands import simulate

    parser = argparse.ArgumentParser()
    simulate.configure(parser)
    assert simulate.run(parser.parse_args(["--seeds", "3", "--start", "7"])) == 0
    assert "3/3 seeds passed" in capsys.readouterr().out

    monkeypatch.setattr(translation.reconciliation, "owns_any", lambda owned, partitions: False)
    assert simulate.run(parser.parse_args(["--seeds", "10"])) == 1
    out = capsys.readouterr().out
    assert "seeds passed" in out and "replay: groupgate simulate --seed " in out
    failing = int(out.split("groupgate simulate --seed ")[1].split()[0])
    assert simulate.run(parser.parse_args(["--seed", str(failing)])) == 1
    out = capsys.readouterr().out
    assert f"seed {failing} FAILED" in out and "last events:" in out
    assert f"replay: groupgate simulate --seed {failing}" in out
