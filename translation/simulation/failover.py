"""The driver's write pipeline for durable group state, as the simulator models it.

After every engine call the driver drains the engine's records
(:meth:`~translation.coordinator.GroupCoordinator.drain_records`) and writes them to the group
state topic as one unit (one transaction); the topic acknowledges units in the order they were
written, each after a delay. A response may leave only once every unit written up to the call
that produced it is acknowledged, not just the call's own: a heartbeat whose call wrote nothing
can still answer with state an earlier, unacknowledged call wrote (the member's new epoch after
a retried heartbeat, say), and a coordinator that fails before that write lands would load a
group that never told the member so. Kafka's coordinator runtime defers such responses the same
way, until the last written offset is committed. The rule itself is
:class:`~translation.write_barrier.WriteBarrier`, the one the proxy's drivers keep.

When the coordinator fails, the units not yet acknowledged are lost with the responses waiting
on them; what was acknowledged is the log a new coordinator loads. Responses already on their
way may still arrive (the simulator decides per response). The pipeline also keeps everything
ever written, acknowledged or not, so the simulator can check that the drained records fold to
the engine's state (:func:`drained_matches`).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from translation.coordinator import GroupCoordinator
from translation.records import StateRecord, fold
from translation.write_barrier import WriteBarrier

Release = Callable[[], None]


class WritePipeline:
    """Units of records written by one coordinator, acknowledged in order after a delay of 1
    to ``max_delay_ms`` (drawn from ``rng``); responses held until the units they depend on
    are acknowledged."""

    def __init__(self, rng: random.Random, max_delay_ms: int, *,
                 wait_for_earlier_writes: bool = True,
                 log: list[StateRecord] | None = None) -> None:
        self.rng = rng
        self.max_delay_ms = max_delay_ms
        self.wait_for_earlier_writes = wait_for_earlier_writes
        self.log: list[StateRecord] = list(log or ())
        """Acknowledged records, in order: what survives a failover (``log``: what the
        coordinator was loaded from)."""
        self.pending: deque[tuple[int, list[StateRecord]]] = deque()
        self.barrier: WriteBarrier[Release] = WriteBarrier()
        """Units written and acknowledged, and the responses waiting for them (the rule of
        :mod:`translation.write_barrier`, which the proxy's drivers keep too)."""
        self.last_ack_at = 0
        self.everything: list[StateRecord] = list(self.log)
        """The log loaded from and every record written since, acknowledged or not (for
        :func:`drained_matches`)."""

    def write(self, records: list[StateRecord], now_ms: int) -> tuple[int, int] | None:
        """Write one call's records; returns (unit, ack time) to schedule, None if empty."""
        if not records:
            return None
        unit = self.barrier.submit()
        self.pending.append((unit, records))
        self.everything.extend(records)
        ack_at = max(self.last_ack_at, now_ms + self.rng.randint(1, self.max_delay_ms))
        self.last_ack_at = ack_at
        return unit, ack_at

    def respond(self, wrote: bool, release: Release) -> None:
        """Send a response now or once what it depends on is acknowledged. ``wrote``: whether
        its own call wrote a unit (the only thing it waits for without
        ``wait_for_earlier_writes``)."""
        needs = self.barrier.submitted if self.wait_for_earlier_writes or wrote else 0
        if self.barrier.hold(release, needs):
            release()

    def ack(self, unit: int) -> list[Release]:
        """The topic acknowledged ``unit`` (and, in order, every unit before it); returns the
        responses that may leave now."""
        while self.pending and self.pending[0][0] <= unit:
            _, records = self.pending.popleft()
            self.log.extend(records)
        return self.barrier.acknowledge(unit)

    def crash(self) -> tuple[int, int]:
        """The coordinator is gone: returns (units lost, responses lost)."""
        lost = (len(self.pending), len(self.barrier.drop()))
        self.pending.clear()
        return lost


def drained_matches(engine: GroupCoordinator, group_id: str, drained: list[StateRecord],
                    wall_ms: int) -> bool:
    """Whether everything drained from ``engine`` so far folds to the group's records as it
    stands: the dirty tracking missed no change and left no stale key."""
    mine = {k: v for k, v in fold(drained).items() if k.group_id == group_id}
    return mine == fold(engine.group_records(group_id, wall_ms))
