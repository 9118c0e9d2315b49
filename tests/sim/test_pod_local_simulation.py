"""Seeded simulations where the sidecar of a crashed dynamic member reports it gone
(pod-local liveness, docs/decisions/0020-pod-local-liveness.md): the engine fences it at the
epoch of its last request, a grace after the crash, under the usual invariants; with classic
members and with coordinator failovers too. A failing seed replays with ``run_seed(seed,
pod_local_rate=1.0, ...)``."""

from __future__ import annotations

import os

import pytest

from translation.simulation import SimulationResult, run_seed

SEEDS = int(os.environ.get("GROUPGATE_SIM_POD_LOCAL_SEEDS", "60"))
FIRST_SEED = int(os.environ.get("GROUPGATE_SIM_START", "0")) + 70_000


def _failures(results: list[SimulationResult]) -> str:
    lines = []
    for r in results:
        if not r.ok:
            lines.append(f"seed {r.seed}: {r.violation}")
            lines.extend(f"    {t}" for t in r.trace[-15:])
    return "\n".join(lines)


@pytest.mark.parametrize("knobs", [
    {},
    {"classic_share": 0.5},
    {"failover_rate": 0.2, "failovers_from_ms": 3_000},
], ids=["consumer", "mixed", "failovers"])
def test_crashes_reported_pod_local_keep_every_invariant(knobs: dict[str, float]) -> None:
    results = [run_seed(seed, pod_local_rate=1.0, **knobs)  # type: ignore[arg-type]
               for seed in range(FIRST_SEED, FIRST_SEED + SEEDS)]
    assert all(r.ok for r in results), _failures(results)
    total: dict[str, int] = {}
    for r in results:
        for key, value in r.stats.items():
            total[key] = total.get(key, 0) + value
    # progress: crashed members were fenced pod-local, and some report came too late
    assert total.get("fenced-pod-local", 0) > 0, total
    assert total.get("pod-local-NONE", 0) == total["fenced-pod-local"], total
