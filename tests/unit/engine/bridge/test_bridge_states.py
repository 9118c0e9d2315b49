"""The bridged member's transition table: the one in the module's docstring is the code's, and
a move outside it raises."""

from __future__ import annotations

import pytest

from translation.bridge import member as bridge
from translation.bridge.member import (
    TRANSITIONS,
    BridgedMember,
    BridgeEvent,
    BridgeState,
    BridgeStateError,
)


def _documented() -> dict[tuple[BridgeState, BridgeEvent], BridgeState]:
    rows: dict[tuple[BridgeState, BridgeEvent], BridgeState] = {}
    for line in (bridge.__doc__ or "").splitlines():
        cells = line.split()
        if len(cells) == 3 and cells[0] in BridgeState.__members__:
            rows[(BridgeState[cells[0]], BridgeEvent[cells[1]])] = BridgeState[cells[2]]
    return rows


def test_the_documented_table_is_the_table() -> None:
    documented = _documented()
    assert len(documented) >= 20
    assert documented == TRANSITIONS


def test_every_state_but_left_can_end_and_left_is_final() -> None:
    for state in BridgeState:
        moves = {event for (s, event) in TRANSITIONS if s is state}
        if state is BridgeState.LEFT:
            assert not moves
        else:
            assert moves & {BridgeEvent.LEFT, BridgeEvent.LEAVE}


def test_a_move_outside_the_table_raises() -> None:
    m = BridgedMember(group_id="g", fleet_address="a", member_id="m", client_id="c",
                      subscribed_names=["t"], session_timeout_ms=30_000,
                      rebalance_timeout_ms=60_000)
    with pytest.raises(BridgeStateError):
        m._move(BridgeEvent.SYNCED)
    assert m.state is BridgeState.UNJOINED
