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

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy
from tests.integration.test_classic_translation import CLASSIC, CONSUMER, FLAGS
from tests.integration.test_new_protocol import Member, coordinator_of, wait_until
from tests.integration.test_online_upgrade import (
    HEARTBEAT_MS,
    MEMBER,
    PARTITIONS,
    Classic,
    Commits,
    Producer,
    consumed,
    engine_members,
    longest_unconsumed,
    owned_exactly_once,
    ownership_overlaps,
)
from tests.testbed.broker import KafkaBroker

WAIT = 60.0
"""Bound for one step to settle (a hang fails; nothing is timed)."""
RELEASE_FLAGS = ("--migration-policy", "downgrade")


class Kip848(Classic):
    """One librdkafka consumer with ``group.protocol=consumer`` (the same event script)."""

    def __init__(self, name: str, bootstrap: str, topic: str, group: str) -> None:
        Member.__init__(self)
        self.name = name
        self.events: list[dict[str, Any]] = []
        config = {"bootstrap.servers": bootstrap, "group.id": group,
                  "group.protocol": "consumer", "client.id": name,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False}
        self._spawn([sys.executable, "-c", MEMBER, json.dumps(config), topic])


def described_at_broker(bootstrap: str, group: str) -> dict[str, Any]:
    """The broker's own DescribeGroups entry for ``group``."""
    conn = coordinator_of(bootstrap, group)
    try:
        answer = conn.request(15, 5, {"groups": [group], "include_authorized_operations": False})
    finally:
        conn.close()
    entry: dict[str, Any] = answer["groups"][0]
    return entry


def given_up_first(member: Classic, since: float, owned_before: set[int]) -> bool:
    """Whether the member's first callback after ``since`` gave up everything it owned."""
    callbacks = member.callbacks_after(since)
    if not callbacks:
        return False
    first = callbacks[0]
    return first["name"] in ("revoked", "lost") and set(first["partitions"]) == owned_before


@pytest.fixture
def running() -> Iterator[list[Classic]]:
    started: list[Classic] = []
    yield started
    for m in started:
        m.stop()


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_released_the_group_is_the_brokers_classic_group_with_every_member(
        kafka39: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        running: list[Classic], assignor: str) -> None:
    proxy: ProxyProcess = start_proxy(kafka39, *FLAGS, *RELEASE_FLAGS)
    name = topic(kafka39, partitions=PARTITIONS)
    group = f"release-{assignor}-{uuid.uuid4().hex[:8]}"
    producer = Producer(kafka39.bootstrap, name)
    commits = Commits(kafka39.bootstrap, group, name)
    members: list[Classic] = [
        Classic("classic-0", proxy.bootstrap, name, group, assignor),
        Classic("classic-1", proxy.bootstrap, name, group, assignor),
        Kip848("kip848-0", proxy.bootstrap, name, group),
        Kip848("kip848-1", proxy.bootstrap, name, group)]
    running.extend(members)
    try:
        wait_until(lambda: owned_exactly_once(members), "4 members owning all", WAIT)
        wait_until(lambda: engine_members(proxy.bootstrap, group) == sorted(
            [CLASSIC, CLASSIC, CONSUMER, CONSUMER]), "the engine to coordinate the group",
            WAIT)
        entry = described_at_broker(kafka39.bootstrap, group)
        assert entry["protocol_data"] == "groupgate-coordinated", entry  # the lock
        marks = {m.name: len(m.consumed_records()) for m in members}
        wait_until(lambda: all(len(m.consumed_records()) > marks[m.name] for m in members),
                   "every member to consume through the engine", WAIT)
        owned_before = {m.name: {p for _, p in m.owned()} for m in members}

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
        wait_until(lambda: owned_exactly_once(members), "the 4 members to own all again",
                   WAIT)
        marks = {m.name: len(m.consumed_records()) for m in members}
        wait_until(lambda: all(len(m.consumed_records()) > marks[m.name] for m in members),
                   "every member to consume after the hand-back", WAIT)
        settled = time.time()

        entry = described_at_broker(kafka39.bootstrap, group)
        clients = sorted(m["client_id"] for m in entry["members"])
        assert all(c.startswith("gg3|") for c in clients), clients
        bridged = [c for c in clients if c.split("|")[2] != "-"]
        assert len(bridged) == 2, clients  # the KIP-848 members, carried over
        assert sorted(c.rsplit("|", 1)[1] for c in clients) == sorted(
            m.name for m in members), clients
        assert engine_members(proxy.bootstrap, group) is None  # the engine let it go

        for m in members:
            print(f"{m.name}: callbacks after the command: "
                  f"{[(e['name'], e['partitions']) for e in m.callbacks_after(released_at)]}")
            assert given_up_first(m, released_at, owned_before[m.name]), (
                m.name, owned_before[m.name], m.callbacks_after(released_at))
            assert not m.errors or all(not e.get("fatal") for e in m.errors), (m.name, m.errors)

        # the sidecar removed pod by pod: each application restarted straight at the broker
        # (a KIP-848 one as a classic consumer: Kafka 3.9 has no KIP-848 coordinator)
        for step, slot in enumerate((0, 2), start=1):
            start = time.time()
            members[slot].stop()
            members[slot] = Classic(f"{members[slot].name}-direct", kafka39.bootstrap, name,
                                    group, assignor)
            running.append(members[slot])
            wait_until(lambda: owned_exactly_once(members),
                       f"the group to settle after pod {slot} left its sidecar", WAIT)
            entry = described_at_broker(kafka39.bootstrap, group)
            clients = [m["client_id"] for m in entry["members"]]
            assert len(clients) == 4 and sum(not c.startswith("gg3|") for c in clients) == step, \
                clients
            print(f"pod {slot} straight at the broker: longest unconsumed "
                  f"{longest_unconsumed(running, start, time.time()):.2f} s; callbacks "
                  f"{[(m.name, len(m.callbacks_after(start))) for m in members]}")
        for m in running:
            refused = [e for e in m.errors if "INCONSISTENT_GROUP_PROTOCOL" in str(e)]
            assert refused == [] and not any(e.get("fatal") for e in m.errors), (m.name,
                                                                               m.errors)
    finally:
        producer.stop()
    try:
        wait_until(lambda: producer.acked <= consumed(running), "every acknowledged record "
                   "to be consumed", WAIT)
    finally:
        commits.stop()
    assert producer.acked and producer.failed == 0
    assert ownership_overlaps(running) == []
    assert commits.reads > 0 and commits.backwards == [], commits.backwards
    longest = longest_unconsumed(running, released_at, settled)
    print(f"{assignor}: hand-back: longest unconsumed {longest:.2f} s; heartbeat interval of "
          f"the classic members {HEARTBEAT_MS} ms")
