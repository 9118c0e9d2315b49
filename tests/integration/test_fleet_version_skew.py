"""Version skew: a groupgate 0.1.0 sidecar (no fleet support: it coordinates every group alone)
joins the broker's group that a fleet sidecar holds, as during a rolling update from 0.1.0.

The old sidecar is played at the wire level by exactly what 0.1.0 sends for its member in the
broker's group: protocol type ``consumer``, protocol ``groupgate-coordinated``, a consumer
subscription without user data (no card), heartbeats every third of its session. The fleet
sidecar must give the group up at once and make its own members drop their partitions, and
must not take the group back while the old sidecar is there; once it is gone, it does.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.upstream import UpstreamClient
from tests.integration.conftest import StartProxy
from tests.testbed.broker import KafkaBroker

pytestmark = pytest.mark.broker

SESSION_MS = 6000
"""The old sidecar's session in the broker's group."""
MEMBER_SESSION_MS = 18000
"""Members' sessions: a fleet needs the heartbeat interval (0.5 s) + broker-session-timeout-ms
(6 s) + 11 s (docs/operations.md, "How long a request can wait")."""
PROXY_FLAGS = ("--group-heartbeat-interval-ms", "500", "--group-session-timeout-ms",
               str(MEMBER_SESSION_MS), "--group-metadata-refresh-ms", "1000",
               "--fleet-listen", "127.0.0.1:0", "--fleet-address", "127.0.0.1:1",
               "--takeover-wait-ms", "2000")


class OldSidecar:
    """The member a groupgate 0.1.0 keeps in the broker's group, in a thread of its own."""

    def __init__(self, bootstrap: str, group_id: str, topic: str) -> None:
        host, _, port = bootstrap.partition(":")
        self.address = (host, int(port))
        self.group_id, self.topic = group_id, topic
        self.joined = threading.Event()
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=lambda: trio.run(self._run), daemon=True)

    async def _run(self) -> None:
        coordinator = await self._find()
        stream = await trio.open_tcp_stream(*coordinator)
        client = UpstreamClient(stream, max_frame_bytes=1 << 20)
        metadata = messages.encode_data("ConsumerProtocolSubscription", 0,
                                        {"topics": [self.topic]})
        member_id, generation = "", -1
        while not self.joined.is_set():
            join = await client.request(ApiKey.JOIN_GROUP, 5, {
                "group_id": self.group_id, "session_timeout_ms": SESSION_MS,
                "rebalance_timeout_ms": SESSION_MS, "member_id": member_id,
                "group_instance_id": None, "protocol_type": "consumer",
                "protocols": [{"name": "groupgate-coordinated", "metadata": metadata}]})
            member_id = join["member_id"] or member_id
            if join["error_code"] in (79, 27):  # MEMBER_ID_REQUIRED, REBALANCE_IN_PROGRESS
                continue
            assert join["error_code"] == 0, join
            generation = join["generation_id"]
            assignments = ([{"member_id": m["member_id"], "assignment": b""}
                            for m in join["members"]] if join["leader"] == member_id else [])
            sync = await client.request(ApiKey.SYNC_GROUP, 3, {
                "group_id": self.group_id, "generation_id": generation,
                "member_id": member_id, "group_instance_id": None,
                "assignments": assignments})
            if sync["error_code"] == 0:
                self.joined.set()
        while not self.stop.is_set():
            await trio.sleep(SESSION_MS / 3000)
            beat = await client.request(ApiKey.HEARTBEAT, 3, {
                "group_id": self.group_id, "generation_id": generation,
                "member_id": member_id, "group_instance_id": None})
            if beat["error_code"] == 27:  # the fleet sidecar's leave rebalanced the group
                self.joined.clear()
                return await self._rejoin(client, metadata, member_id)
        await client.request(ApiKey.LEAVE_GROUP, 3, {
            "group_id": self.group_id,
            "members": [{"member_id": member_id, "group_instance_id": None}]})
        await client.aclose()

    async def _rejoin(self, client: UpstreamClient, metadata: bytes, member_id: str) -> None:
        generation = -1
        while not self.joined.is_set():
            join = await client.request(ApiKey.JOIN_GROUP, 5, {
                "group_id": self.group_id, "session_timeout_ms": SESSION_MS,
                "rebalance_timeout_ms": SESSION_MS, "member_id": member_id,
                "group_instance_id": None, "protocol_type": "consumer",
                "protocols": [{"name": "groupgate-coordinated", "metadata": metadata}]})
            if join["error_code"] != 0:
                continue
            generation = join["generation_id"]
            sync = await client.request(ApiKey.SYNC_GROUP, 3, {
                "group_id": self.group_id, "generation_id": generation,
                "member_id": member_id, "group_instance_id": None,
                "assignments": [{"member_id": m["member_id"], "assignment": b""}
                                for m in join["members"]]})
            if sync["error_code"] == 0:
                self.joined.set()
        while not self.stop.is_set():
            await trio.sleep(SESSION_MS / 3000)
            await client.request(ApiKey.HEARTBEAT, 3, {
                "group_id": self.group_id, "generation_id": generation,
                "member_id": member_id, "group_instance_id": None})
        await client.request(ApiKey.LEAVE_GROUP, 3, {
            "group_id": self.group_id,
            "members": [{"member_id": member_id, "group_instance_id": None}]})
        await client.aclose()

    async def _find(self) -> tuple[str, int]:
        stream = await trio.open_tcp_stream(*self.address)
        client = UpstreamClient(stream, max_frame_bytes=1 << 20)
        found = await client.request(ApiKey.FIND_COORDINATOR, 3,
                                     {"key": self.group_id, "key_type": 0})
        await client.aclose()
        return found["host"], found["port"]


class Member:
    """A confluent-kafka member (new protocol) through the sidecar; records what it owns."""

    def __init__(self, bootstrap: str, group_id: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.owned: set[int] = set()
        self.consumed = 0
        self.history: list[tuple[float, str, tuple[int, ...]]] = []
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group_id,
            "group.protocol": "consumer", "auto.offset.reset": "earliest"})
        self.consumer.subscribe([topic], on_assign=self._assign, on_revoke=self._drop,
                                on_lost=self._drop)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _assign(self, _consumer: Any, partitions: list[Any]) -> None:
        self.owned |= {p.partition for p in partitions}
        self.history.append((time.monotonic(), "assign", tuple(p.partition for p in partitions)))

    def _drop(self, _consumer: Any, partitions: list[Any]) -> None:
        self.owned -= {p.partition for p in partitions}
        self.history.append((time.monotonic(), "drop", tuple(p.partition for p in partitions)))

    def _poll(self) -> None:
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            if message is not None and not message.error():
                self.consumed += 1
        self.consumer.close()


def owned_twice(members: list[Member]) -> list[tuple[float, int]]:
    """(time, partition) whenever a partition was owned by two members at once, replaying
    their callbacks in time order."""
    events = sorted((t, i, kind, ps) for i, m in enumerate(members) for t, kind, ps in m.history)
    owned: list[set[int]] = [set() for _ in members]
    twice: list[tuple[float, int]] = []
    for t, i, kind, ps in events:
        if kind == "assign":
            owned[i] |= set(ps)
            twice += [(t, p) for p in ps
                      if any(p in o for j, o in enumerate(owned) if j != i)]
        else:
            owned[i] -= set(ps)
    return twice


def produce_records(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, value=b"%d" % i, partition=i % 4)
    assert producer.flush(30) == 0


def committed_total(broker: KafkaBroker, group_id: str, topic: str, partitions: int) -> int:
    """The sum of ``group_id``'s committed offsets of ``topic``, read straight at the broker."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    admin = broker.admin()
    request = ConsumerGroupTopicPartitions(group_id, [TopicPartition(topic, p)
                                                      for p in range(partitions)])
    result = admin.list_consumer_group_offsets([request])[group_id].result(timeout=30)
    return sum(max(tp.offset, 0) for tp in result.topic_partitions)


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def old_sidecars() -> Iterator[list[OldSidecar]]:
    started: list[OldSidecar] = []
    yield started
    for old in started:
        old.stop.set()
        old.thread.join(10)


def test_a_groupgate_0_1_0_joining_a_held_group_is_never_coordinated_alongside(
        kafka39: KafkaBroker, start_proxy: StartProxy, old_sidecars: list[OldSidecar]) -> None:
    topic, group_id = f"skew-{uuid.uuid4().hex[:6]}", f"skew-{uuid.uuid4().hex[:6]}"
    kafka39.create_topic(topic, 4)
    sidecar = start_proxy(kafka39, *PROXY_FLAGS)
    member = Member(sidecar.bootstrap, group_id, topic)
    try:
        wait_for(lambda: member.owned == {0, 1, 2, 3}, 60, "the fleet to assign the member")
        old = OldSidecar(kafka39.bootstrap, group_id, topic)
        old_sidecars.append(old)
        old.thread.start()
        wait_for(old.joined.is_set, 60, "the old sidecar to hold the broker's group")
        # the fleet sidecar gave the group up and its member let go of everything
        wait_for(lambda: not member.owned, 30, "the member to drop its partitions")
        assert "a groupgate without fleet support (0.1.0)" in sidecar.log()  # said, and why
        time.sleep(8)  # and gets nothing back while the old sidecar holds the group
        assert not member.owned, member.history
        old.stop.set()
        old.thread.join(15)
        wait_for(lambda: member.owned == {0, 1, 2, 3}, 60,
                 "the fleet to take the group back once the old sidecar left")
    finally:
        member.stop.set()
        member.thread.join(15)


# ------------------------------------------------------------------------------------------
# groupgate 0.2.0 (fleet protocol 2) and this build (fleet protocol 3) in one fleet


@pytest.mark.parametrize("first", ["0.2.0", "this build"])
def test_a_fleet_of_0_2_0_and_this_build_serves_one_group_either_way(
        kafka39: KafkaBroker, tmp_path: Any, first: str) -> None:
    """A rolling update from 0.2.0: one sidecar of each, a KIP-848 member behind each. Whichever
    holds the group, the other follows it: both members get partitions, none is owned twice,
    and every record is consumed (the protocol-3 card's new fields are unknown keys to 0.2.0;
    0.2.0 relays with the protocol-2 mark, which this build reads; this build relays to a 0.2.0
    holder without FleetControl, with the protocol-2 mark, the protocol-3 one naming the
    follower only to protocol-3 holders), and what they consumed is committed. With this
    build holding it, ``groupgate release`` is refused while the 0.2.0 sidecar relays (it
    cannot be told of a hand-back)."""
    from proxy.process import ProxyProcess
    from tests.testbed.broker import free_ports
    from tests.testbed.releases import ReleaseUnavailable, release_tree

    try:
        old_tree = release_tree("0.2.0")
    except ReleaseUnavailable as exc:
        pytest.skip(str(exc))
    topic, group_id = f"skew-{uuid.uuid4().hex[:6]}", f"skew-{uuid.uuid4().hex[:6]}"
    kafka39.create_topic(topic, 4)
    fleet_old, fleet_new = free_ports(2)
    flags = ["--group-heartbeat-interval-ms", "500", "--group-session-timeout-ms",
             str(MEMBER_SESSION_MS), "--group-metadata-refresh-ms", "1000"]
    started: list[ProxyProcess] = []
    members: list[Member] = []

    def sidecar(version: str) -> ProxyProcess:
        port = fleet_old if version == "0.2.0" else fleet_new
        policy = [] if version == "0.2.0" else ["--migration-policy", "downgrade"]
        proxy = ProxyProcess.start(kafka39.bootstrap, tmp_path / f"groupgate-{version}.log",
                                   args=[*flags, "--fleet-listen", f"127.0.0.1:{port}",
                                         *policy],
                                   cwd=old_tree if version == "0.2.0" else None)
        started.append(proxy)
        return proxy

    try:
        order = ["0.2.0", "this build"] if first == "0.2.0" else ["this build", "0.2.0"]
        holder = sidecar(order[0])
        members.append(Member(holder.bootstrap, group_id, topic))
        wait_for(lambda: members[0].owned == {0, 1, 2, 3}, 60, f"{order[0]} to assign")
        follower = sidecar(order[1])
        members.append(Member(follower.bootstrap, group_id, topic))
        wait_for(lambda: all(m.owned for m in members)
                 and not (members[0].owned & members[1].owned)
                 and members[0].owned | members[1].owned == {0, 1, 2, 3},
                 60, "the two members to share the partitions")
        assert "holding the broker's group" in holder.log()
        assert "holding the broker's group" not in follower.log()  # it followed
        produce_records(kafka39.bootstrap, topic, 200)
        wait_for(lambda: sum(m.consumed for m in members) >= 200, 60,
                 "every record to be consumed")
        assert all(m.consumed for m in members), [m.consumed for m in members]
        assert not owned_twice(members), [m.history for m in members]
        if first == "this build":
            # the hand-back tells every sidecar that relays for the group (GroupReleasing,
            # fleet protocol 3): a 0.2.0 follower cannot be told, so it is refused, naming it
            released = subprocess.run(
                [sys.executable, "-m", "proxy.cli", "release", "--group", group_id,
                 "--bootstrap", holder.bootstrap], capture_output=True, text=True, timeout=60,
                check=False)
            assert released.returncode == 1, (released.stdout, released.stderr)
            assert "0.2.0" in released.stderr and "roll them first" in released.stderr, \
                released.stderr
            assert "holding the broker's group" in holder.log()  # nothing changed
            wait_for(lambda: all(m.owned for m in members), 30, "both members to go on")
        # the members commit what they consumed as they close (the one behind the follower
        # through it: relayed as before between these two versions, read at the broker)
        for m in members:
            m.stop.set()
            m.thread.join(15)
        assert committed_total(kafka39, group_id, topic, 4) == 200
    finally:
        for m in members:
            m.stop.set()
            m.thread.join(15)
        for proxy in started:
            proxy.stop()
