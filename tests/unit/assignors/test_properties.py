"""Properties every built-in assignor must have, checked on generated groups."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from tests.unit.assignors.strategies import (
    Topics,
    check_valid,
    groups,
    reversed_group,
    with_current,
)
from translation.assignors import (
    BUILTIN_ASSIGNORS,
    GroupSpec,
    PartitionAssignor,
    RangeAssignor,
    UniformAssignor,
)

ASSIGNORS: list[PartitionAssignor] = [UniformAssignor(), RangeAssignor()]
IDS = [a.name for a in ASSIGNORS]


def test_builtin_names_default_first() -> None:
    assert [cls().name for cls in BUILTIN_ASSIGNORS] == ["uniform", "range"]


@pytest.mark.parametrize("assignor", ASSIGNORS, ids=IDS)
@settings(max_examples=300, deadline=None)
@given(case=groups())
def test_every_subscribed_partition_to_exactly_one_subscriber(
    assignor: PartitionAssignor, case: tuple[GroupSpec, Topics]
) -> None:
    group, topics = case
    check_valid(group, topics, assignor.assign(group, topics))


@pytest.mark.parametrize("assignor", ASSIGNORS, ids=IDS)
@settings(max_examples=200, deadline=None)
@given(case=groups())
def test_deterministic_whatever_the_input_order(
    assignor: PartitionAssignor, case: tuple[GroupSpec, Topics]
) -> None:
    group, topics = case
    first = assignor.assign(group, topics)
    again = assignor.assign(group, topics)
    shuffled = assignor.assign(reversed_group(group), topics)
    assert first == again == shuffled


@pytest.mark.parametrize("assignor", ASSIGNORS, ids=IDS)
@settings(max_examples=200, deadline=None)
@given(case=groups())
def test_a_target_is_a_fixed_point(
    assignor: PartitionAssignor, case: tuple[GroupSpec, Topics]
) -> None:
    """Feeding the target back as the current assignment changes nothing."""
    group, topics = case
    target = assignor.assign(group, topics)
    assert assignor.assign(with_current(group, target), topics) == target
