"""The soak's invariants on hand-made timelines: each check finds what it must and nothing
else."""

from __future__ import annotations

from tests.benchmarks.rebalance.timeline import Event
from tests.benchmarks.soak import checks


def test_offsets_moving_backwards_are_regressions_and_equal_polls_are_not() -> None:
    watch = checks.OffsetWatch()
    watch.observe(1.0, "g", {0: 10, 1: 5})
    watch.observe(2.0, "g", {0: 10, 1: 7})
    watch.observe(3.0, "g", {0: 4})  # partition 1 missing from the poll: not a regression
    assert watch.regressions == [checks.Regression(3.0, "g", 0, 10, 4)]
    assert watch.highest == {("g", 0): 10, ("g", 1): 7} and watch.polls == 3
    watch.observe(4.0, "h", {0: 1})  # another group's offsets are its own
    assert len(watch.regressions) == 1


def test_consumed_runs_merge_and_gaps_are_counted() -> None:
    runs: checks.Intervals = []
    for first, last in ((10, 19), (0, 4), (5, 8), (30, 30), (20, 25)):
        runs = checks.add_run(runs, first, last)
    assert runs == [(0, 8), (10, 25), (30, 30)]
    # produced offsets 0..31 of partition 0; 9, 26..29 and 31 were never consumed
    assert checks.missing({0: 32, 1: 3}, {0: runs, 1: [(0, 5)]}) == {0: 6}
    assert checks.missing({0: 3}, {}) == {0: 3}


def _assign(t: float, member: str, *partitions: int) -> list[Event]:
    return [Event(t, member, "stall"), Event(t, member, "assign", partitions),
            Event(t, member, "resume")]


def _revoke(t: float, member: str, *partitions: int) -> list[Event]:
    return [Event(t, member, "stall"), Event(t, member, "revoke", partitions),
            Event(t, member, "resume")]


def test_two_owners_are_a_violation_unless_one_was_a_stuck_zombie() -> None:
    events = [*_assign(1, "a", 0, 1), *_assign(5, "b", 1), *_revoke(9, "a", 0, 1)]
    unexplained, explained = checks.double_ownership(events, [])
    assert [(o.partition, o.first, o.second) for o in unexplained] == [(1, "a", "b")]
    assert explained == []
    # the same timeline, but "a" was stuck in its poll loop from 2 to 8 and noticed at 9
    stuck = checks.zombie_windows(events, [("a", 2.0, 8.0)])
    assert stuck == [checks.Stuck("a", 2.0, 8.0, 9.0)]
    unexplained, explained = checks.double_ownership(events, stuck)
    assert unexplained == [] and [o.partition for o in explained] == [1]
    # its commits of the shared partition after the overlap began were zombie commits
    commits = [checks.Commit(4.0, "a", 1, 100), checks.Commit(8.5, "a", 1, 120),
               checks.Commit(8.5, "a", 0, 80), checks.Commit(8.6, "b", 1, 130),
               checks.Commit(9.5, "a", 1, 140)]  # after it noticed: its own again, legitimately
    assert checks.zombie_commits(explained, stuck, commits) == [commits[1]]
    # an asynchronous commit sent before the overlap whose callback came during it is not one
    late = checks.Commit(8.5, "a", 1, 110, sent=4.5)
    assert checks.zombie_commits(explained, stuck, [late]) == []


def test_a_handover_in_order_is_not_an_overlap() -> None:
    events = [*_assign(1, "a", 0), *_revoke(5, "a", 0), *_assign(6, "b", 0),
              Event(7, "b", "crash"), *_assign(9, "c", 0)]
    assert checks.double_ownership(events, []) == ([], [])


def test_rss_growth_is_measured_per_process_after_warm_up() -> None:
    samples = [(0.0, 1, 20.0), (10.0, 1, 35.0), (20.0, 1, 36.0), (30.0, 1, 70.0),
               (40.0, 2, 22.0), (45.0, 2, 30.0), (70.0, 2, 31.0)]
    growth = checks.rss_growth(samples, warmup_s=10.0)
    assert growth == [checks.RssGrowth(1, 35.0, 70.0)]  # #2 had one sample after warm-up
    assert growth[0].growth_mib == 35.0


def test_a_start_below_a_landed_commit_is_a_rewind() -> None:
    commits = [checks.Commit(10.0, "a", 0, 50), checks.Commit(12.0, "a", 0, 80),
               checks.Commit(30.0, "b", 0, 120)]
    starts = [checks.Start(11.0, "b", 0, 50),   # after the first commit only: fine
              checks.Start(13.0, "c", 0, 60),   # below 80, acknowledged at 12: a rewind
              checks.Start(13.0, "c", 1, 0),    # nothing committed on partition 1
              checks.Start(31.0, "d", 0, 120)]  # exactly the committed offset: fine
    (rewind,) = checks.rewinds(starts, commits)
    assert (rewind.member, rewind.partition, rewind.started_at, rewind.committed) == (
        "c", 0, 60, 80)


def test_a_commit_acknowledged_after_the_start_does_not_count() -> None:
    # the previous owner's commit landed only after the next one was given the partition:
    # those records are duplicates whose commit had not landed, not a rewind
    commits = [checks.Commit(20.0, "a", 0, 80, sent=9.0)]
    assert checks.rewinds([checks.Start(15.0, "b", 0, 40)], commits) == []
