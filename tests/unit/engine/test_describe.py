"""ConsumerGroupDescribe and ListGroups views, and the group states they report."""

from __future__ import annotations

from .helpers import FOO, ScriptedAssignor, hb, image, join, make_engine, target

G = "g"


def test_describe_and_list() -> None:
    a = ScriptedAssignor()
    engine = make_engine(image(foo=(FOO, 3)), a)
    a.next = target(m1={FOO: [0, 1, 2]})
    engine.heartbeat(join(G, "m1"), 0)
    a.next = target(m1={FOO: [0, 1]}, m2={FOO: [2]})
    engine.heartbeat(join(G, "m2", instance_id="i2"), 1)

    (group,) = engine.describe([G])
    assert (group.error_code, group.group_state, group.group_epoch, group.assignment_epoch) == (
        0,
        "Reconciling",
        2,
        2,
    )
    assert group.assignor_name == "scripted"
    members = {m.member_id: m for m in group.members}
    m1, m2 = members["m1"], members["m2"]
    assert (m1.member_epoch, m1.member_type, m1.subscribed_topic_names) == (1, 1, ["foo"])
    assert [(p.topic_name, p.partitions) for p in m1.assignment] == [("foo", [0, 1, 2])]
    assert [(p.topic_name, p.partitions) for p in m1.target_assignment] == [("foo", [0, 1])]
    assert (m2.instance_id, m2.member_epoch, m2.assignment, m2.state) == (
        "i2",
        2,
        [],
        "UNRELEASED_PARTITIONS",
    )

    assert [(g.group_id, g.group_state, g.group_type) for g in engine.list_groups()] == [
        (G, "Reconciling", "consumer")
    ]
    assert engine.list_groups(["Stable"]) == []

    engine.heartbeat(hb(G, "m1", 1, {FOO: [0, 1]}), 2)
    engine.heartbeat(hb(G, "m2", 2), 3)
    assert engine.describe([G])[0].group_state == "Stable"
    assert [g.group_id for g in engine.list_groups(["stable"])] == [G]

    (missing,) = engine.describe(["nope"])
    assert (missing.error_code, missing.group_state) == (69, "Dead")
