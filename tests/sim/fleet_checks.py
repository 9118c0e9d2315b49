"""What the fleet simulator checks after every event (``tests/sim/fleet_sim.py``), kept apart
from the simulation so each rule reads on its own.

* :class:`Reach` and :class:`Owners`: no partition has two owners among members that can
  still reach a coordinator. A member cannot while its pod's sidecar is killed, frozen or
  gone (stopping), or while that sidecar is cut off from the broker and knows no holder to
  relay to (it cannot find the group's coordinator, as a Kafka client cut off from its
  coordinator cannot); it counts again from the next answer a coordinator gives it (an
  answer, or being told it is fenced). Such a member keeps consuming meanwhile, as real
  KIP-848 clients do (neither librdkafka nor the Java client has a session check of its own
  with the consumer protocol), and the overlap is Kafka's zombie case, which commit fencing
  covers; when it counts again, whatever it still owns must be its own.
* :class:`Offsets`: no committed offset at the broker moves back, and at the end every
  partition was consumed and committed up to what was produced before the faults stopped.
* The rest is checked by the simulation itself, where the state is: the acting sidecar leads
  the broker's group and holds its lease, and no other may act; no live member is fenced by an
  engine while a request of it is inside that sidecar; a live member is told it is fenced
  (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH) only by an engine or by a sidecar letting go of a
  group it lost; a lock member joins only a group no other sidecar held when it was given its
  member id (contested elections); no client knows an epoch a takeover did not load.
"""

from __future__ import annotations

from collections.abc import Callable

from translation.simulation.client import TP
from translation.simulation.invariants import InvariantViolation

KNOWN_GAPS = {
    "stuck-ticketed-commit": (
        "a follower cut off from the broker holds a member's ticketed commit (sent on the "
        "member's connection to the broker it cannot reach) without bound, and the member's "
        "heartbeats wait behind it on that connection: the holder fences the member while its "
        "requests are inside the follower (73432a6 bounds such a commit at the holder only)"),
    "commit-relay-outlasts-session": (
        "a follower waits up to 20 s (f4b6096) for the holder's answer to a member's commit "
        "(its CommitTicket), longer than the 19 s session the fleet rule accepts, and the "
        "member's heartbeats wait behind it: fenced while inside the follower"),
    "stranded-after-lost-answer": (
        "an answer that moved a member to a new epoch with new partitions is lost (the "
        "client timed the heartbeat out and closed the connection); librdkafka sends the timed-"
        "out heartbeat again as it was (the previous epoch, not a full request), which the "
        "engine accepts (the lost-answer rule) and answers without the assignment: the client "
        "takes the new epoch and never learns of the partitions, which nobody consumes"),
    "let-go-told-once": (
        "a sidecar letting go of a group it lost tells each member UNKNOWN_MEMBER_ID once, on "
        "its first request (GroupCore._to_tell); when that request is a commit "
        "(UNKNOWN_MEMBER_ID on a commit makes a KIP-848 client heartbeat, not let go) or its "
        "answer does not reach "
        "the client (it closed the connection), the member's later requests only hear "
        "COORDINATOR_NOT_AVAILABLE: it keeps its partitions while the next holder gives them "
        "to others"),
    "unseen-stale-retry": (
        "librdkafka re-sends a commit after a newer one of the same member landed, but the "
        "sidecar the client is connected to did not see the newer one succeed (it restarted "
        "since, its answer had not left yet, or it was decided elsewhere under another member "
        "epoch), so the stale-retry guard writes the retry and the committed offset moves back"),
}
"""Gaps of today's product the simulator finds, by tag. A violation one of these explains is
counted (``gap-<tag>`` in the stats, the first one noted in the result) and the seed goes on;
with ``Knobs.strict_gaps`` it fails the seed instead (:class:`GapViolation`), which is how each
gap's replayed seed (``tests/sim/test_fleet_defects.py``) shows it is still there. Any other
violation fails the seed."""

Gap = Callable[[str, str], None]
"""Reports a known gap: (tag, what happened)."""


class GapViolation(InvariantViolation):
    """A violation a known gap of the product explains (:data:`KNOWN_GAPS`)."""

    def __init__(self, gap: str, message: str) -> None:
        assert gap in KNOWN_GAPS, gap
        super().__init__(f"[{gap}] {message}")
        self.gap = gap


def fmt(tp: TP) -> str:
    return f"{str(tp[0])[:8]}-{tp[1]}"


class Reach:
    """Members that cannot reach a coordinator now, or have not since they last could."""

    def __init__(self) -> None:
        self.out: dict[str, str] = {}
        """Client -> why it lost its way to a coordinator."""

    def lost(self, client: str, why: str) -> None:
        self.out.setdefault(client, why)

    def reaches(self, client: str) -> bool:
        return client not in self.out

    def heard(self, client: str) -> bool:
        """A coordinator answered ``client``; True if it could not reach one until now."""
        return self.out.pop(client, None) is not None


class Owners:
    """Partition -> the clients that believe they own it; two of them that both reach a
    coordinator are a violation."""

    def __init__(self, reach: Reach, gap: Gap) -> None:
        self.reach = reach
        self.gap = gap
        self.owners: dict[TP, set[str]] = {}
        self.fenced_by_gap: dict[str, str] = {}
        """Client -> the known gap that had it fenced while it lived: its overlaps are that
        gap's consequence."""

    def acquire(self, client: str, tp: TP) -> None:
        holders = self.owners.setdefault(tp, set())
        holders.add(client)
        self._check(tp, client)

    def release(self, client: str, tp: TP) -> None:
        holders = self.owners.get(tp)
        if holders is not None:
            holders.discard(client)

    def back_in_reach(self, client: str, owned: set[TP]) -> None:
        for tp in sorted(owned, key=lambda t: (str(t[0]), t[1])):
            self._check(tp, client)

    def _check(self, tp: TP, client: str) -> None:
        if not self.reach.reaches(client):
            return
        others = sorted(o for o in self.owners.get(tp, ()) if o != client
                        and self.reach.reaches(o))
        if others:
            message = (f"partition {fmt(tp)} owned by {others[0]} and {client} at the same "
                       "time (both reach a coordinator)")
            gap = self.fenced_by_gap.get(client) or self.fenced_by_gap.get(others[0])
            if gap is None:
                raise InvariantViolation(message)
            self.gap(gap, message)


class Offsets:
    """The broker's committed offsets; one that moves back is a violation."""

    def __init__(self, gap: Gap) -> None:
        self.gap = gap
        self.committed: dict[TP, int] = {}
        self.moved_back: set[TP] = set()
        """Partitions a known gap moved back (an idle one stays back: nothing newer to
        commit)."""

    def store(self, tp: TP, offset: int, who: str, unseen_retry: bool = False) -> None:
        """``unseen_retry``: the write is a client's retry that the stale-retry guard of the
        sidecar it came through could not know to be stale."""
        before = self.committed.get(tp)
        if before is not None and offset < before:
            message = (f"partition {fmt(tp)}: committed offset moved back from {before} to "
                       f"{offset} ({who})")
            if not unseen_retry:
                raise InvariantViolation(message)
            self.moved_back.add(tp)
            self.gap("unseen-stale-retry", message)
        self.committed[tp] = offset

    def expire(self, tp: TP, why: str) -> None:
        """The broker deleted the partition's committed offset (KIP-211 expiry): its next
        owner starts from the beginning, so the offset moved back."""
        before = self.committed.pop(tp, None)
        if before is not None and before > 0:
            raise InvariantViolation(
                f"partition {fmt(tp)}: committed offset {before} expired at the broker "
                f"({why}): moved back to the start")

    def get(self, tp: TP) -> int:
        return self.committed.get(tp, 0)

    def check_consumed(self, produced: dict[TP, int]) -> None:
        """Every partition consumed and committed up to ``produced``."""
        behind = sorted((fmt(tp), self.get(tp), end) for tp, end in produced.items()
                        if self.get(tp) < end)
        if behind:
            tp, at, end = behind[0]
            message = (f"no progress: {len(behind)} partitions not consumed to the end of the "
                       f"faults (first {tp}: committed {at} of {end})")
            if {fmt(t) for t in self.moved_back} >= {b[0] for b in behind}:
                self.gap("unseen-stale-retry", message)
                return
            raise InvariantViolation(message)
