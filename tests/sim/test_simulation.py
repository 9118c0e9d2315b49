"""Seeded simulations of KIP-848 groups (see ``translation.simulation``).

Thousands of small scenarios plus a few groups of several hundred members. A failing seed's
message carries the command that replays it: ``groupgate simulate --seed N``.
"""

from __future__ import annotations

import os

import pytest

from translation.simulation import SimulationResult, run_seed

SMALL_SEEDS = int(os.environ.get("GROUPGATE_SIM_SEEDS", "1000"))
"""How many small scenarios (1000 take about 25 s on one core); a nightly job raises it."""
FIRST_SEED = int(os.environ.get("GROUPGATE_SIM_START", "0"))
"""Where the small seeds start; a nightly job can rotate it to explore new seeds."""
CHUNK = 100


def _failures(results: list[SimulationResult]) -> str:
    lines = []
    for r in results:
        if not r.ok:
            lines.append(f"seed {r.seed}: {r.violation}\n  replay: {r.replay}")
            lines.extend(f"    {t}" for t in r.trace[-15:])
    return "\n".join(lines)


@pytest.mark.parametrize("start", range(FIRST_SEED, FIRST_SEED + SMALL_SEEDS, CHUNK))
def test_small_groups(start: int) -> None:
    stop = min(start + CHUNK, FIRST_SEED + SMALL_SEEDS)
    results = [run_seed(seed) for seed in range(start, stop)]
    assert all(r.ok for r in results), _failures(results)
    # The scenarios really exercise the protocol (not a vacuous pass).
    total: dict[str, int] = {}
    for r in results:
        for key, value in r.stats.items():
            total[key] = total.get(key, 0) + value
    for key in (
        "joins",
        "heartbeats",
        "crashes",
        "leaves",
        "topic-changes",
        "owner-commits",
        "zombie-commits",
        "subscription-changes",
    ):
        assert total.get(key, 0) > 0, (key, total)


@pytest.mark.parametrize(("seed", "members"), [(10_001, 200), (10_002, 300), (10_003, 500)])
def test_large_groups(seed: int, members: int) -> None:
    result = run_seed(seed, members)
    assert result.ok, _failures([result])
    assert result.stats["joins"] >= members
    assert result.stats["heartbeats"] > 10 * members


def test_a_seed_replays_exactly() -> None:
    first, second = run_seed(4242), run_seed(4242)
    assert first.ok and second.ok
    assert (first.events, first.sim_time_ms, first.stats) == (
        second.events,
        second.sim_time_ms,
        second.stats,
    )
    assert run_seed(4243).stats != first.stats
