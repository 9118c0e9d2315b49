"""The upgrade journey in the pod test bed: a live classic group gains sidecars pod by pod, then
its clients switch to the consumer protocol pod by pod (``--run-slow``; the default run has the
two-sidecar case of ``test_online_upgrade.py``).

Three pods (network namespaces), each with groupgate on its loopback with the fleet's default
settings (the fleet listener on the pod's address), and six members of one group, two per pod,
consuming a 12-partition topic of a Kafka 3.9 broker on the host while a producer writes to it
without pause: librdkafka classic consumers (confluent-kafka) with the group's assignor, and in
the third pod the Java client's consumer (Kafka 4.4's ``KafkaConsumer``, ``commitSync`` after
every poll) in place of one of them.

0. Every member straight at the broker: the broker's classic group.
a. Pod by pod, the pod's members are restarted behind its sidecar. After the first two pods the
   broker still coordinates the group, the moved members marked (``gg3|...`` client ids); after
   the third no member is direct, and the group moves to the engine: the sidecar forwarding the
   leader announces the conversion to the other two, which hold their members' requests and
   relay them to it afterwards. Nobody is called back by the conversion. In the broker
   phase before it, the members not restarted only revoke (the broker's rebalances), never
   lose, partitions.
b. Pod by pod, the pod's members are restarted with ``group.protocol=consumer``, one at a
   time (each restart a step): ConsumerGroupDescribe (asked through a sidecar, inside its pod)
   shows one more consumer-protocol member after each; the members not restarted lose nothing
   involuntarily, and an eager member (classic, ``range``) goes round at most once per step:
   the engine holds the target back after the departure until the replacement arrives
   (``classic-departure-wait-ms``, decision record 0021), so the departure and the arrival are
   one target change. Other members revoke at most twice per step (with no eager member
   left, or only cooperative ones, nothing is held: a departure and an arrival are two changes
   unless they fall within the engine's 1 s assignment interval).

Throughout: no partition owned by two members at once (callbacks stamped on one machine's clock),
every acknowledged record consumed, the committed offsets (read at the broker) never moving back.
The longest time any partition went unconsumed, the revocations of the members not
restarted, and the sidecars' departure waits are printed per step (before the rounds are
asserted, so a run with ``GROUPGATE_CLASSIC_DEPARTURE_WAIT_MS=0`` prints what the wait
spares). Waits are bounded only to stop a hang; nothing asserts a duration.
"""

from __future__ import annotations

import json
import re
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from proxy.process import ProxyProcess
from tests.integration.members import (
    HEARTBEAT_MS,
    SESSION_MS,
    ConfluentMember,
    Member,
    Production,
    consumed,
    owned_exactly_once,
    ownership_overlaps,
    wait_until,
)
from tests.integration.test_classic_translation import CLASSIC, CONSUMER, FLAGS
from tests.integration.test_online_upgrade import (
    FLEET_SESSION,
    PARTITIONS,
    RATE,
    WAIT,
    Commits,
    broker_members,
    longest_unconsumed,
)
from tests.testbed import pods
from tests.testbed.broker import KafkaBroker
from tests.testbed.tools import CommitConsumer

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SIDECAR = "127.0.0.1:9092"
"""Where a pod's sidecar listens, on the pod's own loopback."""
POD_NAMES = ("a", "b", "c")
JAVA_ASSIGNORS = {
    "range": "org.apache.kafka.clients.consumer.RangeAssignor",
    "cooperative-sticky": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"}
ENGINE_TYPES = """
import json, sys
from tests.integration.test_online_upgrade import engine_members
print(json.dumps(engine_members(sys.argv[1], sys.argv[2])))
"""


def librdkafka(name: str, pod: pods.Pod, bootstrap: str, topic: str, group: str,
               protocol: str, assignor: str) -> ConfluentMember:
    """A confluent-kafka consumer in a pod (either group protocol), like the online upgrade's
    members: its client id ``name``, a 0.1 s poll, failed commits reported."""
    extra: dict[str, Any] = {"client.id": name}
    if protocol == "classic":
        extra["partition.assignment.strategy"] = assignor
    return ConfluentMember(bootstrap, [topic], group, protocol=protocol, name=name, poll=0.1,
                           tolerate_commit_failures=True, extra=extra, wrapper=pod.command([]))


class Java(Member):
    """The Java client's consumer in a pod, its events turned into the member scripts' (wall
    clock: the Java events carry the monotonic clock)."""

    def __init__(self, name: str, pod: pods.Pod, bootstrap: str, topic: str, group: str,
                 protocol: str, assignor: str, workdir: Path) -> None:
        super().__init__(name)
        self.topic = topic
        self._offset = time.time() - time.monotonic()
        config = {"client.id": name, "enable.auto.commit": "false"}
        if protocol == "classic":
            config.update({"partition.assignment.strategy": JAVA_ASSIGNORS[assignor],
                           "session.timeout.ms": str(SESSION_MS),
                           "heartbeat.interval.ms": str(HEARTBEAT_MS)})
        self.java = CommitConsumer(bootstrap, topic, group, mode="sync", group_protocol=protocol,
                                   config=config, workdir=workdir, name=name,
                                   on_event=self._java_event, wrapper=pod.command([]))
        self.java.start()

    def _java_event(self, event: dict[str, Any]) -> None:
        t = float(event["t"]) + self._offset
        kind = event.get("e")
        if kind in ("assign", "revoke", "lost"):
            name = {"assign": "partitions_assigned", "revoke": "partitions_revoked",
                    "lost": "partitions_lost"}[kind]
            self.on_event({"name": name, "t": t,
                           "partitions": [[self.topic, int(p)] for p in event["p"]]})
        elif kind == "c":
            for partition, first, last in event["r"]:
                for offset in range(int(first), int(last) + 1):
                    self.on_event({"name": "record", "topic": self.topic,
                                   "partition": int(partition), "offset": offset, "t": t})
        elif kind == "closed":
            self.on_event({"name": "closed", "t": t})

    def stop(self) -> None:
        self.java.stop()


def engine_types(pod: pods.Pod, group: str) -> list[int] | None:
    """The engine's members by type, asked through the pod's sidecar (reachable only there)."""
    done = pod.run([sys.executable, "-c", ENGINE_TYPES, SIDECAR, group], cwd=ROOT,
                   capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return None
    answer: list[int] | None = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_a_live_group_gains_sidecars_then_the_consumer_protocol_pod_by_pod(
        tmp_path: Path, assignor: str) -> None:
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)
    with pods.PodNetwork() as network:
        pod_list = [network.pod(name) for name in POD_NAMES]
        with KafkaBroker.start("3.9", tmp_path / "kafka", host=network.host_ip) as broker:
            roll(tmp_path, broker, pod_list, assignor)


def roll(tmp_path: Path, broker: KafkaBroker, pod_list: list[pods.Pod], assignor: str) -> None:
    topic = f"roll-{uuid.uuid4().hex[:6]}"
    group = f"{topic}-{assignor}"
    broker.create_topic(topic, PARTITIONS)
    sidecars = [ProxyProcess.start(broker.bootstrap, tmp_path / f"groupgate-{pod.name}.log",
                                   listen=SIDECAR, wrapper=pod.command([]),
                                   args=(*FLAGS, *FLEET_SESSION))
                for pod in pod_list]
    everything = {(topic, p) for p in range(PARTITIONS)}
    everyone: list[Member] = []
    slots: dict[tuple[int, int], Member] = {}

    def start(i: int, k: int, bootstrap: str, protocol: str) -> None:
        pod = pod_list[i]
        name = f"{pod.name}{k}-{protocol}-{'direct' if bootstrap != SIDECAR else 'sidecar'}"
        member: Member
        if i == len(pod_list) - 1 and k == 1:
            member = Java(name, pod, bootstrap, topic, group, protocol, assignor, tmp_path)
        else:
            member = librdkafka(name, pod, bootstrap, topic, group, protocol, assignor)
        slots[(i, k)] = member
        everyone.append(member)

    def live() -> list[Member]:
        return list(slots.values())

    def restart_pod(i: int, bootstrap: str, protocol: str) -> list[Member]:
        """The pod's members stopped and started again; the others (not restarted)."""
        for k in (0, 1):
            slots[(i, k)].stop()
            start(i, k, bootstrap, protocol)
        wait_until(lambda: owned_exactly_once(live(), everything), f"the group to settle after pod "
                   f"{pod_list[i].name}'s members moved ({protocol})", WAIT)
        return [m for (j, _k), m in slots.items() if j != i]

    producer = Production(broker.bootstrap, topic, PARTITIONS, RATE)
    commits = Commits(broker.bootstrap, group, topic)
    steps: list[tuple[str, float, float]] = []
    rounds: list[int] = []
    """Revocations each member not restarted saw, per member switched to the consumer
    protocol."""
    called_back: dict[str, dict[str, int]] = defaultdict(dict)
    """Per step: the revocations each member not restarted in it saw."""
    eager_rounds: dict[str, dict[str, int]] = defaultdict(dict)
    """Per step of (b): the revocations each eager member not restarted in it saw."""
    eager = assignor != "cooperative-sticky"

    def is_eager(member: Member) -> bool:
        return eager and "-classic-" in member.name
    try:
        try:
            for i in range(len(pod_list)):  # 0: everyone straight at the broker
                for k in (0, 1):
                    start(i, k, broker.bootstrap, "classic")
            wait_until(lambda: owned_exactly_once(live(), everything),
                       "six direct members owning all", WAIT)
            protocol, clients = broker_members(broker.bootstrap, group)
            assert protocol == assignor and not any(c.startswith("gg3|") for c in clients)

            for i in range(len(pod_list)):  # a: the sidecars' rolling deployment
                begin = time.time()
                others = restart_pod(i, SIDECAR, "classic")
                steps.append((f"pod {pod_list[i].name} behind its sidecar", begin, time.time()))
                for m in others:  # the broker's rebalances: revocations, never a loss
                    called = [e["name"] for e in m.callbacks_after(begin)
                              if e["name"] in ("partitions_revoked", "partitions_lost")]
                    assert "partitions_lost" not in called, (m.name, called)
                    called_back[f"pod {pod_list[i].name} behind its sidecar"][m.name] = \
                        len(called)
                if i < len(pod_list) - 1:  # direct members remain: the broker's group
                    protocol, clients = broker_members(broker.bootstrap, group)
                    assert protocol == assignor, protocol
                    assert sum(c.startswith("gg3|") for c in clients) == 2 * (i + 1), clients
            settled = time.time()
            wait_until(lambda: broker_members(broker.bootstrap, group)[0]
                       == "groupgate-coordinated", "the group to move to the engine", WAIT)
            wait_until(lambda: engine_types(pod_list[0], group) == [CLASSIC] * 6,
                       "the engine to serve all six classic members", WAIT)
            counts = {m.name: len(m.records) for m in live()}
            wait_until(lambda: all(len(m.records) > counts[m.name] + 5
                                   for m in live()),
                       "every member to consume after the conversion", WAIT)
            steps.append(("conversion", settled, time.time()))
            for m in live():
                assert m.callbacks_after(settled) == [], (m.name, m.callbacks_after(settled))
            logs = [s.log() for s in sidecars]
            holders = [n for n, log in zip(POD_NAMES, logs, strict=True)
                       if "moved from the broker's classic coordinator to the engine" in log]
            assert len(holders) == 1, holders
            told = [n for n, log in zip(POD_NAMES, logs, strict=True)
                    if "says it converted the group" in log]
            assert sorted(holders + told) == list(POD_NAMES), (holders, told)

            moved = 0
            for i in range(len(pod_list)):  # b: clients switched to the consumer protocol
                for k in (0, 1):  # one member at a time: each restart is a leave and a join
                    restarted = time.time()
                    step = f"{pod_list[i].name}{k} on the consumer protocol"
                    slots[(i, k)].stop()
                    start(i, k, SIDECAR, "consumer")
                    moved += 1
                    wait_until(lambda: owned_exactly_once(live(), everything),
                               f"the group to settle after {pod_list[i].name}{k} moved to the "
                               "consumer protocol", WAIT)
                    wait_until(lambda moved=moved: engine_types(  # type: ignore[misc]
                        pod_list[0], group) == sorted([CLASSIC] * (6 - moved)
                                                      + [CONSUMER] * moved),
                        f"{moved} consumer-protocol members", WAIT)
                    for (j, kk), m in slots.items():
                        if (j, kk) == (i, k):
                            continue
                        called = [e for e in m.callbacks_after(restarted)
                                  if e["name"] in ("partitions_revoked", "partitions_lost")]
                        assert not any(e["name"] == "partitions_lost" for e in called), (
                            m.name, called)
                        rounds.append(len(called))
                        called_back[step][m.name] = len(called)
                        if is_eager(m):
                            eager_rounds[step][m.name] = len(called)
                    steps.append((step, restarted, time.time()))
            assert broker_members(broker.bootstrap, group)[0] == "groupgate-coordinated"
        finally:
            producer.stop()
        wait_until(lambda: producer.acked <= consumed(everyone),
                   "every acknowledged record to be consumed", WAIT)
    finally:
        commits.stop()
        for m in live():
            m.stop()
        for sidecar in sidecars:
            sidecar.stop()
        logs_after = [s.log() for s in sidecars]
    assert producer.acked and producer.failed == 0
    assert ownership_overlaps(everyone) == []
    assert commits.reads > 0 and commits.backwards == [], commits.backwards
    for what, begin, end in steps:
        print(f"{assignor}: {what}: longest unconsumed "
              f"{longest_unconsumed(everyone, begin, end):.2f} s")
    print(f"{assignor}: revocations of a member not restarted, per member switched: "
          f"{sorted(rounds)}")
    for what, counts in called_back.items():
        print(f"{assignor}: {what}: revocations of the members not restarted: "
              f"{dict(sorted(counts.items()))}")
    waits = [float(w) for log in logs_after for w in re.findall(
        r"assigning after a departure wait of ([0-9.]+) s", log)]
    print(f"{assignor}: departure waits (s): {waits}")
    # (b): an eager member goes round at most once per step; any other member at most twice
    assert all(n <= 1 for counts in eager_rounds.values() for n in counts.values()), eager_rounds
    assert all(n <= 2 for what, counts in called_back.items() if "consumer protocol" in what
               for n in counts.values()), called_back
    if eager:
        assert waits, "the departures were not held for their replacements"
