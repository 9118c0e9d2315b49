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
  to the ``on_revoke`` / ``on_lost`` one);
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

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy
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

MEMBER = r"""
import json, signal, sys, time
from confluent_kafka import Consumer
config, topic = json.loads(sys.argv[1]), sys.argv[2]
running = True
def stop(*_):
    global running
    running = False
signal.signal(signal.SIGTERM, stop)
def emit(**kw):
    print(json.dumps(dict(kw, ts=time.time())), flush=True)
def ps(parts):
    return [p.partition for p in parts]
c = Consumer(config)
c.subscribe([topic], on_assign=lambda c, p: emit(name="assigned", partitions=ps(p)),
            on_revoke=lambda c, p: emit(name="revoked", partitions=ps(p)),
            on_lost=lambda c, p: emit(name="lost", partitions=ps(p)))
emit(name="started")
while running:
    m = c.poll(0.2)
    if m is None:
        continue
    if m.error():
        emit(name="error", error=m.error().name())
        continue
    emit(name="record", partition=m.partition(), offset=m.offset())
    try:
        c.commit(message=m, asynchronous=False)
    except Exception as exc:
        emit(name="commit_failed", error=str(exc))
c.close()
emit(name="closed")
"""


class Member:
    """A consumer in a child process, and every event it printed."""

    def __init__(self, label: str, config: dict[str, Any], topic: str) -> None:
        self.label = label
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.started = time.time()
        self.proc = subprocess.Popen([sys.executable, "-c", MEMBER, json.dumps(config), topic],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self.lock:
                self.events.append(event)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.events)

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for event in self.snapshot():
            if event["name"] == "assigned":
                owned |= set(event["partitions"])
            elif event["name"] in ("revoked", "lost"):
                owned -= set(event["partitions"])
        return owned

    def consumed(self) -> set[tuple[int, int]]:
        return {(e["partition"], e["offset"]) for e in self.snapshot() if e["name"] == "record"}

    def first_assignment(self) -> float | None:
        for event in self.snapshot():
            if event["name"] == "assigned" and event["partitions"]:
                return float(event["ts"])
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def owned_once(members: list[Member], everything: set[int]) -> bool:
    """Every partition owned by exactly one of ``members`` now."""
    owned = [m.owned() for m in members]
    return sum(len(o) for o in owned) == len(everything) and set().union(*owned) == everything


def double_ownership(members: list[Member]) -> list[str]:
    """Every moment a partition was owned by two members, replaying all callbacks in time."""
    events = sorted(((e["ts"], m.label, e) for m in members for e in m.snapshot()
                     if e["name"] in ("assigned", "revoked", "lost")), key=lambda x: x[0])
    owner: dict[int, str] = {}
    found: list[str] = []
    for ts, label, event in events:
        for p in event["partitions"]:
            if event["name"] == "assigned":
                if p in owner and owner[p] != label:
                    found.append(f"partition {p} assigned to {label} at {ts:.3f} while "
                                 f"{owner[p]} owned it")
                owner[p] = label
            elif owner.get(p) == label:
                del owner[p]
    return found


class Production:
    """A producer writing to the topic straight at the broker, without pause."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                  "enable.idempotence": True})
        self.topic = topic
        self.acked: set[tuple[int, int]] = set()
        self.lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            with self.lock:
                self.acked.add((msg.partition(), msg.offset()))

    def _run(self) -> None:
        n = 0
        while self.running:
            self.producer.produce(self.topic, key=str(n).encode(), value=b"x" * 20,
                                  on_delivery=self._delivered)
            self.producer.poll(0)
            n += 1
            time.sleep(1 / RATE)
        self.producer.flush(30)

    def stop(self) -> set[tuple[int, int]]:
        self.running = False
        self.thread.join(60)
        with self.lock:
            return set(self.acked)


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


@pytest.fixture
def started() -> Iterator[list[Member]]:
    members: list[Member] = []
    yield members
    for m in members:
        m.stop()


@pytest.mark.parametrize("assignor", ["cooperative-sticky", "range"])
def test_a_kip848_member_gets_its_share_while_direct_members_hold_the_group(
        kafka39: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        started: list[Member], assignor: str) -> None:
    proxy: ProxyProcess = start_proxy(kafka39)
    name = topic(kafka39, partitions=PARTITIONS)
    group = f"mixed-{uuid.uuid4().hex[:8]}"
    everything = set(range(PARTITIONS))
    production = Production(kafka39.bootstrap, name)
    offsets = CommittedOffsets(kafka39.bootstrap, group, name)
    try:
        direct = []
        for i in range(DIRECT):
            direct.append(Member(f"direct-{i}", {
                "bootstrap.servers": kafka39.bootstrap, "group.id": group,
                "auto.offset.reset": "earliest", "enable.auto.commit": False,
                "group.protocol": "classic", "partition.assignment.strategy": assignor,
                **CLASSIC}, name))
            started.append(direct[-1])
        wait_until(lambda: set().union(*(m.owned() for m in direct)) == everything
                   and all(m.consumed() for m in direct), "the direct members consuming")

        kip848 = Member("kip848", {
            "bootstrap.servers": proxy.bootstrap, "group.id": group,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "group.protocol": "consumer"}, name)
        started.append(kip848)
        wait_until(lambda: bool(kip848.owned()) and bool(kip848.consumed()),
                   "the KIP-848 member's first partitions and records, direct members present")
        first = kip848.first_assignment()
        assert first is not None
        print(f"[{assignor}] time to the KIP-848 member's first assignment: "
              f"{first - kip848.started:.2f} s (3 direct members in the group)")
        members = [*direct, kip848]
        wait_until(partial(owned_once, members, everything), "the group settled with four members")

        for i, leaving in enumerate(direct):
            leaving.stop()
            wait_until(partial(owned_once, [*direct[i + 1:], kip848], everything),
                       f"the group settled after {leaving.label} left")
        assert kip848.owned() == everything
        # no member is direct any more: the group moves to the engine, which adopts the
        # bridged member under the client's member id; the client is not called back
        settled = time.time()
        wait_until(lambda: engine_members(proxy.bootstrap, group) == [CONSUMER],
                   "the group to move to the engine with its KIP-848 member")
        marks = len(kip848.consumed())
        wait_until(lambda: len(kip848.consumed()) > marks + 10,
                   "the KIP-848 member consuming after the conversion")
        assert [e for e in kip848.snapshot() if e["name"] in ("assigned", "revoked", "lost")
                and e["ts"] > settled] == []
        assert kip848.owned() == everything

        acked = production.stop()
        assert acked
        wait_until(lambda: acked <= set().union(*(m.consumed() for m in members)),
                   "every acknowledged record consumed")
        wait_until(lambda: offsets.samples > 3, "committed offsets sampled")
        assert not double_ownership(members), double_ownership(members)
        assert not offsets.moved_back, offsets.moved_back
        errors = [e for e in kip848.snapshot() if e["name"] == "error"]
        print(f"[{assignor}] KIP-848 member: {len(kip848.consumed())} records, "
              f"errors {errors[:5]}")
    finally:
        production.running = False
        offsets.stop()
