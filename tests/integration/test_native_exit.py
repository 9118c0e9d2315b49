"""The exit: a group groupgate's engine coordinates in front of Kafka 4.4 is handed to the
broker's own KIP-848 coordinator, and the clients then go straight to the broker
(``--run-slow``; decision record 0018, section 2, "The exit";
``proxy/coordination/native_exit.py``).

Two librdkafka classic consumers (cooperative-sticky, whose assignments carry the sticky
assignor's user data, which Kafka 4.4 refuses to upgrade from) and two KIP-848 librdkafka
consumers consume a 12-partition topic through one groupgate in front of Kafka 4.4 while a
producer writes to it continuously; the engine coordinates the group (the broker's group is the
lock).

1. *A direct consumer-protocol client arrives* while the engine coordinates: straight at the
   broker, with the same group id. It is refused (the lock's assignment user data makes Kafka
   refuse the upgrade) and never owns a partition; the members behind groupgate keep all of
   them and go on consuming.
2. *``groupgate release --group G --to native --wait``*: every member gives up its
   partitions once; then the broker's KIP-848 coordinator has the group
   (ConsumerGroupDescribe straight at the broker: Stable, the four members, the classic ones as
   classic-protocol members, marked ``gg3|...``, the KIP-848 ones with the broker's epochs);
   the engine has no group (ConsumerGroupDescribe through groupgate is the broker's answer);
   groupgate's anchor left once a consumer-protocol member was in.
3. *The clients go straight to the broker with ``group.protocol=consumer``*, pod by pod (one
   at a time, the group settling after each) or all at once: after each step the broker's
   group has one more direct member.

The same in the pod test bed (``test_in_the_pod_test_bed_the_group_exits_pod_by_pod``): the six
members of the online-upgrade tests, three pods with a sidecar each (the command against the
holder; the other two relay for the group and are told), the clients straight at the broker pod
by pod.

Throughout: no partition owned by two members at once, every acknowledged record consumed,
the committed offsets (read at the broker) never moving back. The callbacks of each step and
the longest time a partition went unconsumed are printed. Waits are bounded only to stop a
hang; nothing asserts a duration.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.process import ProxyProcess
from tests.conftest import BrokerPool, _pooled
from tests.integration.conftest import StartProxy
from tests.integration.members import (
    ConfluentMember,
    Member,
    Production,
    owned_exactly_once,
    wait_until,
)
from tests.integration.test_classic_translation import CLASSIC, CONSUMER, FLAGS
from tests.integration.test_new_protocol import ask_coordinator
from tests.integration.test_online_upgrade import (
    PARTITIONS,
    RATE,
    WAIT,
    Commits,
    all_consumed_nothing_twice_nothing_back,
    classic,
    engine_members,
    longest_unconsumed,
)
from tests.integration.test_release import given_up_first, kip848
from tests.testbed.broker import KafkaBroker

pytestmark = [pytest.mark.broker, pytest.mark.slow]

EXIT_KEY = "4.4-exit"
SESSION_MS = 6000
HEARTBEAT_MS = 500
EXIT_PROPERTIES = {
    "group.consumer.session.timeout.ms": str(SESSION_MS),
    "group.consumer.min.session.timeout.ms": str(SESSION_MS),
}
"""Kafka 4.4 with its defaults' policy (``bidirectional``), and the KIP-848 heartbeat and
session of the proxy's own members (500 ms, 6 s), so direct and proxied members pace alike."""


@pytest.fixture
def kafka44(broker_pool: BrokerPool) -> Iterator[KafkaBroker]:
    broker_pool.factories.setdefault(EXIT_KEY, lambda d: KafkaBroker.start(
        "4.4", d, consumer_heartbeat_ms=HEARTBEAT_MS, properties=EXIT_PROPERTIES))
    for cluster in _pooled(broker_pool, EXIT_KEY):
        assert isinstance(cluster, KafkaBroker)
        yield cluster


def native_group(bootstrap: str, group: str) -> dict[str, Any]:
    """ConsumerGroupDescribe v1 straight at the broker (the group's entry)."""
    answer = ask_coordinator(bootstrap, group, 69, 1, {"group_ids": [group],
                                                       "include_authorized_operations": False})
    entry: dict[str, Any] = answer["groups"][0]
    return entry


def native_members(bootstrap: str, group: str) -> list[tuple[int, str]] | None:
    """(member type, client id) of the broker's consumer group, sorted; None while the
    broker's KIP-848 coordinator does not have it (a classic group, or none)."""
    entry = native_group(bootstrap, group)
    if entry["error_code"] != 0:
        return None
    return sorted((m["member_type"], m["client_id"]) for m in entry["members"])


def direct(name: str, bootstrap: str, topic: str, group: str) -> ConfluentMember:
    """A librdkafka KIP-848 consumer straight at the broker."""
    return ConfluentMember(bootstrap, [topic], group, name=name, poll=0.1,
                           tolerate_commit_failures=True, extra={"client.id": name})


@pytest.mark.parametrize("switch", ["pod-by-pod", "all-at-once"])
def test_a_coordinated_group_exits_to_the_brokers_kip848_coordinator(
        kafka44: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        members: list[Member], switch: str) -> None:
    running = members
    proxy: ProxyProcess = start_proxy(kafka44, *FLAGS, "--migration-policy", "downgrade")
    name = topic(kafka44, partitions=PARTITIONS)
    everything = {(name, p) for p in range(PARTITIONS)}
    group = f"exit-{switch}-{uuid.uuid4().hex[:8]}"
    producer = Production(kafka44.bootstrap, name, PARTITIONS, RATE)
    commits = Commits(kafka44.bootstrap, group, name)
    # the KIP-848 members first: under the downgrade policy a group of classic members only
    # refuses a KIP-848 member, as Kafka's policy does (a consumer group takes classic ones)
    live: list[Member] = [kip848("kip848-0", proxy.bootstrap, name, group),
                          kip848("kip848-1", proxy.bootstrap, name, group)]
    running.extend(live)
    steps: list[tuple[str, float, float]] = []
    try:
        wait_until(lambda: owned_exactly_once(live, everything), "the KIP-848 members owning all",
                   WAIT)
        live[:0] = [classic("classic-0", proxy.bootstrap, name, group, "cooperative-sticky"),
                    classic("classic-1", proxy.bootstrap, name, group, "cooperative-sticky")]
        running.extend(live[:2])
        wait_until(lambda: owned_exactly_once(live, everything), "4 members owning all", WAIT)
        wait_until(lambda: engine_members(proxy.bootstrap, group) == sorted(
            [CLASSIC, CLASSIC, CONSUMER, CONSUMER]), "the engine to coordinate the group",
            WAIT)

        # 1. a direct consumer-protocol client while the engine coordinates
        begin = time.time()
        stranger = direct("stranger", kafka44.bootstrap, name, group)
        running.append(stranger)
        wait_until(lambda: bool(stranger.errors), "the direct KIP-848 client to be refused",
                   WAIT)
        marks = {m.name: len(m.records) for m in live}
        wait_until(lambda: all(len(m.records) > marks[m.name] for m in live),
                   "the members behind groupgate to go on consuming", WAIT)
        print(f"the direct client's errors: {stranger.errors}")
        stranger.stop()
        assert not stranger.records and not stranger.owned(), stranger.snapshot()
        assert owned_exactly_once(live, everything)
        assert all(m.callbacks_after(begin) == [] for m in live), [
            (m.name, m.callbacks_after(begin)) for m in live]
        assert native_members(kafka44.bootstrap, group) is None  # still the lock's group
        steps.append(("a direct KIP-848 client refused", begin, time.time()))

        # 2. the exit
        owned_before = {m.name: {p for _, p in m.owned()} for m in live}
        released_at = time.time()
        command = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "release", "--group", group, "--to", "native",
             "--bootstrap", proxy.bootstrap, "--wait", "--timeout", str(WAIT)],
            capture_output=True, text=True, timeout=WAIT + 30)
        print(command.stdout, command.stderr)
        assert command.returncode == 0, (command.stdout, command.stderr)
        wait_until(lambda: owned_exactly_once(live, everything),
                   "the 4 members to own all again", WAIT)

        def the_four() -> bool:
            now = native_members(kafka44.bootstrap, group) or []
            return (sorted(c.rsplit("|", 1)[-1] for t, c in now if t == CLASSIC)
                    == ["classic-0", "classic-1"]
                    and sorted(c for t, c in now if t == CONSUMER) == ["kip848-0", "kip848-1"])

        wait_until(the_four, "the broker's KIP-848 coordinator to have the four members (the "
                   "anchor gone)", WAIT)
        # the anchor's leave bumps the group epoch: the broker's group is Assigning until its
        # next target computation (Kafka's group.consumer.assignment.interval.ms, 1 s), then
        # Reconciling until the members have acknowledged it
        wait_until(lambda: the_four() and native_group(kafka44.bootstrap, group)[
            "group_state"] == "Stable", "the broker's group to be Stable with the four", WAIT)
        classic_clients = sorted(c for t, c in native_members(kafka44.bootstrap, group) or []
                                 if t == CLASSIC)
        assert [c.rsplit("|", 1)[1] for c in classic_clients] == ["classic-0", "classic-1"]
        assert all(c.startswith("gg3|") for c in classic_clients), classic_clients
        # the engine let it go: ConsumerGroupDescribe through the proxy is the broker's answer
        assert "handed to the broker's KIP-848 coordinator" in proxy.log()
        assert engine_members(proxy.bootstrap, group) == [CLASSIC, CLASSIC, CONSUMER, CONSUMER]
        marks = {m.name: len(m.records) for m in live}
        wait_until(lambda: all(len(m.records) > marks[m.name] for m in live),
                   "every member to consume after the exit", WAIT)
        for m in live:
            print(f"{m.name}: callbacks after the command: "
                  f"{[(e['name'], e['partitions']) for e in m.callbacks_after(released_at)]}")
            assert given_up_first(m, released_at, owned_before[m.name]), (
                m.name, owned_before[m.name], m.callbacks_after(released_at))
            assert not any(e.get("fatal") for e in m.errors), (m.name, m.errors)
        assert "anchor left" in proxy.log()
        steps.append(("the exit", released_at, time.time()))

        # 3. the clients straight at the broker, group.protocol=consumer
        order = [[0], [1], [2], [3]] if switch == "pod-by-pod" else [[0, 1, 2, 3]]
        moved = 0
        for batch in order:
            begin = time.time()
            for slot in batch:
                live[slot].stop()
            for slot in batch:
                live[slot] = direct(f"{live[slot].name}-direct", kafka44.bootstrap, name, group)
                running.append(live[slot])
            moved += len(batch)
            wait_until(lambda: owned_exactly_once(live, everything),
                       f"the group to settle with {moved} member(s) straight at the broker",
                       WAIT)
            wait_until(lambda moved=moved: sum(  # type: ignore[misc]
                c.endswith("-direct") for _t, c in native_members(kafka44.bootstrap, group)
                or []) == moved, f"{moved} direct member(s) in the broker's group", WAIT)
            steps.append((f"{moved} straight at the broker", begin, time.time()))
        members_now = native_members(kafka44.bootstrap, group) or []
        assert len(members_now) == 4 and all(t == CONSUMER for t, _ in members_now), members_now
    finally:
        producer.stop()
    all_consumed_nothing_twice_nothing_back(producer, commits, running)
    for m in running:
        assert not any(e.get("fatal") for e in m.errors if m.name != "stranger"), (m.name,
                                                                                   m.errors)
    for what, begin, end in steps:
        print(f"{switch}: {what}: longest unconsumed "
              f"{longest_unconsumed(running, begin, end):.2f} s; callbacks "
              f"{[(m.name, len(m.callbacks_after(begin))) for m in running if m.snapshot()]}")



def test_in_the_pod_test_bed_the_group_exits_pod_by_pod(tmp_path: Path) -> None:
    """The six members of the online-upgrade tests in three pods, a sidecar each, in front
    of Kafka 4.4 (``pod_roll.exit_roll``): behind their sidecars to the consumer protocol, a
    direct consumer-protocol client refused, the exit (the command against the holder: the
    followers that relay for the group are told), the clients straight at the broker pod by
    pod. After each step the group's state is waited for; nobody is called back by the
    refused client; throughout nothing owned twice, every record consumed, no offset back."""
    from tests.integration.pod_roll import (
        NATIVE_HEARTBEAT_MS,
        NATIVE_PROPERTIES,
        PodRoll,
        exit_roll,
    )
    from tests.integration.test_migration_roll import POD_NAMES
    from tests.testbed import pods

    ok, why = pods.available()
    if not ok:
        pytest.skip(why)
    with pods.PodNetwork() as network:
        pod_list = [network.pod(name) for name in POD_NAMES]
        with KafkaBroker.start("4.4", tmp_path / "kafka", host=network.host_ip,
                               consumer_heartbeat_ms=NATIVE_HEARTBEAT_MS,
                               properties=NATIVE_PROPERTIES) as broker:
            roll = PodRoll(tmp_path, broker, pod_list, "range")
            try:
                exit_roll(roll)
                logs = "\n".join(roll.logs())
                roll.finish()
            finally:
                roll.close()
    for step in roll.steps:
        print(step.as_json())
    refused = next(s for s in roll.steps if "refused" in s.name)
    assert refused.called_back == {}, refused
    exited = next(s for s in roll.steps if s.name.startswith("the exit"))
    assert exited.called_back, exited  # every member gave its partitions up once
    assert "anchor" in logs
    for m in roll.everyone:
        if m.name != "stranger":
            assert not any(e.get("fatal") for e in m.errors), (m.name, m.errors)
    safety = roll.safety()
    assert safety["owned_twice"] == [] and safety["missing"] == 0, safety
    assert safety["produce_failed"] == 0 and safety["acknowledged"] > 0, safety
    assert safety["offset_reads"] > 0 and safety["offsets_back"] == [], safety
