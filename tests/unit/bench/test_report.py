"""The rebalance report's tables from hand-made run records."""

from __future__ import annotations

from typing import Any

from tests.benchmarks.rebalance import report


def run(target: str, downtime: float, convergence: float, protocol: str = "range",
        scenario: str = "scale-out") -> dict[str, Any]:
    return {"target": target, "protocol": protocol, "client": "confluent", "scenario": scenario,
            "members": 10, "convergence_s": convergence, "downtime_partition_s": downtime,
            "members_disturbed": 1, "partitions_revoked": 1, "duplicates": 0,
            "peak_lag_records": 1, "max_record_age_s": 0.5, "timed_out": False}


def test_comparison_divides_the_medians_of_matching_runs() -> None:
    rows = report.summarize([
        run("classic-3.9", 10.0, 2.0), run("classic-3.9", 30.0, 2.0), run("classic-3.9", 20.0, 1.0),
        run("groupgate", 2.0, 1.0), run("groupgate", 1.0, 1.0), run("groupgate", 3.0, 1.0),
        run("groupgate", 5.0, 1.0, protocol="cooperative-sticky"),  # no baseline: no row
        run("classic-3.9", 8.0, 1.0, scenario="leave"),
        run("groupgate", 0.0, 1.0, scenario="leave"),
    ])
    table = report.comparison_table(rows, "classic-3.9", "groupgate").splitlines()
    assert len(table) == 4  # header, rule, scale-out/range, leave/range
    assert table[2].split(" | ")[4:7] == ["20.0 (10.0-30.0)", "2.0 (1.0-3.0)", "10.0"]
    assert table[3].split(" | ")[6] == "-"  # nothing to divide by
