"""Rebalance metrics from hand-made timelines: the numbers a person would compute by hand."""

from __future__ import annotations

import pytest

from tests.benchmarks.rebalance import timeline
from tests.benchmarks.rebalance.timeline import (
    Consumed,
    Event,
    Produced,
    compute,
    duplicates,
    peak_lag,
)


def formed(partitions: int, members: list[str]) -> list[Event]:
    """A stable group at t=0: partitions dealt round-robin."""
    events = [Event(0.0, m, "join") for m in members]
    for i, m in enumerate(members):
        events.append(Event(0.0, m, "assign", tuple(range(i, partitions, len(members)))))
    return events


def test_eager_stop_the_world_costs_every_partition_until_reassigned() -> None:
    events = [
        *formed(4, ["a", "b"]),
        Event(10.0, "c", "join"),
        Event(10.5, "a", "revoke", (0, 2)),
        Event(10.5, "b", "revoke", (1, 3)),
        Event(12.0, "a", "assign", (0,)),
        Event(12.0, "b", "assign", (1, 3)),
        Event(12.0, "c", "assign", (2,)),
    ]
    m = compute(events, 4, trigger=10.0, end=20.0)
    assert m.downtime_partition_s == pytest.approx(4 * 1.5)
    assert m.convergence_s == pytest.approx(2.0)
    assert m.members_disturbed == 2 and m.partitions_revoked == 4


def test_incremental_move_costs_only_the_moved_partition() -> None:
    events = [
        *formed(4, ["a", "b"]),
        Event(10.0, "c", "join"),
        Event(11.0, "a", "revoke", (2,)),
        Event(13.0, "c", "assign", (2,)),
    ]
    m = compute(events, 4, trigger=10.0, end=20.0)
    assert m.downtime_partition_s == pytest.approx(2.0)
    assert m.convergence_s == pytest.approx(3.0)
    assert m.disturbed == ("a",)


def test_a_partition_owned_twice_is_not_converged() -> None:
    events = [*formed(2, ["a", "b"]), Event(5.0, "b", "assign", (0,))]
    assert compute(events, 2, trigger=5.0, end=9.0).convergence_s is None


def test_crash_counts_downtime_until_the_partitions_move() -> None:
    events = [*formed(2, ["a", "b"]), Event(1.0, "b", "crash"), Event(7.0, "a", "assign", (1,))]
    m = compute(events, 2, trigger=1.0, end=10.0)
    assert m.downtime_partition_s == pytest.approx(6.0)
    assert m.convergence_s == pytest.approx(6.0)


def test_duplicates_and_lag() -> None:
    batches = [Consumed(1.0, "a", ((0, 0, 9),)), Consumed(2.0, "b", ((0, 5, 14),))]
    assert duplicates(batches) == (20, 5)
    produced = [Produced(0.5, {0: 10}), Produced(1.5, {0: 30})]
    # At 1.5 the position is 10 and the high-water mark 30: lag 20; at 2.0 it drops to 15.
    assert peak_lag(produced, batches, 0.0, 3.0) == 20


def test_unknown_event_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown event kind"):
        Event(0.0, "a", "teleport")


# -- double ownership ---------------------------------------------------------------------------


def test_a_clean_handover_has_no_overlap() -> None:
    events = [
        Event(0.0, "a", "join"), Event(0.0, "a", "stall"), Event(0.0, "a", "assign", (0, 1)),
        Event(0.0, "a", "resume"),
        Event(1.0, "b", "join"),
        Event(2.0, "a", "stall"), Event(2.0, "a", "revoke", (1,)), Event(2.1, "a", "resume"),
        Event(2.2, "b", "stall"), Event(2.2, "b", "assign", (1,)), Event(2.2, "b", "resume"),
    ]
    assert timeline.overlaps(events) == []


def test_an_assignment_entered_before_the_revocation_returned_is_an_overlap() -> None:
    events = [
        Event(0.0, "a", "stall"), Event(0.0, "a", "assign", (0, 1)), Event(0.0, "a", "resume"),
        Event(2.0, "a", "stall"), Event(2.0, "a", "revoke", (1,)),
        Event(2.05, "b", "stall"), Event(2.06, "b", "assign", (1,)), Event(2.06, "b", "resume"),
        Event(2.1, "a", "resume"),  # a's callback returned after b started
    ]
    assert timeline.overlaps(events) == [timeline.Overlap(2.05, 1, "a", "b")]


def test_leave_crash_and_lost_end_ownership() -> None:
    events = [
        Event(0.0, "a", "assign", (0,)), Event(0.0, "b", "assign", (1,)),
        Event(0.0, "c", "assign", (2,)),
        Event(1.0, "a", "leave"), Event(1.0, "b", "crash"), Event(1.0, "c", "lost", (2,)),
        Event(1.5, "d", "assign", (0, 1, 2)),
    ]
    assert timeline.overlaps(events) == []


def test_members_without_callback_brackets_release_at_the_revocation() -> None:
    events = [  # Java VerifiableConsumer members report no stall/resume
        Event(0.0, "a", "assign", (0,)), Event(1.0, "a", "revoke", (0,)),
        Event(1.0, "b", "assign", (0,)),
    ]
    assert timeline.overlaps(events) == []
    events = [Event(0.0, "a", "assign", (0,)), Event(1.0, "b", "assign", (0,))]
    assert timeline.overlaps(events) == [timeline.Overlap(1.0, 0, "a", "b")]
