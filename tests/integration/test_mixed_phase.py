"""A KIP-848 client joins a live classic group that still has members straight at the broker.

Three librdkafka classic consumers connected straight to a Kafka 3.9 broker consume a
6-partition topic while a producer writes to it without pause; then a confluent-kafka consumer
with ``group.protocol=consumer`` joins the same group through groupgate. The broker refuses the
proxy's lock (the group has direct members): the group is in the broker phase, and the client
gets a bridged member in the broker's classic group (decision record 0018, "Members behind
sidecars in the broker phase"). Then the direct members leave one at a time.

Checked, from the members' own callbacks and records (each event carries the wall-clock time
its process printed it; all run on one machine):

* the KIP-848 member gets partitions while direct members are there, and consumes records
  (its time to the first assignment is printed, never asserted);
* no partition is owned by two members at once (ownership runs from an ``on_assign`` callback
  to the ``on_revoke`` / ``on_lost`` one, else to the member's close);
* every record the producer saw acknowledged is consumed;
* the group's committed offsets (sampled at the broker throughout) never move back;
* once every direct member has left, the KIP-848 member owns every partition, and the group
  moves to the engine (its only member is marked: the bridged one), which adopts the member
  under the client's own member id without calling it back.

Without the bridge the KIP-848 member gets nothing until the last direct member is gone (the
test then fails waiting for its first partitions while they are there). Every wait is bounded
generously only to turn a hang into a failure; nothing is timed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from functools import partial

import pytest
from confluent_kafka import Consumer, TopicPartition

from proxy.process import ProxyProcess
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
from tests.integration.test_classic_translation import CONSUMER
from tests.integration.test_online_upgrade import engine_members
from tests.testbed.broker import KafkaBroker

PARTITIONS = 6
DIRECT = 3
RATE = 50
"""Records per second."""
WAIT = 120.0
"""Bound on any one wait (a hang guard, not a timing)."""
CLASSIC = {"session.timeout.ms": 10000, "heartbeat.interval.ms": 1000}


class CommittedOffsets:
    """Samples the group's committed offsets at the broker; notes any that moved back."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                "enable.auto.commit": False})
        self.partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.last: dict[int, int] = {}
        self.moved_back: list[str] = []
        self.samples = 0
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while self.running:
            try:
                committed = self.reader.committed(self.partitions, timeout=10)
            except Exception:
                time.sleep(0.5)
                continue
            for tp in committed:
                if tp.offset < 0:
                    continue
                before = self.last.get(tp.partition, -1)
                if tp.offset < before:
                    self.moved_back.append(f"partition {tp.partition}: {before} -> {tp.offset}")
                self.last[tp.partition] = max(before, tp.offset)
            self.samples += 1
            time.sleep(0.3)

    def stop(self) -> None:
        self.running = False
        self.thread.join(30)
        self.reader.close()


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_a_kip848_member_gets_its_share_while_direct_members_hold_the_group(
        kafka39: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        members: list[Member], assignor: str) -> None:
    proxy: ProxyProcess = start_proxy(kafka39)
    name = topic(kafka39, partitions=PARTITIONS)
    group = f"mixed-{uuid.uuid4().hex[:8]}"
    everything = {(name, p) for p in range(PARTITIONS)}
    production = Production(kafka39.bootstrap, name, PARTITIONS, RATE)
    offsets = CommittedOffsets(kafka39.bootstrap, group, name)
    try:
        direct = []
        for i in range(DIRECT):
            direct.append(ConfluentMember(
                kafka39.bootstrap, [name], group, protocol="classic", name=f"direct-{i}",
                tolerate_commit_failures=True,
                extra={"partition.assignment.strategy": assignor, **CLASSIC}))
            members.append(direct[-1])
        wait_until(lambda: set().union(*(m.owned() for m in direct)) == everything
                   and all(m.records for m in direct), "the direct members consuming", WAIT)

        kip848 = ConfluentMember(proxy.bootstrap, [name], group, name="kip848",
                                 tolerate_commit_failures=True)
        members.append(kip848)
        wait_until(lambda: bool(kip848.owned()) and bool(kip848.records),
                   "the KIP-848 member's first partitions and records, direct members present",
                   WAIT)
        first = kip848.first_assignment()
        assert first is not None
        print(f"[{assignor}] time to the KIP-848 member's first assignment: "
              f"{first - kip848.started:.2f} s (3 direct members in the group)")
        wait_until(partial(owned_exactly_once, [*direct, kip848], everything),
                   "the group settled with four members", WAIT)

        for i, leaving in enumerate(direct):
            leaving.stop(timeout=60)
            wait_until(partial(owned_exactly_once, [*direct[i + 1:], kip848], everything),
                       f"the group settled after {leaving.name} left", WAIT)
        assert kip848.owned() == everything
        # no member is direct any more: the group moves to the engine, which adopts the
        # bridged member under the client's member id; the client is not called back
        settled = time.time()
        wait_until(lambda: engine_members(proxy.bootstrap, group) == [CONSUMER],
                   "the group to move to the engine with its KIP-848 member", WAIT)
        marks = len(kip848.records)
        wait_until(lambda: len(kip848.records) > marks + 10,
                   "the KIP-848 member consuming after the conversion", WAIT)
        assert kip848.callbacks_after(settled) == [], kip848.callbacks_after(settled)
        assert kip848.owned() == everything

        production.stop()
        acked = production.acked
        assert acked
        wait_until(lambda: acked <= consumed(members), "every acknowledged record consumed",
                   WAIT)
        wait_until(lambda: offsets.samples > 3, "committed offsets sampled", WAIT)
        assert not ownership_overlaps(members), ownership_overlaps(members)
        assert not offsets.moved_back, offsets.moved_back
        print(f"[{assignor}] KIP-848 member: {len(kip848.records)} records, "
              f"errors {kip848.errors[:5]}")
    finally:
        production.stop()
        offsets.stop()


@pytest.mark.slow  # about a minute; the default run has the bridged regex member in
# tests/unit/coordination/test_bridged.py
def test_a_regex_subscriber_is_bridged_and_follows_a_new_matching_topic(
        kafka39: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        members: list[Member]) -> None:
    """A KIP-848 client subscribing by regex (``subscribed_topic_regex``) joins the broker's
    group while direct members hold it: it is bridged with the regex resolved to the topics
    groupgate sees, gets its share, and when a topic that matches is created it rejoins with
    it and is given the new topic's partitions (the direct members subscribe to the first
    topic only). After the direct members leave, the engine adopts it, still subscribed by
    the regex, without calling it back."""
    proxy: ProxyProcess = start_proxy(kafka39)
    name = topic(kafka39, partitions=PARTITIONS)
    more = f"{name}-more"
    group = f"mixed-regex-{uuid.uuid4().hex[:8]}"
    everything = {(name, p) for p in range(PARTITIONS)}
    production = Production(kafka39.bootstrap, name, PARTITIONS, RATE)
    offsets = CommittedOffsets(kafka39.bootstrap, group, name)
    try:
        direct = []
        for i in range(2):
            direct.append(ConfluentMember(
                kafka39.bootstrap, [name], group, protocol="classic", name=f"direct-{i}",
                tolerate_commit_failures=True,
                extra={"partition.assignment.strategy": "cooperative-sticky", **CLASSIC}))
            members.append(direct[-1])
        wait_until(lambda: set().union(*(m.owned() for m in direct)) == everything,
                   "the direct members owning everything", WAIT)
        kip848 = ConfluentMember(proxy.bootstrap, [f"^{name}(-more)?$"], group, name="kip848",
                                 tolerate_commit_failures=True)
        members.append(kip848)
        wait_until(partial(owned_exactly_once, [*direct, kip848], everything),
                   "the regex member's share, direct members present", WAIT)
        assert kip848.owned() and kip848.records
        kafka39.create_topic(more, 2)  # matches the regex only
        added = {(more, 0), (more, 1)}
        wait_until(lambda: added <= kip848.owned(), "the regex member given the new "
                   "matching topic's partitions", WAIT)
        assert not any(added & m.owned() for m in direct)
        for i, leaving in enumerate(direct):
            leaving.stop(timeout=60)
            wait_until(partial(owned_exactly_once, [*direct[i + 1:], kip848],
                               everything | added),
                       f"the group settled after {leaving.name} left", WAIT)
        settled = time.time()
        wait_until(lambda: engine_members(proxy.bootstrap, group) == [CONSUMER],
                   "the group to move to the engine with its regex member", WAIT)
        marks = len(kip848.records)
        wait_until(lambda: len(kip848.records) > marks + 10,
                   "the regex member consuming after the conversion", WAIT)
        assert kip848.callbacks_after(settled) == [], kip848.callbacks_after(settled)
        assert kip848.owned() == everything | added
        production.stop()
        wait_until(lambda: production.acked <= consumed(members),
                   "every acknowledged record consumed", WAIT)
        assert not ownership_overlaps(members), ownership_overlaps(members)
        assert not offsets.moved_back, offsets.moved_back
    finally:
        production.stop()
        offsets.stop()
