"""Upgrade without a stop: a live classic group rolled onto sidecars moves to the engine.

Four librdkafka classic consumers (confluent-kafka, ``group.protocol=classic``) consume a
12-partition topic straight from Kafka 3.9 while a producer writes to it continuously. They are
restarted one at a time behind one groupgate (the rolling deployment of the sidecar). While
any member is direct, the broker's classic coordinator keeps the group and the members behind
the proxy are forwarded to it, marked (``gg3|...`` client ids). After the last restart no
member is direct, and the group moves to the engine online (decision record 0018, section 1):

* the engine coordinates it: ConsumerGroupDescribe through the proxy lists the four members
  as classic members, and DescribeGroups at the broker shows only the proxy's lock member;
* nobody was called back by the conversion: no member saw an assignment, revocation or loss
  after the group settled from the last restart, through the conversion and while every
  member went on consuming;
* throughout: no partition owned by two members at once (each member's callbacks, wall-clock
  stamped on one machine), every record the producer saw acknowledged consumed, the group's
  committed offsets (read at the broker) never moving back.

Run for the cooperative-sticky assignor and for the eager range one behind one sidecar, and
for cooperative-sticky with the members alternating between two sidecars with fleet listeners
(the sidecar forwarding the leader announces the conversion to the other, which holds its
members' requests meanwhile and relays them to the new holder after). The longest time any
partition went unconsumed in each step is printed. Waits are bounded only to stop a hang;
nothing asserts a duration.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy
from tests.integration.test_classic_translation import CLASSIC, FLAGS
from tests.integration.test_new_protocol import Member, ProcessMember, coordinator_of, wait_until
from tests.testbed.broker import KafkaBroker, free_ports

PARTITIONS = 12
MEMBERS = 4
SESSION_MS = 6000
HEARTBEAT_MS = 500
WAIT = 90.0
"""Bound for one step to settle (a hang fails; nothing is timed)."""
RATE = 100
"""Records per second the producer writes."""
FLEET_SESSION = ("--group-session-timeout-ms", "18000")
"""The proxy's own members' session, as a fleet requires it with these heartbeats and the
broker's session of the proxy's member (6 s): heartbeat + broker session + 11 s."""

MEMBER = r"""
import json, signal, sys, time
from confluent_kafka import Consumer, KafkaException
config, topic = json.loads(sys.argv[1]), sys.argv[2]
running = True
def stop(*_):
    global running
    running = False
signal.signal(signal.SIGTERM, stop)
def emit(**kw):
    print(json.dumps(dict(kw, t=time.time())), flush=True)
def tps(ps):
    return [p.partition for p in ps]
c = Consumer(config)
c.subscribe([topic], on_assign=lambda c, ps: emit(name="assigned", partitions=tps(ps)),
            on_revoke=lambda c, ps: emit(name="revoked", partitions=tps(ps)),
            on_lost=lambda c, ps: emit(name="lost", partitions=tps(ps)))
emit(name="started")
while running:
    m = c.poll(0.1)
    if m is None:
        continue
    if m.error():
        emit(name="error", error=m.error().name(), fatal=m.error().fatal())
        continue
    emit(name="record", partition=m.partition(), offset=m.offset())
    try:
        c.commit(message=m, asynchronous=False)
    except KafkaException as exc:
        emit(name="commit_failed", error=str(exc))
c.close()
emit(name="closed")
"""


class Classic(ProcessMember):
    """One librdkafka classic consumer; every event it printed, with its wall-clock time."""

    def __init__(self, name: str, bootstrap: str, topic: str, group: str, assignor: str
                 ) -> None:
        super().__init__()
        self.name = name
        self.events: list[dict[str, Any]] = []
        config = {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "classic",
                  "client.id": name, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "partition.assignment.strategy": assignor,
                  "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS}
        self._spawn([sys.executable, "-c", MEMBER, json.dumps(config), topic])

    def on_event(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.events.append(event)
            name = event.get("name")
            parts = set(event.get("partitions", []))
            if name == "assigned":
                self.assignment |= {("", p) for p in parts}
            elif name in ("revoked", "lost"):
                self.assignment -= {("", p) for p in parts}
            elif name == "error":
                self.errors.append(event)

    def callbacks_after(self, t: float) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events
                    if e["name"] in ("assigned", "revoked", "lost") and e["t"] > t]

    def consumed_records(self) -> list[tuple[int, int, float]]:
        with self.lock:
            return [(e["partition"], e["offset"], e["t"]) for e in self.events
                    if e["name"] == "record"]


PRODUCER = r"""
import json, signal, sys, time
from confluent_kafka import Producer
bootstrap, topic, partitions, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
running = True
def stop(*_):
    global running
    running = False
signal.signal(signal.SIGTERM, stop)
def delivered(err, msg):
    if err is None:
        print(json.dumps({"name": "acked", "partition": msg.partition(), "offset": msg.offset()}),
              flush=True)
    else:
        print(json.dumps({"name": "failed", "error": str(err)}), flush=True)
p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
i = 0
while running:
    p.produce(topic, value=b"%d" % i, partition=i % partitions, on_delivery=delivered)
    p.poll(0)
    i += 1
    time.sleep(1 / rate)
p.flush(30)
print(json.dumps({"name": "closed"}), flush=True)
"""

class Producer(ProcessMember):
    """Writes ``RATE`` records a second straight to the broker (a child process); keeps what
    was acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__()
        self.acked: set[tuple[int, int]] = set()
        self.failed = 0
        self._spawn([sys.executable, "-c", PRODUCER, bootstrap, topic, str(PARTITIONS),
                     str(RATE)])

    def on_event(self, event: dict[str, Any]) -> None:
        with self.lock:
            if event.get("name") == "acked":
                self.acked.add((event["partition"], event["offset"]))
            elif event.get("name") == "failed":
                self.failed += 1


class Commits:
    """The group's committed offsets, read at the broker (OffsetFetch on a plain connection to
    its coordinator) every half second: any that moved back is kept."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.last: dict[int, int] = {}
        self.backwards: list[tuple[int, int, int]] = []
        self.reads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn = coordinator_of(self.bootstrap, self.group)
                try:
                    answer = conn.request(9, 5, {"group_id": self.group, "topics": [
                        {"name": self.topic, "partition_indexes": list(range(PARTITIONS))}]})
                finally:
                    conn.close()
            except (OSError, AssertionError):  # the coordinator is busy: read again
                self._stop.wait(0.5)
                continue
            if answer["error_code"] == 0:
                self._note(answer)
            self._stop.wait(0.5)

    def _note(self, answer: dict[str, Any]) -> None:
        self.reads += 1
        for topic in answer["topics"]:
            for p in topic["partitions"]:
                offset, partition = p["committed_offset"], p["partition_index"]
                if p["error_code"] or offset < 0:
                    continue
                before = self.last.get(partition, -1)
                if offset < before:
                    self.backwards.append((partition, before, offset))
                self.last[partition] = max(before, offset)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


# ---- what the members' events say -------------------------------------------------------------


def ownership_overlaps(members: list[Classic]) -> list[str]:
    """Partitions owned by two members at once (from assigned to revoked/lost/closed)."""
    intervals: dict[int, list[tuple[float, float, str]]] = {}
    for m in members:
        with m.lock:
            events = list(m.events)
        end = next((e["t"] for e in events if e["name"] == "closed"), float("inf"))
        held: dict[int, float] = {}
        for e in events:
            if e["name"] == "assigned":
                for p in e["partitions"]:
                    held.setdefault(p, e["t"])
            elif e["name"] in ("revoked", "lost"):
                for p in e["partitions"]:
                    if p in held:
                        intervals.setdefault(p, []).append((held.pop(p), e["t"], m.name))
        for p, since in held.items():
            intervals.setdefault(p, []).append((since, end, m.name))
    found = []
    for p, spans in intervals.items():
        spans.sort()
        for (_s1, e1, a), (s2, _e2, b) in itertools.pairwise(spans):
            if s2 < e1:
                found.append(f"partition {p}: {a} until {e1:.3f}, {b} from {s2:.3f}")
    return found


def longest_unconsumed(members: list[Classic], start: float, end: float) -> float:
    """The longest time within [start, end] that some partition had records waiting and none
    was consumed (approximated by the gaps between consumed records of each partition)."""
    times: dict[int, list[float]] = {p: [start] for p in range(PARTITIONS)}
    for m in members:
        for p, _offset, t in m.consumed_records():
            if start <= t <= end:
                times[p].append(t)
    longest = 0.0
    for p in times:
        ts = [*sorted(times[p]), end]
        longest = max(longest, max(b - a for a, b in itertools.pairwise(ts)))
    return longest


def consumed(members: list[Classic]) -> set[tuple[int, int]]:
    return {(p, o) for m in members for p, o, _ in m.consumed_records()}


# ---- the group as the proxy and the broker see it -----------------------------------------------


def engine_members(proxy_bootstrap: str, group: str) -> list[int] | None:
    """The engine's members by type (ConsumerGroupDescribe through the proxy); None while the
    engine does not have the group."""
    conn = coordinator_of(proxy_bootstrap, group)
    try:
        described = conn.request(69, 1, {"group_ids": [group],
                                         "include_authorized_operations": False})
    finally:
        conn.close()
    entry = described["groups"][0]
    if entry["error_code"] != 0:
        return None
    return sorted(m["member_type"] for m in entry["members"])


def broker_members(broker_bootstrap: str, group: str) -> tuple[str, list[str]]:
    """(protocol, client ids) of the broker's group (DescribeGroups at the broker)."""
    conn = coordinator_of(broker_bootstrap, group)
    try:
        described = conn.request(15, 5, {"groups": [group],
                                         "include_authorized_operations": False})
    finally:
        conn.close()
    entry = described["groups"][0]
    return entry["protocol_data"], [m["client_id"] for m in entry["members"]]


def owned_exactly_once(members: list[Classic]) -> bool:
    owned = [m.owned() for m in members]
    union: set[Any] = set()
    for o in owned:
        if not o or union & o:
            return False
        union |= o
    return len(union) == PARTITIONS


@pytest.fixture
def running() -> Iterator[list[Classic]]:
    started: list[Classic] = []
    yield started
    for m in started:
        m.stop()


@pytest.mark.parametrize(("assignor", "sidecars"), [
    ("cooperative-sticky", 1), ("range", 1), ("cooperative-sticky", 2)])
def test_rolled_onto_sidecars_the_group_moves_to_the_engine_without_a_callback(
        kafka39: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        running: list[Classic], assignor: str, sidecars: int) -> None:
    """With two sidecars (each with a fleet listener), members alternate between them: the one
    forwarding the leader announces the conversion to the other, which holds its members'
    requests and relays them to the new holder afterwards."""
    fleet = ([] if sidecars == 1 else  # sessions a fleet accepts (docs/operations.md)
             [("--fleet-listen", f"127.0.0.1:{port}", *FLEET_SESSION)
              for port in free_ports(sidecars)])
    proxies: list[ProxyProcess] = [start_proxy(kafka39, *FLAGS, *extra)
                                   for extra in fleet or [()]]
    name = topic(kafka39, partitions=PARTITIONS)
    group = f"upgrade-{assignor}-{uuid.uuid4().hex[:8]}"
    producer = Producer(kafka39.bootstrap, name)
    commits = Commits(kafka39.bootstrap, group, name)
    members: list[Classic] = []  # the live ones, by slot
    steps: list[tuple[str, float, float]] = []
    try:
        for i in range(MEMBERS):
            members.append(Classic(f"member-{i}", kafka39.bootstrap, name, group, assignor))
            running.append(members[-1])
        wait_until(lambda: owned_exactly_once(members), "4 direct members owning all", WAIT)
        assert broker_members(kafka39.bootstrap, group)[0] == assignor

        for i in range(MEMBERS):  # the sidecar's rolling deployment, pod by pod
            start = time.time()
            members[i].stop()
            proxy = proxies[i % len(proxies)]
            members[i] = Classic(f"member-{i}-proxied", proxy.bootstrap, name, group, assignor)
            running.append(members[i])
            wait_until(lambda: owned_exactly_once(members),
                       f"the group to settle after member {i} moved behind the proxy", WAIT)
            steps.append((f"member {i} behind the proxy", start, time.time()))
            if i < MEMBERS - 1:  # a direct member remains: the broker's group, now marked
                protocol, clients = broker_members(kafka39.bootstrap, group)
                assert protocol == assignor
                assert sum(c.startswith("gg3|") for c in clients) == i + 1, clients
        settled = time.time()

        wait_until(lambda: any(engine_members(p.bootstrap, group) is not None
                               for p in proxies), "the group to move to the engine", WAIT)
        converted = time.time()
        holder = next(p for p in proxies
                      if "moved from the broker's classic coordinator to the engine" in p.log())
        assert engine_members(holder.bootstrap, group) == [CLASSIC] * MEMBERS
        protocol, clients = broker_members(kafka39.bootstrap, group)
        assert protocol == "groupgate-coordinated" and len(clients) == 1, (protocol, clients)

        # every member goes on consuming after the conversion, and none was called back
        marks = {m.name: len(m.consumed_records()) for m in members}
        wait_until(lambda: all(len(m.consumed_records()) > marks[m.name] + 10 for m in members),
                   "every member to consume after the conversion", WAIT)
        steps.append(("conversion", settled, time.time()))
        for m in members:
            assert m.callbacks_after(settled) == [], (m.name, m.callbacks_after(settled))
            assert not m.errors, (m.name, m.errors)
        assert engine_members(holder.bootstrap, group) == [CLASSIC] * MEMBERS
        if sidecars > 1:  # the other sidecar was told, and relays to the holder since
            follower = next(p for p in proxies if p is not holder)
            assert "converts it at generation" in follower.log()
            assert "says it converted the group" in follower.log()
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
    assert min(commits.last.values(), default=-1) > 0
    print(f"\n{assignor}, {sidecars} sidecar(s): converted {converted - settled:.1f} s after "
          "the last step settled")
    for what, start, end in steps:
        print(f"{assignor}, {sidecars} sidecar(s): {what}: longest unconsumed "
              f"{longest_unconsumed(running, start, end):.2f} s")


class _Recorded(Classic):
    """Made-up events, for checking the accounting without a broker."""

    def __init__(self, name: str, events: list[dict[str, Any]]) -> None:
        Member.__init__(self)
        self.name = name
        self.events = events


def test_the_accounting_catches_what_it_looks_for() -> None:
    """Broker-free: overlapping ownership, callbacks after a time, and unconsumed gaps are
    found in made-up event streams (so the checks above can fail)."""
    a = _Recorded("a", [{"name": "assigned", "partitions": [0, 1], "t": 1.0},
                        {"name": "revoked", "partitions": [1], "t": 5.0},
                        {"name": "record", "partition": 0, "offset": 0, "t": 6.0},
                        {"name": "closed", "t": 9.0}])
    b = _Recorded("b", [{"name": "assigned", "partitions": [1], "t": 4.0}])
    assert ownership_overlaps([a, b]) == ["partition 1: a until 5.000, b from 4.000"]
    c = _Recorded("c", [{"name": "assigned", "partitions": [1], "t": 5.5}])
    assert ownership_overlaps([a, c]) == []
    d = _Recorded("d", [{"name": "assigned", "partitions": [0], "t": 8.0}])
    assert ownership_overlaps([a, d]) == ["partition 0: a until 9.000, d from 8.000"]
    assert [e["t"] for e in a.callbacks_after(2.0)] == [5.0] and a.callbacks_after(5.0) == []
    assert longest_unconsumed([a], 5.0, 8.0) == 3.0  # partitions 1-11: nothing consumed
    assert consumed([a, b]) == {(0, 0)}
