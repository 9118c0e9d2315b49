"""Version skew of the durable release: the record a released group leaves in the state log,
read by groupgate 0.2.0 (decision record 0018, section 5: state records stay at version 1).

This build's hand-back writes the group's tombstones and then one ``GROUP`` record, the
release marker (``translation.durable.release_marker``): its preferred assignor says where the
group went (``groupgate-released:classic``), ``empty_since_wall_ms`` when. 0.2.0 does not know
it. Here 0.2.0's own engine (its ``translation/``, exported from this repository's history,
``tests.testbed.releases``) loads exactly those records, as a 0.2.0 sidecar taking the group
over would, and then:

* a KIP-848 member joins the loaded group and gets every partition (the first join picks a
  real assignor: the marker's name is never used to assign);
* a classic member joins it too (the classic translation);
* a group loaded from the marker alone, that nobody joins, expires as any empty group does
  (its records become tombstones: the marker is gone).

No broker: the engines are driven in process (0.2.0's in a child process, from its tree).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from translation.durable import release_marker
from translation.records import RecordKey, RecordKind, StateRecord, encode_record

LOAD_AS_0_2_0 = r"""
import base64, json, sys, uuid
from translation.assignors import BUILTIN_ASSIGNORS
from translation.classic.coordinator import ClassicGroupCoordinator
from translation.classic.messages import (ClassicProtocol, ClassicSubscription,
                                          JoinGroupRequest)
from translation.config import GroupConfig
from translation.coordinator import GroupCoordinator
from translation.heartbeat import ConsumerGroupHeartbeatRequest
from translation.records import decode_record
from translation.topics import TopicMetadata, TopicsImage

given = json.load(sys.stdin)
records = [decode_record(base64.b64decode(k), base64.b64decode(v) if v is not None else None)
           for k, v in given["records"]]
TOPIC = uuid.UUID(given["topic_id"])


def engine():
    e = GroupCoordinator(GroupConfig(assignors=[c() for c in BUILTIN_ASSIGNORS],
                                     durable_state=True, empty_group_expiry_ms=60_000))
    e.update_topics(TopicsImage.of([TopicMetadata(TOPIC, "orders", 4)]), 0)
    return e


out = {}
e = engine()
e.load_group("g", records, 0, given["wall_ms"])
group = e.groups.get("g")
out["loaded"] = group is not None and not group.members
out["assignor_loaded"] = group.preferred_assignor if group is not None else None
join = ConsumerGroupHeartbeatRequest(group_id="g", member_id="m1", member_epoch=0,
                                     rebalance_timeout_ms=30_000,
                                     subscribed_topic_names=["orders"], topic_partitions=[])
answer, _ = e.heartbeat(join, 10)
out["join"] = answer.error_code
epoch, assigned = answer.member_epoch, answer.assignment
for now in (2_000, 4_000):
    if assigned:
        break
    answer, _ = e.heartbeat(ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="m1", member_epoch=epoch, topic_partitions=[]), now)
    out["heartbeat"] = answer.error_code
    epoch, assigned = answer.member_epoch, answer.assignment
out["assigned"] = sorted(p for t in assigned or () for p in t.partitions)
out["assignor_now"] = e.groups["g"].preferred_assignor
classic = ClassicGroupCoordinator(e)
joined, _ = classic.join_group(JoinGroupRequest(
    "g", "", "consumer", [ClassicProtocol("range", ClassicSubscription(1, ["orders"]))],
    45_000, rebalance_timeout_ms=30_000), 5_000)
out["classic_join"] = getattr(joined, "error_code", "held")

idle = engine()
idle.load_group("g", records, 0, given["wall_ms"])
idle.drain_records(0)
idle.tick(120_000)
out["expired"] = "g" not in idle.groups
out["expiry_records"] = [r.value is None for r in idle.drain_records(0)]
print(json.dumps(out))
"""
"""Run in 0.2.0's tree: load the records given as a 0.2.0 sidecar would, then join."""


def old_tree() -> Path:
    from tests.testbed.releases import ReleaseUnavailable, release_tree

    try:
        return release_tree("0.2.0")
    except ReleaseUnavailable as exc:
        pytest.skip(str(exc))


def test_groupgate_0_2_0_loads_a_released_groups_marker_safely() -> None:
    from tests.unit.coordination.helpers import TOPIC_ID

    tombstones = [StateRecord(RecordKey(RecordKind.ASSIGNMENT, "g", "c1"), None),
                  StateRecord(RecordKey(RecordKind.MEMBER, "g", "c1"), None),
                  StateRecord(RecordKey(RecordKind.GROUP, "g"), None)]
    marker = release_marker("g", "classic", 7, 1_000)
    encoded = [encode_record(r) for r in [*tombstones, marker]]
    given = {"records": [[base64.b64encode(k).decode(),
                          base64.b64encode(v).decode() if v is not None else None]
                         for k, v in encoded],
             "topic_id": str(TOPIC_ID), "wall_ms": 2_000}
    done = subprocess.run([sys.executable, "-c", LOAD_AS_0_2_0], input=json.dumps(given),
                          cwd=old_tree(), capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    print(seen)
    assert seen["loaded"] and seen["assignor_loaded"] == "groupgate-released:classic"
    assert seen["join"] == 0 and seen["assigned"] == [0, 1, 2, 3]
    assert seen["assignor_now"] == "uniform"  # a real assignor since the first join
    assert seen["classic_join"] in (0, 79, "held")  # the classic translation takes it
    assert seen["expired"] and seen["expiry_records"] and all(seen["expiry_records"])
