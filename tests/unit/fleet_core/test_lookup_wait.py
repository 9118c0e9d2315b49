"""The bounded lookup wait (``CoreConfig.lookup_wait_ms``): requests held for a lookup of
``looking`` wait at most that long after it began, then hear COORDINATOR_NOT_AVAILABLE while
it goes on, and a request that comes later is answered so at once; what the lookup finds
afterwards still moves the group (the fleet route's lookups, ``proxy/coordination/peers.py``).
Without the bound they wait for the whole lookup."""

from __future__ import annotations

import dataclasses

from proxy.fleet_core import events as ev
from proxy.fleet_core.core import CoreConfig, GroupCore, Role
from translation.errors import ErrorCode

CONFIG = CoreConfig(session_ms=3_000, hold_ms=2_000, lookup_ms=1_000, lookup_wait_ms=250,
                    view_ms=10_000, let_go_ms=6_000, retry_ms=200)
NOT_AVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE


def test_requests_wait_for_a_lookup_a_bounded_time_after_it_began() -> None:
    core = GroupCore("g", "s0", CONFIG)
    lookup = core.handle(ev.Request(1, "m"), 0)
    assert lookup == [ev.Lookup(1)] and core.role is Role.LOOKING
    core.handle(ev.Request(2, "m"), 100)  # queued behind the first: bounded from the lookup
    assert core.held == 2 and core.next_deadline() == 250
    assert core.tick(250) == [ev.Fail(1, NOT_AVAILABLE), ev.Fail(2, NOT_AVAILABLE)]
    assert core.role is Role.LOOKING  # the lookup goes on
    assert core.handle(ev.Request(3, "m"), 300) == [ev.Fail(3, NOT_AVAILABLE)]
    assert core.held == 0
    core.handle(ev.LookedUp(1, ev.Shape.HELD, "s1"), 400)
    assert core.role is Role.FOLLOWING
    assert core.handle(ev.Request(4, "m"), 410) == [ev.Relay(4, "s1")]


def test_a_request_held_past_the_lookup_is_held_for_the_election() -> None:
    """The bound is the lookup's: a free group's election holds the request for ``hold_ms``."""
    core = GroupCore("g", "s0", CONFIG)
    core.handle(ev.Request(1, "m", starts_group=True), 0)
    core.handle(ev.LookedUp(1, ev.Shape.FREE), 100)
    assert core.role is Role.ELECTING and core.held == 1
    assert core.tick(1_000) == [] and core.held == 1


def test_without_a_bound_requests_wait_for_the_whole_lookup() -> None:
    core = GroupCore("g", "s0", dataclasses.replace(CONFIG, lookup_wait_ms=None))
    core.handle(ev.Request(1, "m"), 0)
    assert core.tick(250) == [] and core.held == 1
    assert core.handle(ev.Request(2, "m"), 300) == [] and core.held == 2
    assert ev.Fail(1, NOT_AVAILABLE) in core.tick(1_000)  # the lookup ran out: unreachable
