"""The classic member state machine: the table in the module's docstring is the code's table,
moves outside it raise, and a held request's content lives exactly as long as the hold."""

from __future__ import annotations

import pytest

from translation.classic import member as states
from translation.classic.member import (
    TRANSITIONS,
    ClassicEvent,
    ClassicMemberMetadata,
    ClassicMemberState,
    ClassicStateError,
    Held,
    PendingJoin,
)


def _documented() -> dict[tuple[states.Position, ClassicEvent], states.Position]:
    doc = states.__doc__ or ""
    rows: dict[tuple[states.Position, ClassicEvent], states.Position] = {}
    for line in doc.splitlines():
        cells = line.split()
        if len(cells) != 5 and not (len(cells) == 6 and cells[:2] == ["any", "state"]):
            continue
        if cells[:2] == ["any", "state"]:
            froms = list(ClassicMemberState)
            held, event, to, to_held = cells[2:]
        else:
            if cells[0] not in ClassicMemberState.__members__:
                continue
            froms = [ClassicMemberState[cells[0]]]
            held, event, to, to_held = cells[1:]
        for state in froms:
            key = ((state, Held[held.upper()]), ClassicEvent[event])
            rows[key] = (ClassicMemberState[to], Held[to_held.upper()])
    return rows


def test_the_documented_table_is_the_table() -> None:
    documented = _documented()
    assert len(documented) >= 10
    assert documented == TRANSITIONS


def test_a_join_can_be_held_only_while_preparing_and_a_sync_only_while_completing() -> None:
    for (_, _), (state, held) in TRANSITIONS.items():
        if held is Held.JOIN:
            assert state is ClassicMemberState.PREPARE_REBALANCE
        if held is Held.SYNC:
            assert state is ClassicMemberState.COMPLETING_REBALANCE


def test_a_move_outside_the_table_raises() -> None:
    meta = ClassicMemberMetadata(10_000, ("range",), 0)
    meta.transition(ClassicEvent.JOIN_ANSWERED)
    meta.transition(ClassicEvent.SYNC_HELD)
    with pytest.raises(ClassicStateError):
        meta.transition(ClassicEvent.JOIN_HELD, PendingJoin([], 1000))
    with pytest.raises(ClassicStateError):
        meta.transition(ClassicEvent.TOLD_TO_REJOIN)
    assert meta.position == (ClassicMemberState.COMPLETING_REBALANCE, Held.SYNC)


def test_the_held_join_content_lives_as_long_as_the_hold() -> None:
    meta = ClassicMemberMetadata(10_000, ("range",), 0)
    pending = PendingJoin([("foo", [0])], 1000)
    assert meta.transition(ClassicEvent.JOIN_HELD, pending) is Held.NOTHING
    assert meta.pending_join is pending
    assert meta.transition(ClassicEvent.TOLD_TO_REJOIN) is Held.JOIN
    assert meta.pending_join is pending
    assert meta.transition(ClassicEvent.HELD_ANSWERED) is Held.JOIN
    assert meta.pending_join is None
    assert meta.position == (ClassicMemberState.PREPARE_REBALANCE, Held.NOTHING)
