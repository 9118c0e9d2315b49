"""The write barrier of durable group state, sans-I/O: one rule, kept by every driver.

After every engine call that changed durable state, its driver writes what the call changed as
one *unit* (one state-log transaction); units are numbered 1, 2, ... per group and per writer
and acknowledged in order. The rule: an answer leaves only once every unit submitted up to its
engine call is acknowledged, not only its own. A call that wrote nothing may still answer with
what an earlier, unacknowledged call decided (a retried heartbeat gets the epoch the lost
response carried); if that write were lost in a failover, the member would know an epoch the
next coordinator never heard of. Kafka's coordinator runtime defers such responses the same
way, until the last written offset is committed.

:class:`WriteBarrier` is that rule and nothing else: it counts units submitted and
acknowledged and keeps the answers waiting (whatever the driver uses for one: a request id, a
trio event, a callable), releasing them as acknowledgements arrive. It reads no clock and
does no I/O. Its drivers: the fleet core (:mod:`proxy.fleet_core.core`, answers by request
id), the service's state log (:mod:`proxy.coordination.durability`, trio events) and the
engine's failover simulation (:mod:`translation.simulation.failover`, callables).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class WriteBarrier(Generic[T]):
    """Units submitted and acknowledged (in order) for one group's writer, and the answers
    waiting for them. Bounded by its driver: one waiting answer per request in flight."""

    __slots__ = ("_waiting", "acknowledged", "submitted")

    def __init__(self) -> None:
        self.submitted = 0
        """Number of the last unit submitted."""
        self.acknowledged = 0
        """Every unit up to this one is acknowledged."""
        self._waiting: deque[tuple[int, T]] = deque()

    def submit(self) -> int:
        """An engine call changed durable state: its records become the next unit (returned)."""
        self.submitted += 1
        return self.submitted

    def settled(self) -> bool:
        """Whether every unit submitted so far is acknowledged."""
        return self.acknowledged >= self.submitted

    def hold(self, answer: T, needs: int | None = None) -> bool:
        """An answer is ready: True if it may leave now; otherwise it is kept until every unit
        up to ``needs`` (by default every unit submitted so far) is acknowledged, and
        :meth:`acknowledge` releases it."""
        unit = self.submitted if needs is None else needs
        if unit <= self.acknowledged:
            return True
        self._waiting.append((unit, answer))
        return False

    def acknowledge(self, unit: int) -> list[T]:
        """The log acknowledged every unit up to ``unit``: the answers that may leave now, in
        the order they were held (an acknowledgement of nothing new releases nothing)."""
        if unit <= self.acknowledged:
            return []
        self.acknowledged = unit
        released: list[T] = []
        kept: deque[tuple[int, T]] = deque()
        for needs, answer in self._waiting:
            if needs <= unit:
                released.append(answer)
            else:
                kept.append((needs, answer))
        self._waiting = kept
        return released

    def withdraw(self, answer: T) -> bool:
        """Stop keeping ``answer`` (its request gave up waiting); whether it was kept."""
        for i, (_, kept) in enumerate(self._waiting):
            if kept is answer or kept == answer:
                del self._waiting[i]
                return True
        return False

    def drop(self) -> list[T]:
        """The writes failed or the writer is gone: every waiting answer, which must not leave
        as the engine gave it; nothing is kept."""
        dropped = [answer for _, answer in self._waiting]
        self._waiting.clear()
        return dropped

    def reset(self) -> list[T]:
        """A new writer (or none): counting starts again from 0; returns what was waiting."""
        self.submitted = self.acknowledged = 0
        return self.drop()

    @property
    def waiting(self) -> int:
        return len(self._waiting)
