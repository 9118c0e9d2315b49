"""Seeded simulations with classic members (eager and cooperative, static or not) mixed with
new-protocol members, under the same invariants as the new-protocol-only scenarios.

The default small-group scenarios (``test_simulation.py``) already draw a classic share per
seed; these pin the share so that all-classic and half-classic groups are always covered, and
check that the classic machinery really ran. A failing seed replays with
``groupgate simulate --seed N --classic-share F``.
"""

from __future__ import annotations

import os

import pytest

from translation.simulation import SimulationResult, run_seed

SEEDS = int(os.environ.get("GROUPGATE_SIM_CLASSIC_SEEDS", "200"))
FIRST_SEED = int(os.environ.get("GROUPGATE_SIM_START", "0")) + 50_000


def _failures(results: list[SimulationResult], share: float) -> str:
    lines = []
    for r in results:
        if not r.ok:
            lines.append(
                f"seed {r.seed}: {r.violation}\n  replay: {r.replay} --classic-share {share}"
            )
            lines.extend(f"    {t}" for t in r.trace[-15:])
    return "\n".join(lines)


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_classic_and_mixed_groups(share: float) -> None:
    results = [
        run_seed(seed, classic_share=share) for seed in range(FIRST_SEED, FIRST_SEED + SEEDS)
    ]
    assert all(r.ok for r in results), _failures(results, share)
    total: dict[str, int] = {}
    for r in results:
        for key, value in r.stats.items():
            total[key] = total.get(key, 0) + value
    for key in (
        "classic-joins",
        "classic-requests",
        "classic-deferred-joins",
        "error-MEMBER_ID_REQUIRED",
        "error-REBALANCE_IN_PROGRESS",
        "static-replaced",
        "owner-commits",
        "zombie-commits",
        "crashes",
        "slow-revocations",
        "poll-timeouts",
        "departure-waits",
        "departure-waits-folded",
    ):
        assert total.get(key, 0) > 0, (key, total)
    if share < 1.0:
        assert total["joins"] > total["classic-joins"] > 0


def test_large_mixed_group() -> None:
    result = run_seed(10_004, 200, classic_share=0.5)
    assert result.ok, _failures([result], 0.5)
    assert result.stats["classic-joins"] > 50
    assert result.stats["joins"] - result.stats["classic-joins"] > 50


def test_a_classic_seed_replays_exactly() -> None:
    first, second = run_seed(4242, classic_share=0.5), run_seed(4242, classic_share=0.5)
    assert first.ok and second.ok
    assert (first.events, first.sim_time_ms, first.stats) == (
        second.events,
        second.sim_time_ms,
        second.stats,
    )
