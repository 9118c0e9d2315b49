"""The synthetic journal of the report benchmark: valid version-1 events in time order,
reproducible from its seed, with the migration it claims (fewer classic joiners over time)
and rebalances that end."""

from __future__ import annotations

import json
from collections import Counter

from proxy.journal.schema import check
from tests.benchmarks.journal_synth import generate


def test_valid_ordered_reproducible_and_migrating() -> None:
    lines = list(generate(30_000, seed=3))
    assert len(lines) == 30_000
    assert list(generate(2000, seed=3)) == list(generate(2000, seed=3))
    assert list(generate(2000, seed=3)) != list(generate(2000, seed=4))
    events = [json.loads(line) for line in lines]
    assert all(check(e) == [] for e in events[::7])
    times = [e["ts"] for e in events]
    assert times == sorted(times)
    assert len({(e["source"], e["seq"]) for e in events}) == len(events)
    kinds = Counter(e["type"] for e in events)
    assert kinds["epoch_bumped"] > 100 and kinds["group_snapshot"] > 100
    joins = [e for e in events if e["type"] == "member_joined"]
    half = len(joins) // 2

    def classic_share(js: list[dict[str, object]]) -> float:
        return sum(j["protocol"] == "classic" for j in js) / len(js)

    assert classic_share(joins[:half]) > classic_share(joins[half:])
    # A group is Stable only at the end of a rebalance (a bump came first), and rebalances
    # do end.
    running: dict[str, bool] = {}
    finished = 0
    for e in events:
        if e["type"] == "epoch_bumped":
            running[e["group"]] = True
        elif e["type"] == "group_state" and e["state"] == "Stable":
            assert running.get(e["group"]), e
            finished += 1
            running[e["group"]] = False
    assert finished > 100
