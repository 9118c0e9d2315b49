"""``dev/bench migration``'s figures from members' callbacks and from run files (no test bed)."""

from __future__ import annotations

from typing import Any

from tests.benchmarks.migration import summarize, table
from tests.integration.members import Member
from tests.integration.pod_roll import worst_downtime, worst_gap


def member(name: str, *events: tuple[float, str, list[int]]) -> Member:
    m = Member(name)
    for t, kind, partitions in events:
        m.on_event({"name": kind, "t": t, "partitions": [["t", p] for p in partitions]})
    return m


def test_the_worst_downtime_is_the_longest_time_a_partition_had_no_owner() -> None:
    a = member("a", (0.0, "partitions_assigned", [0, 1]), (10.0, "partitions_revoked", [1]))
    b = member("b", (12.5, "partitions_assigned", [1]))
    everything = {("t", 0), ("t", 1)}
    assert worst_downtime([a, b], everything, 5.0, 20.0) == 2.5
    assert worst_downtime([a, b], everything, 0.0, 9.0) == 0.0
    closed = member("c", (0.0, "partitions_assigned", [2]), (3.0, "closed", []))
    assert worst_downtime([closed], {("t", 2)}, 0.0, 10.0) == 7.0
    assert worst_downtime([], {("t", 3)}, 1.0, 4.0) == 3.0  # never owned in the step


def test_the_worst_gap_names_the_partition_and_its_owners_before_and_after() -> None:
    a = member("a", (0.0, "partitions_assigned", [0, 1]), (10.0, "partitions_revoked", [1]),
               (11.0, "partitions_lost", [0]))
    b = member("b", (12.5, "partitions_assigned", [1]), (12.0, "partitions_assigned", [0]))
    gap = worst_gap([a, b], {("t", 0), ("t", 1)}, 5.0, 20.0)
    assert gap is not None and gap.partition == ("t", 1) and gap.seconds == 2.5
    assert gap.before is not None and (gap.before.owner, gap.before.ended_by) == (
        "a", "partitions_revoked")
    assert gap.after is not None and gap.after.owner == "b"
    closed = member("c", (0.0, "partitions_assigned", [2]), (3.0, "closed", []))
    gap = worst_gap([closed], {("t", 2)}, 0.0, 10.0)
    assert gap is not None and gap.before is not None and gap.before.ended_by == "closed"
    assert gap.after is None
    assert worst_gap([a, b], {("t", 0), ("t", 1)}, 0.0, 9.0) is None


def _run(target: str, downtimes: list[float], error: str | None = None) -> dict[str, Any]:
    names = ["b: pod a on the consumer protocol",
             "c: pod c back to classic (the group handed back: its last KIP-848 member left)"]
    return {"target": target, "error": error, "steps": [
        {"step": n, "worst_downtime_s": d, "members_called_back": 2, "callbacks": 3,
         "lost": 0} for n, d in zip(names, downtimes, strict=True)]}


def test_runs_are_summarized_per_step_side_by_side() -> None:
    docs = [{"runs": [_run("groupgate", [0.5, 2.0])]}, {"runs": [_run("native-4.4", [1.0, 3.0])]},
            {"runs": [_run("groupgate", [0.7, 1.0])]},
            {"runs": [_run("native-4.4", [1.2, 5.0])]}]
    summary = summarize(docs)
    steps = [r["step"] for r in summary["rows"]]
    assert steps == ["b: pod a on the consumer protocol", "c: pod c back to classic"]
    first = summary["rows"][0]
    assert first["groupgate"]["worst_downtime_median_s"] == 0.6
    assert first["native-4.4"]["worst_downtime_max_s"] == 1.2
    assert summary["roll_worst_downtime_median_s"] == {"groupgate": 1.5, "native-4.4": 4.0}
    assert summary["goal_met"] is True and summary["runs"] == {"groupgate": 2,
                                                               "native-4.4": 2}
    assert "| **worst step of the roll**" in table(summary)
