"""The crash benchmark's figure from hand-made run records: the time from the SIGKILL until
the last of the victim's partitions has another owner, and the summary's medians and ratio."""

from __future__ import annotations

from typing import Any

from tests.benchmarks.crash import reassigned_after, summarize, victim_partitions


def record(timeline: list[list[Any]], target: str = "groupgate", members: int = 2
           ) -> dict[str, Any]:
    return {"roles": {"victim": "m0"}, "timeline": timeline, "target": target,
            "members": members}


BEFORE = [[-9.0, "m0", "join", []], [-9.0, "m1", "join", []],
          [-8.0, "m0", "assign", [0, 1, 2]], [-8.0, "m1", "assign", [3, 4, 5]],
          [-5.0, "m0", "revoke", [2]], [-4.9, "m1", "assign", [2]],
          [0.0, "m0", "crash", []]]


def test_the_last_of_the_victims_partitions_assigned_elsewhere_ends_the_wait() -> None:
    run = record([*BEFORE, [0.5, "m0", "assign", [7]],  # a dead member's late line counts not
                  [1.2, "m1", "assign", [0]], [2.4, "m1", "assign", [1, 8]]])
    assert victim_partitions(run) == {0, 1}
    assert reassigned_after(run) == 2.4


def test_a_partition_never_reassigned_gives_no_figure() -> None:
    assert reassigned_after(record([*BEFORE, [1.2, "m1", "assign", [0]]])) is None


def test_summary_medians_and_ratio_of_medians() -> None:
    def doc(target: str, values: list[float | None]) -> dict[str, Any]:
        return {"profile": "bench", "runs": [
            {"target": target, "members": 10, "reassigned_s": v,
             "downtime_partition_s": None if v is None else 10 * v} for v in values]}

    (row,) = summarize([doc("groupgate", [1.0, 1.4, 1.2]), doc("native-4.4", [7.0, 6.0, None])])
    assert row["groupgate"] == {"runs": 3, "not_reassigned": 0, "median_s": 1.2, "min_s": 1.0,
                                "max_s": 1.4, "downtime_median_partition_s": 12.0}
    assert row["native-4.4"]["median_s"] == 6.5 and row["native-4.4"]["not_reassigned"] == 1
    assert row["ratio"] == round(1.2 / 6.5, 3)
    assert row["downtime_ratio"] == round(12.0 / 65.0, 3)


def test_summary_compares_groupgate_with_classic_as_well() -> None:
    def doc(target: str, values: list[float]) -> dict[str, Any]:
        return {"profile": "defaults", "runs": [
            {"target": target, "members": 50, "reassigned_s": v,
             "downtime_partition_s": 10 * v} for v in values]}

    (row,) = summarize([doc("groupgate", [2.0, 2.2, 2.1]), doc("classic-3.9", [45.0, 48.0, 42.0])])
    assert row["classic-3.9"]["median_s"] == 45.0
    assert row["ratio_classic"] == round(2.1 / 45.0, 3)
    assert row["downtime_ratio_classic"] == round(21.0 / 450.0, 3)
    assert row["native-4.4"]["runs"] == 0 and row["ratio"] is None
