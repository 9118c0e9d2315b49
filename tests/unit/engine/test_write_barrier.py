"""The write barrier's rule (translation/write_barrier.py), which the fleet core, the state
log's driver and the engine's failover simulation all keep."""

from __future__ import annotations

from translation.write_barrier import WriteBarrier


def test_an_answer_waits_for_every_unit_submitted_before_it_not_only_its_own() -> None:
    barrier: WriteBarrier[str] = WriteBarrier()
    assert barrier.hold("nothing written yet")
    assert barrier.submit() == 1
    assert not barrier.hold("after unit 1")  # its own call wrote nothing: still waits
    assert barrier.submit() == 2
    assert not barrier.hold("after unit 2")
    assert barrier.acknowledge(1) == ["after unit 1"]
    assert barrier.acknowledge(1) == []  # nothing new
    assert not barrier.settled()
    assert barrier.acknowledge(2) == ["after unit 2"]
    assert barrier.settled() and barrier.waiting == 0


def test_an_answer_may_name_the_unit_it_needs() -> None:
    barrier: WriteBarrier[str] = WriteBarrier()
    barrier.submit()
    barrier.submit()
    assert barrier.hold("needs nothing", 0)
    assert not barrier.hold("needs 1", 1)
    assert barrier.acknowledge(1) == ["needs 1"]


def test_dropped_and_withdrawn_answers_never_leave() -> None:
    barrier: WriteBarrier[str] = WriteBarrier()
    barrier.submit()
    barrier.hold("a")
    barrier.hold("b")
    assert barrier.withdraw("a") and not barrier.withdraw("a")
    assert barrier.drop() == ["b"]
    assert barrier.acknowledge(1) == []
    barrier.submit()
    barrier.hold("c")
    assert barrier.reset() == ["c"]
    assert (barrier.submitted, barrier.acknowledged) == (0, 0) and barrier.hold("d")
