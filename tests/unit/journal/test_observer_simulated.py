"""The journal tells the whole story: seeded simulations (both protocols, static members, slow
revocations, crashes, topic changes) run with a :class:`JournalObserver` attached, and after
every engine call the events so far, folded back together, give the engine's groups, members,
states and who holds which partition. Every event also passes the schema check and survives
its JSON encoding."""

from __future__ import annotations

import pytest

from proxy.journal.observer import JournalObserver
from proxy.journal.schema import Event, EventType, check, decode
from translation.effects import Effect
from translation.simulation.simulator import Simulation, knobs_for_seed
from translation.topics import TopicId

from .replay import Replay, mismatches


def run_observed(seed: int, **knobs: object) -> tuple[list[Event], int]:
    sim = Simulation(seed, knobs_for_seed(seed, **knobs))
    observer = JournalObserver(source="sim:0")
    observer.attach(sim.engine)
    replay = Replay()
    events: list[Event] = []
    known: dict[TopicId, str] = {}
    calls = 0
    after_engine = sim.after_engine

    def observed(effects: list[Effect]) -> None:
        nonlocal calls
        calls += 1
        batch = observer.observe(effects, sim.now)
        for event in batch:
            value = event.to_value()
            assert check(value) == [], (value, check(value))
            assert decode(event.encode()) == Event(event.type, event.group, event.ts,
                                                   event.source, event.seq,
                                                   {k: v for k, v in value.items()
                                                    if k not in ("v", "type", "ts", "group",
                                                                 "source", "seq")})
            replay.apply(event)
        events.extend(batch)
        problems = mismatches(replay, sim.engine, known)
        assert not problems, f"seed {seed} after call {calls} at t={sim.now}: {problems}"
        after_engine(effects)

    sim.after_engine = observed  # type: ignore[method-assign]
    sim.run()
    return events, calls


@pytest.mark.parametrize("seed", range(12))
def test_replayed_journal_matches_the_engine(seed: int) -> None:
    events, calls = run_observed(seed)
    assert calls > 0 and events
    kinds = {e.type for e in events}
    assert {EventType.GROUP_CREATED, EventType.MEMBER_JOINED, EventType.ASSIGNMENT,
            EventType.EPOCH_BUMPED, EventType.GROUP_STATE} <= kinds
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


@pytest.mark.parametrize("seed", range(100, 108))
def test_replayed_journal_matches_the_engine_with_classic_members(seed: int) -> None:
    events, _ = run_observed(seed, classic_share=0.5)
    protocols = {e.fields.get("protocol") for e in events if e.type is EventType.MEMBER_JOINED}
    assert "classic" in protocols


def test_steady_heartbeats_make_no_events() -> None:
    """Most engine calls are heartbeats that change nothing; they must not reach the journal."""
    events, calls = run_observed(3)
    assert len(events) < calls
