"""What changed in a group since its records were last drained (durable group state).

The verbs that write a group (:class:`~translation.state.CoordinatorState`) and the group's own
methods (:class:`~translation.group.ConsumerGroup`) mark here which of the group's records
(:mod:`translation.records`) no longer match it: the group record, a member's member record, a
member's assignment record. Nothing is copied or diffed: a mark is a flag or a member id added
to a set, and :meth:`~translation.coordinator.GroupCoordinator.drain_records` reads the current
values of what is marked. A member id marked but no longer in the group becomes tombstones; a
group marked dropped becomes tombstones for every key it may have written.

Marks are kept only when the engine keeps durable state (``GroupConfig.durable_state``);
otherwise the group has no journal and marking does nothing.
"""

from __future__ import annotations


class GroupChanges:
    """One group's records to write at the next drain."""

    __slots__ = ("assignments", "group", "members")

    def __init__(self) -> None:
        self.group = False
        """The group record (epochs, preferred assignor, subscription metadata, emptiness)."""
        self.members: set[str] = set()
        """Member ids whose member record (identity, subscription, classic protocols) changed."""
        self.assignments: set[str] = set()
        """Member ids whose assignment record (epochs, state, partitions, target, classic
        position) changed."""

    def merge(self, other: GroupChanges) -> None:
        self.group = self.group or other.group
        self.members |= other.members
        self.assignments |= other.assignments
