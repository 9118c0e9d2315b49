"""Group members and a producer in child processes, and what their events say.

A member is a real client run with ``python -c`` in a process of its own (so that a test can
SIGKILL it): a confluent-kafka consumer (``ConfluentMember``, either protocol) or a kafka-python
one (``KafkaPythonMember``, classic only). It prints one JSON line per event (its rebalance
callbacks, each record, errors, failed commits, its start and close), each stamped ``t`` with
its process's wall-clock time: all run on one machine, so the times of different members
compare. ``Member`` keeps the accounting (what it owns, what was revoked from it, what it
consumed); ``owned_exactly_once``, ``ownership_overlaps`` and ``consumed`` read several
members together. ``Production`` writes to a topic without pause, straight at the broker.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

WAIT = 90.0
"""Default bound on a wait: tests wait for events, this only turns a hang into a failure."""
SESSION_MS = 6000
HEARTBEAT_MS = 500
"""A classic member's session timeout and heartbeat interval unless a test sets its own."""

TopicPartition = tuple[str, int]

_PRELUDE = r"""
import json, signal, sys, time
running = True
def stop(*_):
    global running
    running = False
signal.signal(signal.SIGTERM, stop)
def emit(**kw):
    print(json.dumps(dict(kw, t=time.time())), flush=True)
def tps(ps):
    return [[p.topic, p.partition] for p in ps]
"""

CONFLUENT_MEMBER = _PRELUDE + r"""
from confluent_kafka import Consumer, KafkaException
config, topics, poll = json.loads(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])
tolerate_commit_failures = sys.argv[4] == "tolerate"
if config.get("statistics.interval.ms"):  # librdkafka's view of its group membership
    def stats(raw):
        group = json.loads(raw).get("cgrp") or {}
        emit(name="stats", join_state=group.get("join_state"),
             rebalance_cnt=group.get("rebalance_cnt"),
             rebalance_reason=group.get("rebalance_reason"))
    config["stats_cb"] = stats
c = Consumer(config)
c.subscribe(topics, on_assign=lambda c, ps: emit(name="partitions_assigned", partitions=tps(ps),
                                                  member_id=c.memberid()),
            on_revoke=lambda c, ps: emit(name="partitions_revoked", partitions=tps(ps)),
            on_lost=lambda c, ps: emit(name="partitions_lost", partitions=tps(ps)))
emit(name="started")
while running:
    m = c.poll(poll)
    if m is None:
        continue
    if m.error():
        emit(name="error", code=m.error().code(), error=m.error().name(), fatal=m.error().fatal())
        continue
    emit(name="record", topic=m.topic(), partition=m.partition(), offset=m.offset())
    try:
        c.commit(message=m, asynchronous=False)
    except KafkaException as exc:
        emit(name="commit_failed", error=str(exc))
        if not tolerate_commit_failures:
            raise
c.close()
emit(name="closed")
"""

KAFKA_PYTHON_MEMBER = _PRELUDE + r"""
from kafka import KafkaConsumer
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
bootstrap, group, topics, assignor = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
session_ms, heartbeat_ms = int(sys.argv[5]), int(sys.argv[6])
class Listener(ConsumerRebalanceListener):
    def on_partitions_revoked(self, revoked):
        emit(name="partitions_revoked", partitions=tps(revoked))
    def on_partitions_assigned(self, assigned):
        emit(name="partitions_assigned", partitions=tps(assigned))
    def on_partitions_lost(self, lost):
        emit(name="partitions_lost", partitions=tps(lost))
strategy = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor,
            "cooperative-sticky": CooperativeStickyAssignor}
c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                  enable_auto_commit=False, partition_assignment_strategy=[strategy[assignor]],
                  session_timeout_ms=session_ms, heartbeat_interval_ms=heartbeat_ms,
                  max_poll_interval_ms=30000, client_id="classic-" + assignor)
c.subscribe(topics, listener=Listener())
emit(name="started")
while running:
    batch = c.poll(timeout_ms=200)
    for tp, records in batch.items():
        for r in records:
            emit(name="record", topic=r.topic, partition=r.partition, offset=r.offset)
    if batch:
        c.commit()
c.close()
emit(name="closed")
"""

PRODUCER = _PRELUDE + r"""
from confluent_kafka import Producer
bootstrap, topic, partitions, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def delivered(err, msg):
    if err is None:
        emit(name="acked", partition=msg.partition(), offset=msg.offset())
    else:
        emit(name="failed", error=str(err))
p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
              "enable.idempotence": True})
i = 0
while running:
    p.produce(topic, value=b"%d" % i, partition=i % partitions, on_delivery=delivered)
    p.poll(0)
    i += 1
    time.sleep(1 / rate)
p.flush(30)
emit(name="closed")
"""

CALLBACKS = ("partitions_assigned", "partitions_revoked", "partitions_lost")


def partitions_of(event: dict[str, Any]) -> set[TopicPartition]:
    """The partitions of a callback event: ``[topic, partition]`` pairs from the scripts here,
    ``{"topic", "partition"}`` objects from Kafka's VerifiableConsumer."""
    return {(p[0], int(p[1])) if isinstance(p, list) else (p["topic"], int(p["partition"]))
            for p in event.get("partitions", [])}


class Member:
    """A group member: every event it reported, its assignment and every revocation it saw."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.started = time.time()
        self.events: list[dict[str, Any]] = []
        self.assignment: set[TopicPartition] = set()
        self.revoked: set[TopicPartition] = set()
        self.errors: list[dict[str, Any]] = []
        self.records: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()

    def on_event(self, event: dict[str, Any]) -> None:
        name = event.get("name")
        parts = partitions_of(event)
        with self.lock:
            self.events.append(event)
            if name == "partitions_assigned":
                self.assignment |= parts
            elif name in ("partitions_revoked", "partitions_lost"):
                self.assignment -= parts
                self.revoked |= parts
            elif name == "error":
                self.errors.append(event)
            elif name == "record":
                self.records.append((event["topic"], event["partition"], event["offset"]))

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.events)

    def owned(self) -> set[TopicPartition]:
        with self.lock:
            return set(self.assignment)

    def first_assignment(self) -> float | None:
        """When the member was first given partitions (its process's clock), if it was."""
        return next((float(e["t"]) for e in self.snapshot()
                     if e["name"] == "partitions_assigned" and e["partitions"]), None)

    def member_id(self) -> str | None:
        """The member id the client had at its latest assignment callback (a
        ``ConfluentMember``'s; None: not reported)."""
        ids = [e["member_id"] for e in self.snapshot()
               if e["name"] == "partitions_assigned" and e.get("member_id")]
        return str(ids[-1]) if ids else None

    def join_state_after(self, t: float) -> str | None:
        """librdkafka's join state in the member's latest statistics, if they were emitted
        after ``t`` (a ``ConfluentMember`` with ``stats_ms``): ``steady`` once it has served
        every rebalance callback of the generation it joined; None: no statistics since."""
        stats = [e for e in self.snapshot() if e["name"] == "stats" and e["t"] > t]
        return str(stats[-1]["join_state"]) if stats else None

    def callbacks_after(self, t: float) -> list[dict[str, Any]]:
        """The rebalance callbacks the member saw after ``t``."""
        return [e for e in self.snapshot() if e["name"] in CALLBACKS and e["t"] > t]

    def kill(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class ProcessMember(Member):
    """A member running a client script in a child process that prints JSON events."""

    def _spawn(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.on_event(json.loads(line))
            except json.JSONDecodeError:
                continue

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM: the client closes (leaving its group); SIGKILL if it is not gone within
        ``timeout`` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(5)


class ConfluentMember(ProcessMember):
    """A confluent-kafka (librdkafka) consumer committing each record synchronously.

    ``assignor`` is the KIP-848 ``group.remote.assignor``; a classic member (``protocol``)
    gets ``SESSION_MS`` and ``HEARTBEAT_MS``, and ``extra`` properties override any of it. A
    failed commit is reported (``commit_failed``) and, unless ``tolerate_commit_failures``,
    ends the process. ``poll`` is the poll timeout in seconds; ``wrapper`` runs the process
    (a pod's ``ip netns exec``); ``stats_ms``: librdkafka's statistics every so many
    milliseconds, their group part reported as ``stats`` events (join state, rebalances)."""

    def __init__(self, bootstrap: str, topics: list[str], group: str, *,
                 assignor: str | None = None, protocol: str = "consumer",
                 extra: dict[str, Any] | None = None, name: str = "", poll: float = 0.2,
                 tolerate_commit_failures: bool = False, wrapper: Sequence[str] = (),
                 stats_ms: int = 0) -> None:
        super().__init__(name)
        config: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": group,
                                  "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False, "group.protocol": protocol}
        if assignor:
            config["group.remote.assignor"] = assignor
        if protocol == "classic":
            config["session.timeout.ms"] = SESSION_MS
            config["heartbeat.interval.ms"] = HEARTBEAT_MS
        if stats_ms:
            config["statistics.interval.ms"] = stats_ms
        config.update(extra or {})
        self._spawn([*wrapper, sys.executable, "-c", CONFLUENT_MEMBER, json.dumps(config),
                     json.dumps(topics), str(poll),
                     "tolerate" if tolerate_commit_failures else "raise"])


class KafkaPythonMember(ProcessMember):
    """A kafka-python consumer (classic protocol only), committing after each batch."""

    def __init__(self, bootstrap: str, topics: list[str], group: str, assignor: str) -> None:
        super().__init__()
        self._spawn([sys.executable, "-c", KAFKA_PYTHON_MEMBER, bootstrap, group,
                     json.dumps(topics), assignor, str(SESSION_MS), str(HEARTBEAT_MS)])


class Production(ProcessMember):
    """Writes ``rate`` records a second round-robin over ``partitions`` partitions of ``topic``,
    idempotently, without pause until stopped (a child process); keeps what was acknowledged
    (partition, offset) and counts failed deliveries."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int) -> None:
        super().__init__("production")
        self.acked: set[tuple[int, int]] = set()
        self.failed = 0
        self._spawn([sys.executable, "-c", PRODUCER, bootstrap, topic, str(partitions),
                     str(rate)])

    def on_event(self, event: dict[str, Any]) -> None:
        with self.lock:
            if event.get("name") == "acked":
                self.acked.add((event["partition"], event["offset"]))
            elif event.get("name") == "failed":
                self.failed += 1


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.1)


def owned_exactly_once(members: Iterable[Member], partitions: set[TopicPartition]) -> bool:
    """Every partition owned by exactly one member, and every member owns something."""
    union: set[TopicPartition] = set()
    for owned in (m.owned() for m in members):
        if not owned or union & owned:
            return False
        union |= owned
    return union == partitions


def ownership_overlaps(members: Iterable[Member]) -> list[str]:
    """Partitions owned by two members at once, ownership running from a member's assignment
    callback to its revocation or loss, else to its close (else to the end: a killed one)."""
    intervals: dict[TopicPartition, list[tuple[float, float, str]]] = {}
    for m in members:
        events = m.snapshot()
        end = next((e["t"] for e in events if e["name"] == "closed"), float("inf"))
        held: dict[TopicPartition, float] = {}
        for e in events:
            if e["name"] == "partitions_assigned":
                for p in partitions_of(e):
                    held.setdefault(p, e["t"])
            elif e["name"] in ("partitions_revoked", "partitions_lost"):
                for p in partitions_of(e):
                    if p in held:
                        intervals.setdefault(p, []).append((held.pop(p), e["t"], m.name))
        for p, since in held.items():
            intervals.setdefault(p, []).append((since, end, m.name))
    found = []
    for (topic, partition), spans in sorted(intervals.items()):
        spans.sort()
        for (_s1, e1, a), (s2, _e2, b) in itertools.pairwise(spans):
            if s2 < e1:
                found.append(f"partition {topic}-{partition}: {a} until {e1:.3f}, "
                             f"{b} from {s2:.3f}")
    return found


def consumed(members: Iterable[Member]) -> set[tuple[int, int]]:
    """Every (partition, offset) the members consumed."""
    seen: set[tuple[int, int]] = set()
    for m in members:
        with m.lock:
            seen.update((p, o) for _, p, o in m.records)
    return seen
