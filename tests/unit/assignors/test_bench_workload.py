"""The benchmark inputs (``tests.benchmarks.workload``): deterministic, and faithfully written."""

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.workload import (
    ImageDescriber,
    assignment_digest,
    build_workload,
    moved_partitions,
    with_new_member,
    write_case,
)
from translation.assignors import SubscriptionType, UniformAssignor
from translation.assignors.uniform import _water_fill


def test_same_parameters_same_workload() -> None:
    a = build_workload(20, 3, 4, homogeneous=False)
    b = build_workload(20, 3, 4, homogeneous=False)
    assert a == b
    assert build_workload(20, 3, 4, homogeneous=True) != a
    assert a.group.subscription_type is SubscriptionType.HETEROGENEOUS
    assert sum(m.partitions for m in a.image.by_id.values()) == 60


def test_case_file_lists_subscriptions_and_current_assignment_as_ranges(tmp_path: Path) -> None:
    w = build_workload(3, 2, 2, homogeneous=True)
    target = UniformAssignor().assign(w.group, ImageDescriber(w.image))
    w2 = with_new_member(w, target)
    path = tmp_path / "case.txt"
    write_case(w2, path)
    lines = path.read_text().splitlines()
    assert lines[0] == "type HOMOGENEOUS"
    assert lines[1] == "topics 2"
    assert lines[4] == "members 4"
    rows = {line.split()[0]: line.split()[1:] for line in lines[5:]}
    for member_id, per_topic in target.items():
        instance, subs, assigned = rows[member_id]
        assert (instance, subs) == ("-", "0,1")
        expected = ";".join(
            f"{w.topic_order.index(t)}:{','.join(map(str, sorted(ps)))}"
            if len(ps) == 1
            else f"{w.topic_order.index(t)}:{min(ps)}-{max(ps)}"
            for t, ps in sorted(per_topic.items(), key=lambda kv: w.topic_order.index(kv[0]))
        )
        assert assigned == (expected or "-")


def test_digest_ignores_order_and_empty_entries_and_moves_are_counted() -> None:
    w = build_workload(4, 2, 1, homogeneous=True)
    t = w.topic_order[0]
    a = {"x": {t: frozenset({0, 1, 2})}, "y": {t: frozenset({3})}}
    b = {"y": {t: frozenset({3})}, "x": {t: frozenset({2, 1, 0})}, "z": {}}
    assert assignment_digest(a) == assignment_digest(b)
    assert assignment_digest(a) != assignment_digest({"x": {t: frozenset({0, 1, 3})}})
    assert moved_partitions(w.group, a) == 4  # nobody owned anything before


def test_water_fill_raises_the_lowest_bins_first() -> None:
    assert _water_fill([0, 0, 3], 4) == [(0, 2), (1, 2)]
    assert _water_fill([0, 0, 3], 7) == [(0, 4), (1, 3)]  # 4, 3, 3
    assert _water_fill([1, 1, 1], 1) == [(0, 1)]
    assert _water_fill([0, 2, 2, 5], 3) == [(0, 3)]  # 3, 2, 2, 5
    assert _water_fill([], 3) == []
