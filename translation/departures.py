"""The departure wait: a restarted application leaves and comes back in one target change.

An eager classic client (the ``range``, ``roundrobin`` and ``sticky`` assignors, or the Java
client's default ``[range, cooperative-sticky]``) revokes every partition it owns each time it
is asked to rejoin, whatever it keeps afterwards. Restarting one application of a group is a
departure (its client closes: LeaveGroup, or a leave heartbeat with epoch -1) followed, a few
seconds later, by an arrival (the restarted process, under a new member id, possibly on the
consumer protocol). Computed one after the other, each is a target change:
the departure hands the departed member's partitions to some of the others and the arrival
takes some back, so an eager member touched by both goes round twice; Kafka folds them only
when both fall within its assignment interval (``group.consumer.assignment.interval.ms``, 1 s).

With ``GroupConfig.classic_departure_wait_ms`` > 0, a departure from a group that still has an
eager classic member opens a *departure wait*: the group's next target computation is held
until as many members have arrived as departed since the wait opened, or until the wait runs
out (``classic_departure_wait_ms`` from the first departure; later departures do not extend
it), whichever comes first. Members that arrive meanwhile are folded into the same
computation, so the replacement usually takes the departed member's partitions (the
assignors are sticky) and the members that stayed keep what they had: members whose target is
unchanged are advanced without a rejoin (quiet advance), and an eager member goes round at most
once per restart. The wait also ends when no eager classic member is left.

Only a member that says it leaves opens a wait (or counts in an open one). A fenced member
(session, rebalance, join or sync timeout, or a pod-local fence: its process is gone) crashed
or hung: its partitions have gone unconsumed since then already, its replacement may never
come or (after a session timeout) has usually come already, and the fence is there to hand its
partitions on quickly; its fence is computed at once, as before. A static member's temporary
leave (epoch -2) keeps its partitions and is no departure.

What it costs: the departed members' partitions stay unassigned during the wait (the arrival
ends it; with no arrival, the whole wait). Nothing else is held back: the members that stayed
keep consuming, and a member's own heartbeats, commits and revocations go on as usual. Every
other reason to compute a target that comes up during the wait (a subscription change, a topic
change) is folded in as well. A classic JoinGroup that comes in during the wait is held like
one waiting for the assignment interval (``GroupConfig.defer_classic_join``), at most until the
wait ends. The wait is not part of the group's records: a coordinator that takes the group over
computes the target at once.

Where the target computation is decided, :meth:`translation.state.CoordinatorState.
maybe_compute_target_assignment` asks :func:`holds` first; :meth:`~translation.state.
CoordinatorState.remove_member` and :meth:`~translation.state.CoordinatorState.add_member`
tell :func:`departed` and :func:`arrived`.
"""

from __future__ import annotations

from translation.effects import DepartureWaitEnded, DepartureWaitStarted, Effect
from translation.group import ConsumerGroup, DepartureWait
from translation.member import ConsumerGroupMember

COOPERATIVE_PROTOCOLS = frozenset({"cooperative-sticky"})
"""Classic protocol names whose clients revoke only what they lose. A client offering any
other protocol as well is eager (the Java client and librdkafka use the eager protocol unless
every configured assignor supports the cooperative one)."""


def is_eager(member: ConsumerGroupMember) -> bool:
    """Whether the member is a classic client that revokes everything at each rebalance."""
    meta = member.classic
    return meta is not None and any(p not in COOPERATIVE_PROTOCOLS for p in meta.protocols)


def has_eager_member(group: ConsumerGroup) -> bool:
    return any(is_eager(m) for m in group.members.values())


def departed(group: ConsumerGroup, member_id: str, wait_ms: int, now_ms: int,
             effects: list[Effect]) -> None:
    """``member_id`` left (already out of ``group``): open the group's wait, or count one more
    arrival to wait for in the open one."""
    wait = group.departure_wait
    if wait is not None:
        wait.departed.append(member_id)
        return
    if wait_ms <= 0 or not group.members or not has_eager_member(group):
        return
    group.departure_wait = DepartureWait(now_ms, now_ms + wait_ms, [member_id])
    effects.append(DepartureWaitStarted(group.group_id, member_id, now_ms + wait_ms))


def arrived(group: ConsumerGroup, member_id: str) -> None:
    """A new member joined ``group`` (either protocol)."""
    wait = group.departure_wait
    if wait is not None:
        wait.arrived.append(member_id)


def holds(group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> int | None:
    """Until when the group's target computation must wait for arrivals (None: compute now;
    an open wait that is over is closed, with a :class:`DepartureWaitEnded` effect)."""
    wait = group.departure_wait
    if wait is None:
        return None
    if wait.awaited > 0 and now_ms < wait.until_ms and has_eager_member(group):
        return wait.until_ms
    close(group, now_ms, effects)
    return None


def close(group: ConsumerGroup, now_ms: int, effects: list[Effect]) -> None:
    """End the group's open wait (it is over, or the group emptied or is dropped)."""
    wait = group.departure_wait
    if wait is None:
        return
    group.departure_wait = None
    effects.append(DepartureWaitEnded(group.group_id, tuple(wait.departed), tuple(wait.arrived),
                                      now_ms - wait.since_ms))
