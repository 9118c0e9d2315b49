"""Hand-back: a group the engine coordinates goes back to the broker's classic coordinator.

Two librdkafka classic consumers (``group.protocol=classic``; cooperative-sticky, and range
for the eager case) and two
KIP-848 consumers (``group.protocol=consumer``) consume a 12-partition topic through one
groupgate in front of Kafka 3.9 while a producer writes to it continuously; the engine
coordinates the group. Then ``groupgate release --group G`` (decision record 0018, the
hand-back; ``proxy/coordination/release.py``):

* the group is the broker's classic group again: DescribeGroups straight at the broker shows
  protocol type ``consumer``, the group's protocol, and the four members, each marked as a
  member behind the sidecar (``gg3|...``: the classic ones forwarded, the KIP-848 ones
  bridged); the engine no longer has it (ConsumerGroupDescribe through the proxy);
* every member was called back exactly once by the hand-back itself: its first callback after
  the command gives up everything it owned (revoked or lost), and then it gets partitions
  again and consumes;
* then the sidecar is removed pod by pod (a classic application, then a KIP-848 one, each
  restarted straight at the broker as a classic consumer): no client is refused
  (INCONSISTENT_GROUP_PROTOCOL) at any step, the broker's group settles with the direct
  members next to the marked ones;
* throughout: no partition owned by two members at once (each member's callbacks,
  wall-clock stamped on one machine), every record the producer saw acknowledged consumed,
  the group's committed offsets (read at the broker) never moving back.

Each member's callbacks after the command and the longest time any partition went unconsumed
are printed. Waits are bounded only to stop a hang; nothing asserts a duration.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy
from tests.integration.members import (
    HEARTBEAT_MS,
    ConfluentMember,
    Member,
    Production,
    owned_exactly_once,
    wait_until,
)
from tests.integration.test_classic_translation import CLASSIC, CONSUMER, FLAGS
from tests.integration.test_new_protocol import coordinator_of
from tests.integration.test_online_upgrade import (
    PARTITIONS,
    RATE,
    Commits,
    all_consumed_nothing_twice_nothing_back,
    classic,
    engine_members,
    longest_unconsumed,
)
from tests.testbed.broker import KafkaBroker

WAIT = 60.0
"""Bound for one step to settle (a hang fails; nothing is timed)."""
RELEASE_FLAGS = ("--migration-policy", "downgrade")


def kip848(name: str, bootstrap: str, topic: str, group: str) -> ConfluentMember:
    """One librdkafka consumer with ``group.protocol=consumer``, its client id ``name``."""
    return ConfluentMember(bootstrap, [topic], group, name=name, poll=0.1,
                           tolerate_commit_failures=True, extra={"client.id": name})


def described_at_broker(bootstrap: str, group: str) -> dict[str, Any]:
    """The broker's own DescribeGroups entry for ``group``."""
    conn = coordinator_of(bootstrap, group)
    try:
        answer = conn.request(15, 5, {"groups": [group], "include_authorized_operations": False})
    finally:
        conn.close()
    entry: dict[str, Any] = answer["groups"][0]
    return entry


def given_up_first(member: Member, since: float, owned_before: set[int]) -> bool:
    """Whether the member's first callback after ``since`` gave up everything it owned."""
    callbacks = member.callbacks_after(since)
    if not callbacks:
        return False
    first = callbacks[0]
    return (first["name"] in ("partitions_revoked", "partitions_lost")
            and {p for _, p in first["partitions"]} == owned_before)


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_released_the_group_is_the_brokers_classic_group_with_every_member(
        kafka39: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        members: list[Member], assignor: str) -> None:
    running = members  # every member started (the fixture stops them)
    proxy: ProxyProcess = start_proxy(kafka39, *FLAGS, *RELEASE_FLAGS)
    name = topic(kafka39, partitions=PARTITIONS)
    everything = {(name, p) for p in range(PARTITIONS)}
    group = f"release-{assignor}-{uuid.uuid4().hex[:8]}"
    producer = Production(kafka39.bootstrap, name, PARTITIONS, RATE)
    commits = Commits(kafka39.bootstrap, group, name)
    # the KIP-848 members first: under the downgrade policy a group of classic members only
    # refuses a KIP-848 member, as Kafka's policy does (a consumer group takes classic ones)
    live: list[Member] = [kip848("kip848-0", proxy.bootstrap, name, group),
                          kip848("kip848-1", proxy.bootstrap, name, group)]
    running.extend(live)
    try:
        wait_until(lambda: owned_exactly_once(live, everything), "the KIP-848 members owning all",
                   WAIT)
        live[:0] = [classic("classic-0", proxy.bootstrap, name, group, assignor),
                    classic("classic-1", proxy.bootstrap, name, group, assignor)]
        running.extend(live[:2])
        wait_until(lambda: owned_exactly_once(live, everything), "4 members owning all", WAIT)
        wait_until(lambda: engine_members(proxy.bootstrap, group) == sorted(
            [CLASSIC, CLASSIC, CONSUMER, CONSUMER]), "the engine to coordinate the group",
            WAIT)
        entry = described_at_broker(kafka39.bootstrap, group)
        assert entry["protocol_data"] == "groupgate-coordinated", entry  # the lock
        marks = {m.name: len(m.records) for m in live}
        wait_until(lambda: all(len(m.records) > marks[m.name] for m in live),
                   "every member to consume through the engine", WAIT)
        owned_before = {m.name: {p for _, p in m.owned()} for m in live}

        released_at = time.time()
        command = subprocess.run(
            [sys.executable, "-m", "proxy.cli", "release", "--group", group,
             "--bootstrap", proxy.bootstrap, "--wait", "--timeout", str(WAIT)],
            capture_output=True, text=True, timeout=WAIT + 30)
        print(command.stdout, command.stderr)
        assert command.returncode == 0, (command.stdout, command.stderr)

        def at_broker() -> bool:
            entry = described_at_broker(kafka39.bootstrap, group)
            return (entry["group_state"] == "Stable" and entry["protocol_type"] == "consumer"
                    and entry["protocol_data"] == assignor and len(entry["members"]) == 4)

        wait_until(at_broker, "the broker's classic group with the four members", WAIT)
        wait_until(lambda: owned_exactly_once(live, everything), "the 4 members to own all again",
                   WAIT)
        marks = {m.name: len(m.records) for m in live}
        wait_until(lambda: all(len(m.records) > marks[m.name] for m in live),
                   "every member to consume after the hand-back", WAIT)
        settled = time.time()

        entry = described_at_broker(kafka39.bootstrap, group)
        clients = sorted(m["client_id"] for m in entry["members"])
        assert all(c.startswith("gg3|") for c in clients), clients
        bridged = [c for c in clients if c.split("|")[2] != "-"]
        assert len(bridged) == 2, clients  # the KIP-848 members, carried over
        assert sorted(c.rsplit("|", 1)[1] for c in clients) == sorted(
            m.name for m in live), clients
        assert engine_members(proxy.bootstrap, group) is None  # the engine let it go

        for m in live:
            print(f"{m.name}: callbacks after the command: "
                  f"{[(e['name'], e['partitions']) for e in m.callbacks_after(released_at)]}")
            assert given_up_first(m, released_at, owned_before[m.name]), (
                m.name, owned_before[m.name], m.callbacks_after(released_at))
            assert not m.errors or all(not e.get("fatal") for e in m.errors), (m.name, m.errors)

        # the sidecar removed pod by pod: each application restarted straight at the broker
        # (a KIP-848 one as a classic consumer: Kafka 3.9 has no KIP-848 coordinator)
        for step, slot in enumerate((0, 2), start=1):
            start = time.time()
            live[slot].stop()
            live[slot] = classic(f"{live[slot].name}-direct", kafka39.bootstrap, name,
                                 group, assignor)
            running.append(live[slot])
            wait_until(lambda: owned_exactly_once(live, everything),
                       f"the group to settle after pod {slot} left its sidecar", WAIT)
            entry = described_at_broker(kafka39.bootstrap, group)
            clients = [m["client_id"] for m in entry["members"]]
            assert len(clients) == 4 and sum(not c.startswith("gg3|") for c in clients) == step, \
                clients
            print(f"pod {slot} straight at the broker: longest unconsumed "
                  f"{longest_unconsumed(running, start, time.time()):.2f} s; callbacks "
                  f"{[(m.name, len(m.callbacks_after(start))) for m in live]}")
        for m in running:
            refused = [e for e in m.errors if "INCONSISTENT_GROUP_PROTOCOL" in str(e)]
            assert refused == [] and not any(e.get("fatal") for e in m.errors), (m.name,
                                                                               m.errors)
    finally:
        producer.stop()
    all_consumed_nothing_twice_nothing_back(producer, commits, running)
    longest = longest_unconsumed(running, released_at, settled)
    print(f"{assignor}: hand-back: longest unconsumed {longest:.2f} s; heartbeat interval of "
          f"the classic members {HEARTBEAT_MS} ms")
