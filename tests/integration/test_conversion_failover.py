"""A failover during the conversion loses nothing (``--run-slow``, the pod test bed).

Three pods (network namespaces), each with groupgate on its loopback with the fleet's default
settings, and two librdkafka classic consumers per pod behind it (19 s sessions, as a fleet's
failover needs them), in one group on a
12-partition topic of a Kafka 3.9 broker on the host, while a producer writes to it without
pause. A seventh member, straight at the broker, keeps the group in the broker phase; when it
stops, no member is direct and the sidecar forwarding the leader converts the group (decision
record 0018, section 1). That sidecar is SIGKILLed in one of three windows, found from the
sidecars' own log lines (the test asserts the window was hit):

* ``announced``: after the announcement and before the broker's group is emptied. One of the
  two other sidecars is SIGSTOPped while the converter waits for its acknowledgement
  (``upgrade.ANNOUNCE_SECONDS``); the converter is killed once the other one holds the group's
  requests, then the stopped one goes on.
* ``locked``: the lock holds the emptied group and the converted group is not in the state log
  yet (killed on "holding the broker's group as member", before "moved ... to the engine").
* ``written``: the converted group is in the state log (killed on "moved ... to the engine").

The killed sidecar is started again in its pod a few seconds later, as a pod's container is
restarted. Then the group must settle (every partition owned once) and end up coordinated by
the engine with all six members (``announced``: the broker's group was never emptied and stays
the broker's until its next rebalance, which a member restarted in another pod makes; the
candidate was the dead sidecar's); the members of the other pods lose nothing they own
(``announced``, ``written``; ``locked``: the state log holds nothing of the group, and the
next holder starts it anew, every member rejoining once); and, throughout: no partition owned
by two members at once, every acknowledged record consumed, the committed offsets (read at the
broker) never moving back.
The longest time any partition went unconsumed from the kill until the group settled, and the
members called back, are printed. Waits are bounded only to stop a hang; nothing asserts a
duration.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from proxy.process import ProxyProcess
from tests.integration.members import (
    ConfluentMember,
    Member,
    Production,
    owned_exactly_once,
    wait_until,
)
from tests.integration.test_classic_translation import CLASSIC, FLAGS
from tests.integration.test_migration_roll import SIDECAR, engine_types
from tests.integration.test_online_upgrade import (
    FLEET_SESSION,
    PARTITIONS,
    RATE,
    WAIT,
    Commits,
    all_consumed_nothing_twice_nothing_back,
    broker_members,
    classic,
    longest_unconsumed,
)
from tests.testbed import pods
from tests.testbed.broker import KafkaBroker

pytestmark = [pytest.mark.broker, pytest.mark.slow]

POD_NAMES = ("a", "b", "c")
ASSIGNOR = "cooperative-sticky"
CANDIDATE = "every member of the broker's group is behind a sidecar"
HOLDING = "converts it at generation"
ANNOUNCED = "other sidecar(s) hold the group's requests for its conversion"
LOCKED = "holding the broker's group as member"
MOVED = "moved from the broker's classic coordinator to the engine"
MEMBER_SESSION = {"session.timeout.ms": 19_000, "heartbeat.interval.ms": 1_000}
"""The members' own sessions, as a fleet's failover needs them (``docs/operations.md``: the
heartbeat interval + ``broker-session-timeout-ms`` + 11 s; librdkafka times its session
itself and gives its partitions up when it runs out)."""
RESTART_SECONDS = 3.0
"""How long the killed sidecar stays down before its pod starts it again."""


def wait_for_line(sidecars: list[ProxyProcess], text: str, timeout: float = WAIT
                  ) -> ProxyProcess:
    """The first sidecar whose log has ``text`` (read every 10 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for sidecar in sidecars:
            if text in sidecar.log():
                return sidecar
        time.sleep(0.01)
    raise AssertionError(f"no sidecar logged {text!r} within {timeout:.0f} s")


def kill(sidecar: ProxyProcess) -> None:
    assert sidecar.process is not None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sidecar.process.pid, signal.SIGKILL)
    sidecar.process.wait()


@pytest.mark.parametrize("window", ["announced", "locked", "written"])
def test_a_converter_killed_during_the_conversion_loses_nothing(tmp_path: Path,
                                                               window: str) -> None:
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)
    with pods.PodNetwork() as network:
        pod_list = [network.pod(name) for name in POD_NAMES]
        with KafkaBroker.start("3.9", tmp_path / "kafka", host=network.host_ip) as broker:
            failover(tmp_path, broker, pod_list, window)


def failover(tmp_path: Path, broker: KafkaBroker, pod_list: list[pods.Pod], window: str
             ) -> None:
    topic = f"failover-{uuid.uuid4().hex[:6]}"
    group = f"{topic}-{window}"
    broker.create_topic(topic, PARTITIONS)
    everything = {(topic, p) for p in range(PARTITIONS)}

    def sidecar(pod: pods.Pod, run: int) -> ProxyProcess:
        return ProxyProcess.start(broker.bootstrap, tmp_path / f"groupgate-{pod.name}-{run}.log",
                                  listen=SIDECAR, wrapper=pod.command([]),
                                  args=(*FLAGS, *FLEET_SESSION))

    sidecars = [sidecar(pod, 0) for pod in pod_list]
    everyone: list[Member] = []
    producer = Production(broker.bootstrap, topic, PARTITIONS, RATE)
    commits = Commits(broker.bootstrap, group, topic)
    stopped: ProxyProcess | None = None
    try:
        try:
            direct = classic("direct", broker.bootstrap, topic, group, ASSIGNOR)
            everyone.append(direct)
            wait_until(lambda: owned_exactly_once([direct], everything), "the direct member "
                       "to own everything", WAIT)
            def member(pod: pods.Pod, name: str) -> Member:
                return ConfluentMember(
                    SIDECAR, [topic], group, protocol="classic", name=name, poll=0.1,
                    tolerate_commit_failures=True, wrapper=pod.command([]), extra={
                        "client.id": name, "partition.assignment.strategy": ASSIGNOR,
                        **MEMBER_SESSION})

            live: list[Member] = [member(pod, f"{pod.name}{k}") for pod in pod_list
                                  for k in (0, 1)]
            everyone.extend(live)
            wait_until(lambda: owned_exactly_once([direct, *live], everything),
                       "seven members owning all", WAIT)
            assert broker_members(broker.bootstrap, group)[0] == ASSIGNOR
            direct.stop()  # no member is direct now: the leader's sidecar converts

            converter = wait_for_line(sidecars, CANDIDATE)
            others = [s for s in sidecars if s is not converter]
            if window == "announced":
                stopped = others[0]
                pods.pause(stopped)  # the converter waits for its acknowledgement
                wait_for_line([others[1]], HOLDING)
            else:
                wait_for_line([converter], LOCKED if window == "locked" else MOVED)
            killed = time.time()
            kill(converter)
            if stopped is not None:
                pods.resume(stopped)
                stopped = None
            log = converter.log()
            hit = {"announced": ANNOUNCED not in log and LOCKED not in log,
                   "locked": LOCKED in log and MOVED not in log,
                   "written": MOVED in log}[window]
            assert hit, f"the kill missed the {window} window:\n{log[-3000:]}"

            index = sidecars.index(converter)
            time.sleep(RESTART_SECONDS)
            sidecars[index] = sidecar(pod_list[index], 1)
            wait_until(lambda: owned_exactly_once(live, everything),
                       "the six members to own every partition once after the failover", WAIT)
            settled = time.time()
            if window == "announced":
                # the broker's group was never emptied: it is still the broker's, and the
                # conversion waits for its next rebalance (the candidate was the dead
                # sidecar's: only the leader's join answer makes one); a member restarted
                # (another pod's) makes it
                assert broker_members(broker.bootstrap, group)[0] == ASSIGNOR
                other = (index + 1) % len(pod_list)
                live[2 * other].stop()
                live[2 * other] = member(pod_list[other], f"{pod_list[other].name}0-again")
                everyone.append(live[2 * other])
            wait_until(lambda: any(engine_types(pod, group) == [CLASSIC] * 6
                                   for pod in pod_list),
                       "the engine to serve all six members", WAIT)
            counts = {m.name: len(m.records) for m in live}
            wait_until(lambda: all(len(m.records) > counts[m.name] + 5 for m in live),
                       "every member to consume after the failover", WAIT)
            recovered = time.time()
            assert broker_members(broker.bootstrap, group)[0] == "groupgate-coordinated"
            called = {m.name: [(e["name"], len(e["partitions"]))
                               for e in m.callbacks_after(killed)] for m in live}
            if window != "locked":  # the others keep what they own (not told by a state log
                # with nothing in it: the "locked" window's new holder starts the group anew)
                for m in live:
                    if m.name[0] != pod_list[index].name and "again" not in m.name:
                        assert not any(n == "partitions_lost" for n, _ in called[m.name]), (
                            m.name, called[m.name])
        finally:
            producer.stop()
        all_consumed_nothing_twice_nothing_back(producer, commits, everyone)
    finally:
        if stopped is not None:
            pods.resume(stopped)
        commits.stop()
        for m in everyone:
            m.stop()
        for s in sidecars:
            s.stop()
    # (every partition owned once can hold at once after the kill: the members keep what they
    # owned until they let go, so the gaps are measured until every member consumes again)
    unconsumed = longest_unconsumed(everyone, killed, recovered)
    print(f"\n{window}: every partition owned once {settled - killed:.1f} s after the kill, "
          f"every member consuming with the engine {recovered - killed:.1f} s after it; "
          f"longest unconsumed {unconsumed:.2f} s; callbacks after the kill: {called}")
