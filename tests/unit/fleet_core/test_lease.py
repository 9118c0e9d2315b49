"""The lease shared by the broker membership and the fleet core: held until the lease's end,
undecided until the session's, then lost; counted from the send time of the answered call."""

from __future__ import annotations

from proxy.fleet_core.lease import LEASE_FRACTION, Lease, LeaseState


def test_held_then_undecided_then_lost() -> None:
    lease = Lease()
    assert lease.state(10**9) is LeaseState.HELD  # nothing answered yet: the caller decides
    lease.answered(100.0, 6.0)
    assert lease.lease_deadline == 100.0 + LEASE_FRACTION * 6.0
    assert lease.state(104.7) is LeaseState.HELD
    assert lease.state(104.8) is LeaseState.UNDECIDED
    assert lease.state(105.99) is LeaseState.UNDECIDED
    assert lease.state(106.0) is LeaseState.LOST


def test_an_answer_to_an_older_call_does_not_move_the_lease_back() -> None:
    lease = Lease()
    lease.answered(10.0, 6.0)
    lease.answered(8.0, 6.0)  # answered late, sent earlier
    assert lease.session_deadline == 16.0
    lease.answered(12.0, 6.0)
    assert lease.session_deadline == 18.0


def test_a_dropped_lease_is_lost_at_once() -> None:
    lease = Lease()
    lease.answered(10.0, 6.0)
    lease.drop()
    assert lease.state(10.0) is LeaseState.LOST
