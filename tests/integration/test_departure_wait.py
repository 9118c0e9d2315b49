"""The departure wait on real clients (``classic-departure-wait-ms``, decision record 0021;
``--run-slow``: the pod test bed's roll, ``test_migration_roll.py``, shows it in the upgrade).

Four librdkafka classic consumers with the eager ``range`` assignor, all behind one groupgate
(the engine serves the group from its first join), consume a 12-partition topic of Kafka 3.9
while a producer writes to it:

1. *A restart*: one member is stopped (LeaveGroup) and started again on the consumer
   protocol. Its departure holds the group's next assignment until its replacement arrives:
   one target change, and the eager members that stayed go round at most once (the
   replacement takes the departed member's partitions, so they are not called back at all).
2. *A scale-in*: one member is stopped for good. Its partitions wait the whole departure wait
   (the cost of the wait), then go to the others in one target change.

Run with the default wait and with none (Kafka's behaviour); the rounds of the members that
stayed, the longest time any partition went unconsumed in each step and the sidecar's wait lines
are printed, so the runs compare the two. Only the rounds are asserted; nothing asserts a
duration.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable

import pytest

from tests.integration.conftest import StartProxy
from tests.integration.members import (
    ConfluentMember,
    Member,
    Production,
    consumed,
    owned_exactly_once,
    ownership_overlaps,
    wait_until,
)
from tests.integration.test_classic_translation import FLAGS
from tests.integration.test_online_upgrade import PARTITIONS, RATE, WAIT, longest_unconsumed
from tests.testbed.broker import KafkaBroker

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DEFAULT_WAIT_S = 10.0


def eager(name: str, bootstrap: str, topic: str, group: str) -> ConfluentMember:
    return ConfluentMember(bootstrap, [topic], group, protocol="classic", name=name, poll=0.1,
                           tolerate_commit_failures=True,
                           extra={"client.id": name, "partition.assignment.strategy": "range"})


def rounds_after(members: list[Member], t: float) -> dict[str, int]:
    """Revocations each member saw after ``t`` (an eager member revokes all at each round)."""
    return {m.name: sum(e["name"] == "partitions_revoked" for e in m.callbacks_after(t))
            for m in members}


@pytest.mark.parametrize("wait_ms", [None, 0], ids=["default-wait", "no-wait"])
def test_a_restart_is_one_round_and_a_scale_in_waits(
        kafka39: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        members: list[Member], wait_ms: int | None) -> None:
    extra = () if wait_ms is None else ("--classic-departure-wait-ms", str(wait_ms))
    proxy = start_proxy(kafka39, *FLAGS, *extra)
    name = topic(kafka39, partitions=PARTITIONS)
    everything = {(name, p) for p in range(PARTITIONS)}
    group = f"departure-{uuid.uuid4().hex[:8]}"
    producer = Production(kafka39.bootstrap, name, PARTITIONS, RATE)
    live: list[Member] = []
    label = "default wait" if wait_ms is None else f"wait {wait_ms} ms"
    try:
        for i in range(4):
            live.append(eager(f"m{i}", proxy.bootstrap, name, group))
            members.append(live[-1])
        wait_until(lambda: owned_exactly_once(live, everything), "4 members owning all", WAIT)
        time.sleep(2)  # past the engine's assignment interval and the last callbacks

        # 1. a restart onto the consumer protocol
        begin = time.time()
        live[3].stop()
        live[3] = ConfluentMember(proxy.bootstrap, [name], group, protocol="consumer",
                                  name="m3-consumer", poll=0.1, tolerate_commit_failures=True,
                                  extra={"client.id": "m3-consumer"})
        members.append(live[3])
        wait_until(lambda: owned_exactly_once(live, everything), "the restart to settle", WAIT)
        time.sleep(2)
        restart = rounds_after(live[:3], begin)
        restart_gap = longest_unconsumed(members, begin, time.time())

        # 2. a scale-in: m2 goes for good
        begin = time.time()
        live[2].stop()
        live.pop(2)
        wait_until(lambda: owned_exactly_once(live, everything), "the scale-in to settle",
                   WAIT)
        time.sleep(2)
        scale_in = rounds_after(live[:2], begin)
        scale_in_gap = longest_unconsumed(members, begin, time.time())
    finally:
        producer.stop()
    wait_until(lambda: producer.acked <= consumed(members), "every acknowledged record to be "
               "consumed", WAIT)
    assert producer.acked and producer.failed == 0
    assert ownership_overlaps(members) == []
    waits = re.findall(r"assigning after a departure wait of ([0-9.]+) s: \d+ left \([^)]*\), "
                       r"(\d+) arrived", proxy.log())
    print(f"\n{label}: restart: revocations of the members that stayed {restart}, longest "
          f"unconsumed {restart_gap:.2f} s")
    print(f"{label}: scale-in: revocations of the members that stayed {scale_in}, longest "
          f"unconsumed {scale_in_gap:.2f} s")
    print(f"{label}: departure waits (s, arrivals): {waits}")
    if wait_ms == 0:
        assert waits == []
        return
    # the restart: one wait, ended by the arrival; nobody that stayed went round
    assert len(waits) == 2 and waits[0][1] == "1", waits
    assert all(n <= 1 for n in restart.values()), restart
    # the scale-in: the whole wait, then one target change
    assert waits[1][1] == "0" and float(waits[1][0]) >= DEFAULT_WAIT_S - 0.1, waits
    assert all(n <= 1 for n in scale_in.values()), scale_in
