"""A request's own hold bound: a ConsumerGroupHeartbeat waits at most half a heartbeat interval
for a lookup, an election or a load (librdkafka times one out after an interval, drops the
connection and reconnects with a growing backoff), then hears its ``hold_error``; other
requests keep the core's ``hold_ms``."""

from __future__ import annotations

from proxy.fleet_core import events as ev
from proxy.fleet_core.core import CoreConfig, GroupCore, Role
from translation.errors import ErrorCode

CONFIG = CoreConfig(session_ms=3_000, hold_ms=2_000, lookup_ms=1_000, view_ms=10_000,
                    let_go_ms=6_000, retry_ms=200)


def test_a_heartbeat_held_for_a_lookup_gets_its_own_error_after_its_own_bound() -> None:
    core = GroupCore("g", "s0", CONFIG)
    core.handle(ev.Request(1, "m", hold_ms=500,
                           hold_error=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), 0)
    core.handle(ev.Request(2, "m"), 0)
    assert core.role is Role.LOOKING and core.held == 2
    assert core.next_deadline() == 500
    assert core.tick(500) == [ev.Fail(1, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)]
    assert core.held == 1
    out = core.tick(999)
    assert out == [] and core.held == 1
    # The lookup runs out at 1 000: the group counts as unreachable, the rest is failed.
    assert ev.Fail(2, ErrorCode.COORDINATOR_NOT_AVAILABLE) in core.tick(1_000)


def test_a_request_s_own_bound_never_lengthens_the_core_s() -> None:
    core = GroupCore("g", "s0", CoreConfig(session_ms=3_000, hold_ms=300, lookup_ms=1_000))
    core.handle(ev.Request(1, "m", hold_ms=5_000), 0)
    assert core.next_deadline() == 300
    assert core.tick(300) == [ev.Fail(1, ErrorCode.COORDINATOR_NOT_AVAILABLE)]
