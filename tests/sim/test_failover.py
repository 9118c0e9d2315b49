"""Seeded simulations with coordinator failovers (durable group state).

The coordinator dies at random moments, also right after a call wrote records nobody
acknowledged yet and right after an acknowledgement whose responses are still on their way; a
new one loaded from the acknowledged records takes over. The usual invariants hold after every
event, plus the failover checks (see ``translation.simulation.simulator``). And the checks can
fail: a load that loses the partitions' assignment epochs, and responses that leave before the
records they depend on are acknowledged, are caught. A failing seed replays with
``groupgate simulate --seed N --failover-rate R``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import translation.durable
import translation.simulation.simulator as simulator
from translation.member import ConsumerGroupMember
from translation.records import AssignmentValue, MemberValue
from translation.simulation import SimulationResult, run_seed
from translation.simulation.simulator import Simulation, knobs_for_seed

SEEDS = int(os.environ.get("GROUPGATE_SIM_FAILOVER_SEEDS", "400"))
FIRST_SEED = int(os.environ.get("GROUPGATE_SIM_START", "0")) + 70_000
RATE = 0.5
CHUNK = 100


def _failures(results: list[SimulationResult], rate: float = RATE) -> str:
    lines = []
    for r in results:
        if not r.ok:
            lines.append(f"seed {r.seed}: {r.violation}\n  replay: {r.replay} --failover-rate "
                         f"{rate}")
            lines.extend(f"    {t}" for t in r.trace[-15:])
    return "\n".join(lines)


@pytest.mark.parametrize("start", range(FIRST_SEED, FIRST_SEED + SEEDS, CHUNK))
def test_failovers_keep_every_invariant(start: int) -> None:
    stop = min(start + CHUNK, FIRST_SEED + SEEDS)
    results = [run_seed(seed, failover_rate=RATE) for seed in range(start, stop)]
    assert all(r.ok for r in results), _failures(results)
    total: dict[str, int] = {}
    for r in results:
        for key, value in r.stats.items():
            total[key] = total.get(key, 0) + value
    # Every kind of failover happened, with writes and responses really lost, while the
    # group churned (classic members included).
    for key in ("failover-at-random", "failover-after-write", "failover-after-ack",
                "failover-lost-units", "failover-lost-responses", "requests-lost-in-failover",
                "responses-lost-in-failover", "classic-joins", "crashes", "topic-changes",
                "zombie-commits", "owner-commits"):
        assert total.get(key, 0) > 0, (key, total)


def test_failovers_in_a_large_group() -> None:
    result = run_seed(10_004, 300, failover_rate=0.3)
    assert result.ok, _failures([result], 0.3)
    assert result.stats["failovers"] >= 2


def test_a_failover_seed_replays_exactly() -> None:
    first, second = run_seed(70_123, failover_rate=RATE), run_seed(70_123, failover_rate=RATE)
    assert first.ok and second.ok and first.stats["failovers"] > 0
    assert (first.events, first.sim_time_ms, first.stats) == (
        second.events, second.sim_time_ms, second.stats)


class _Watched(Simulation):
    """Counts what members notice once failovers start: partitions released, error
    responses."""

    noticed: list[str]

    def on_release(self, client: Any, tp: Any, reason: str) -> None:
        if self.now >= self.knobs.failovers_from_ms:
            self.noticed.append(f"t={self.now} {client.name} released {tp} ({reason})")
        super().on_release(client, tp, reason)

    def ev_response_arrive(self, client: Any, seq: int, response: Any, *args: Any) -> None:
        if self.now >= self.knobs.failovers_from_ms and response.error_code:
            self.noticed.append(f"t={self.now} {client.name} got error {response.error_code}")
        super().ev_response_arrive(client, seq, response, *args)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_at_steady_state_members_notice_nothing_but_a_pause(share: float) -> None:
    failovers = 0
    for seed in range(71_000, 71_012):
        knobs = knobs_for_seed(seed, None, failover_rate=0.15, failovers_from_ms=10_000,
                               chaos_ms=40_000,
                               chaos_events=False, loss_rate=0.0, slow_revocation_rate=0.0,
                               classic_share=share)
        sim = _Watched(seed, knobs)
        sim.noticed = []
        sim.run()
        assert sim.noticed == [], (seed, sim.noticed[:5])
        failovers += sim.stats["failovers"]
    assert failovers >= 24


def _first_failure(count: int = 60, **knobs: Any) -> str:
    for seed in range(FIRST_SEED, FIRST_SEED + count):
        result = run_seed(seed, **knobs)
        if not result.ok:
            assert result.trace
            return result.violation or ""
    raise AssertionError("every seed passed")


def test_a_load_that_drops_the_assignment_epochs_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(translation.durable, "_epochs_in", lambda partitions: {
        topic_id: dict.fromkeys(dict(pairs), 0) for topic_id, pairs in partitions if pairs})
    violation = _first_failure(failover_rate=RATE)
    assert "loaded group differs" in violation and "assigned" in violation


def test_a_load_that_gives_every_partition_the_member_epoch_breaks_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the structural checks off, the protocol invariants alone catch it: the current
    owner's commits at the generation it knows are refused."""
    loaded = translation.durable._member

    def member(member_id: str, value: MemberValue, at: AssignmentValue) -> ConsumerGroupMember:
        m = loaded(member_id, value, at)
        epoch = max(m.member_epoch, 0)
        m.assigned = {t: dict.fromkeys(ps, epoch) for t, ps in m.assigned.items()}
        return m

    monkeypatch.setattr(translation.durable, "_member", member)
    monkeypatch.setattr(simulator, "drained_matches", lambda *args: True)
    violation = _first_failure(failover_rate=RATE, check_loads=False)
    assert "commit from the current owner rejected" in violation


def test_responses_that_leave_before_earlier_writes_are_acknowledged_are_caught() -> None:
    """A call that writes nothing may answer with what an earlier call wrote (a retried
    heartbeat gets the epoch its lost response carried). Sent before that write is
    acknowledged, a failover can lose what the member was told."""
    violation = _first_failure(failover_rate=RATE, write_delay_ms=1_500,
                               wait_for_earlier_writes=False)
    assert "knows epoch" in violation


def test_cli_turns_failovers_on_and_replays_with_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from proxy.commands import simulate

    parser = argparse.ArgumentParser()
    simulate.configure(parser)
    assert simulate.run(parser.parse_args(
        ["--seeds", "4", "--start", "70000", "--failover-rate", "0.5", "-v"])) == 0
    out = capsys.readouterr().out
    assert "4/4 seeds passed" in out
    assert simulate.run(parser.parse_args(["--seed", "70000", "--failover-rate", "0.5",
                                           "-v"])) == 0
    assert "failovers=" in capsys.readouterr().out

    monkeypatch.setattr(translation.durable, "_epochs_in", lambda partitions: {})
    assert simulate.run(parser.parse_args(
        ["--seeds", "20", "--start", "70000", "--failover-rate", "0.5"])) == 1
    out = capsys.readouterr().out
    assert "--failover-rate 0.5" in out.split("replay: ")[1].splitlines()[0]
    assert simulate.run(parser.parse_args(["--failover-rate", "-1", "--seed", "1"])) == 2
