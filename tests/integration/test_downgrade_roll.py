"""The downgrade journey in the pod test bed, after the upgrade journey of
``test_migration_roll.py``: the same six members (librdkafka classic consumers and the Java
client's consumer, three pods, continuous production) go (a) behind their sidecars and to the
engine, (b) to the consumer protocol pod by pod, then (c) back to classic pod by pod and (d)
out of the sidecars pod by pod (``--run-slow``; the roll itself is ``pod_roll.py``, which
``dev/bench migration`` measures).

After each step the roll waits for the group's state it leads to (the broker's group or the
engine's, as ``pod_roll.groupgate_roll`` says), and this test asserts who was called back:

* (c) back to classic, (d) sidecars off: members not restarted never lose partitions
  (``lost``), cooperative members only give up what moves ((a) and (b), the upgrade
  journey's steps that ``test_migration_roll.py`` asserts, are printed here: a pod's two
  members are restarted at once);
* the conversion: nobody is called back;
* the hand-back, when the last KIP-848 member leaves in (c) (``migration-policy
  bidirectional``, Kafka's rule): every member is called back (each gives up its partitions
  before the lock leaves, decision record 0018's hand-back as built), and the sidecars that
  relayed for the group were told (``GroupReleasing`` / ``GroupReleased``): none takes the
  group over, the group is the broker's classic group with all six members behind sidecars;
* (d) pod by pod the members go straight to the broker: no client is ever refused
  (INCONSISTENT_GROUP_PROTOCOL), the group stays the broker's.

Throughout: no partition owned twice, every acknowledged record consumed, the committed
offsets (read at the broker) never moving back. Nothing asserts a duration; the per-step
figures are printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.pod_roll import PodRoll, groupgate_roll
from tests.integration.test_migration_roll import POD_NAMES
from tests.testbed import pods
from tests.testbed.broker import KafkaBroker

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_a_group_goes_back_to_classic_and_out_of_its_sidecars_pod_by_pod(
        tmp_path: Path) -> None:
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)
    assignor = "cooperative-sticky"
    with pods.PodNetwork() as network:
        pod_list = [network.pod(name) for name in POD_NAMES]
        with KafkaBroker.start("3.9", tmp_path / "kafka", host=network.host_ip) as broker:
            roll = PodRoll(tmp_path, broker, pod_list, assignor)
            try:
                groupgate_roll(roll)
                logs = "\n".join(roll.logs())
                roll.finish()
            finally:
                roll.close()
    for step in roll.steps:
        print(step.as_json())
    by_name = {s.name: s for s in roll.steps}
    conversion = by_name["a: the conversion to the engine"]
    assert conversion.called_back == {}, conversion
    handed_back = next(s for s in roll.steps if "handed back" in s.name)
    for step in roll.steps:
        # (a) and (b) are the upgrade journey's steps (``test_migration_roll.py``): their
        # losses are printed, not asserted here
        if step is not handed_back and step.name[:2] in ("c:", "d:"):
            assert step.lost == {}, step
    stayed = {m.name for m in roll.everyone
              if m.name not in handed_back.restarted and m.started < handed_back.begin
              and not any(e["name"] == "closed" and e["t"] < handed_back.end
                          for e in m.snapshot())}
    # every member that stayed gave its partitions up for the hand-back itself
    assert stayed and set(handed_back.called_back) == stayed, (stayed, handed_back)
    # the holder told the sidecars that relayed for the group; none took it over
    assert "were told of the hand-back" in logs
    assert logs.count("hands it back to the broker's classic coordinator") >= 1
    for m in roll.everyone:
        refused = [e for e in m.errors if "INCONSISTENT_GROUP_PROTOCOL" in str(e)]
        assert refused == [] and not any(e.get("fatal") for e in m.errors), (m.name, m.errors)
    safety = roll.safety()
    assert safety["owned_twice"] == [] and safety["missing"] == 0, safety
    assert safety["produce_failed"] == 0 and safety["acknowledged"] > 0, safety
    assert safety["offset_reads"] > 0 and safety["offsets_back"] == [], safety
