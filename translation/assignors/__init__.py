"""Server-side partition assignors: the pluggable interface and the built-in ones.

An assignor turns a :class:`GroupSpec` (every member's subscription and current target
assignment) plus topic metadata into a new target assignment. It is pure and deterministic:
same inputs, same output. The engine chooses which assignor a group uses (the one most members
ask for, else the first configured) and stores what it returns as the target assignment.
"""

from translation.assignors.base import (
    Assignment,
    AssignorError,
    GroupSpec,
    MemberSubscription,
    PartitionAssignor,
    SubscriptionType,
)
from translation.assignors.range import RangeAssignor
from translation.assignors.uniform import UniformAssignor

BUILTIN_ASSIGNORS: tuple[type[UniformAssignor] | type[RangeAssignor], ...] = (
    UniformAssignor,
    RangeAssignor,
)
"""The server-side assignors groupgate ships, default first (as in Kafka)."""

__all__ = [
    "BUILTIN_ASSIGNORS",
    "Assignment",
    "AssignorError",
    "GroupSpec",
    "MemberSubscription",
    "PartitionAssignor",
    "RangeAssignor",
    "SubscriptionType",
    "UniformAssignor",
]
