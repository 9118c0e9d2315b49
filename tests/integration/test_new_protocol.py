"""Unmodified KIP-848 clients (``group.protocol=consumer``) through groupgate in front of Kafka 3.9.

Every test runs twice with the same code: ``groupgate`` (the proxy in front of a Kafka 3.9
broker, whose coordinator only knows classic groups) and ``native`` (straight to a Kafka 4.4
broker with its own KIP-848 coordinator, the reference). Both use a 500 ms heartbeat interval
and a 6 s session timeout; the 4.4 broker has online migration disabled, which is the
behaviour the proxy gives classic clients of a coordinated group (they are refused).

Members are real clients in processes of their own (so that one can be SIGKILLed):
confluent-kafka consumers (``tests/integration/members.py``) and Kafka's Java
VerifiableConsumer. The zombie-commit test speaks the protocol itself (the codec of the
proxy encodes the requests) because no client library commits with a stale epoch on purpose.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.codec import messages
from proxy.codec.header import encode_request_header
from proxy.process import ProxyProcess
from tests.conftest import BrokerPool, _pooled
from tests.integration.conftest import StartProxy
from tests.integration.members import ConfluentMember, Member, owned_exactly_once, wait_until
from tests.integration.observe import PortWatcher
from tests.testbed.broker import KafkaBroker
from tests.testbed.tools import VerifiableConsumer, consumer_groups, parse_table

log = logging.getLogger("rdkafka")

HEARTBEAT_MS = 500
SESSION_MS = 6000
PROXY_FLAGS = ("--group-heartbeat-interval-ms", str(HEARTBEAT_MS),
               "--group-session-timeout-ms", str(SESSION_MS),
               "--group-metadata-refresh-ms", "1000")
NATIVE_KEY = "4.4-kip848"
NATIVE_PROPERTIES = {
    "group.consumer.session.timeout.ms": str(SESSION_MS),
    "group.consumer.min.session.timeout.ms": str(SESSION_MS),
    "group.consumer.migration.policy": "disabled",
}

# ------------------------------------------------------------------------------------------
# Targets: the proxy in front of 3.9, or 4.4 itself


@dataclass
class Target:
    name: str
    broker: KafkaBroker
    proxy: ProxyProcess | None

    @property
    def bootstrap(self) -> str:
        """Where clients connect: the proxy, or the native broker."""
        return self.proxy.bootstrap if self.proxy is not None else self.broker.bootstrap

    @property
    def tool_line(self) -> str:
        return "4.4"


@pytest.fixture(params=["3.9", pytest.param("4.4", marks=pytest.mark.slow)],
                ids=["groupgate", "native"])
def broker(request: pytest.FixtureRequest, broker_pool: BrokerPool) -> Iterator[KafkaBroker]:
    """3.9 (behind the proxy) or a 4.4 broker with KIP-848 timeouts matching the proxy's (the
    reference: the same tests on Kafka's own coordinator, with ``--run-slow``).

    Named ``broker`` so that the session's test ordering groups the tests by broker set."""
    key = "3.9" if request.param == "3.9" else NATIVE_KEY
    broker_pool.factories.setdefault(NATIVE_KEY, lambda d: KafkaBroker.start(
        "4.4", d, consumer_heartbeat_ms=HEARTBEAT_MS, properties=NATIVE_PROPERTIES))
    for cluster in _pooled(broker_pool, key):
        assert isinstance(cluster, KafkaBroker)
        yield cluster


@pytest.fixture
def target(broker: KafkaBroker, start_proxy: StartProxy) -> Target:
    if broker.line.native_consumer_protocol:
        return Target("native", broker, None)
    return Target("groupgate", broker, start_proxy(broker, *PROXY_FLAGS))


# ------------------------------------------------------------------------------------------
# Members: confluent-kafka ones in processes of their own, or Kafka's Java tool


class JavaMember(Member):
    def __init__(self, bootstrap: str, topic: str, group: str, *, assignor: str) -> None:
        super().__init__()
        self.tool = VerifiableConsumer("4.4", bootstrap, topic, group, group_protocol="consumer",
                                       group_remote_assignor=assignor)
        original = self.tool._on_event

        def relay(event: dict[str, Any]) -> None:
            original(event)
            self.on_event(event)

        self.tool._on_event = relay  # type: ignore[method-assign]
        self.tool.start()

    def kill(self) -> None:
        self.tool.kill()

    def stop(self) -> None:
        self.tool.stop()


MEMBER_KINDS = ["confluent-uniform", "confluent-range", "java-uniform"]


def make_member(kind: str, bootstrap: str, topic: str, group: str) -> Member:
    client, assignor = kind.split("-")
    if client == "java":
        return JavaMember(bootstrap, topic, group, assignor=assignor)
    return ConfluentMember(bootstrap, [topic], group, assignor=assignor)


# ------------------------------------------------------------------------------------------
# Group formation, a fourth member, a crashed member


@pytest.mark.parametrize("kind", MEMBER_KINDS)
def test_members_share_partitions_and_survive_join_and_crash(
        target: Target, topic: Callable[..., str], members: list[Member], kind: str) -> None:
    name = topic(target.broker, partitions=12)
    partitions = {(name, p) for p in range(12)}
    group = f"g-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        members.append(make_member(kind, target.bootstrap, name, group))
    wait_until(lambda: owned_exactly_once(members, partitions), "3 members owning all")
    before = [m.owned() for m in members]
    revoked_before = [set(m.revoked) for m in members]

    members.append(make_member(kind, target.bootstrap, name, group))
    wait_until(lambda: owned_exactly_once(members, partitions), "4 members owning all")
    for m, owned_then, revoked_then in zip(members[:3], before, revoked_before, strict=True):
        revoked_now = m.revoked - revoked_then
        now = m.owned()
        # a partition revoked from a member was not given back to it, and a member that
        # kept everything it had saw no revocation at all
        assert not revoked_now & now, f"{kind}: revoked and re-assigned {revoked_now & now}"
        if owned_then <= now:
            assert not revoked_now, f"{kind}: member kept {owned_then} but saw revocations"
    assert any(m.revoked - r for m, r in zip(members[:3], revoked_before, strict=True)), (
        "the fourth member got partitions without anyone giving any up")

    victim = members.pop(1)
    lost = victim.owned()
    victim.kill()
    wait_until(lambda: owned_exactly_once(members, partitions),
               "the crashed member's partitions to move (through the proxy its process is "
               "seen to go; on Kafka 4.4 its session times out)")
    assert lost <= set().union(*(m.owned() for m in members))


def test_regex_member_picks_up_a_topic_created_later(
        target: Target, topic: Callable[..., str], members: list[Member]) -> None:
    prefix = f"rx{uuid.uuid4().hex[:6]}"
    first = f"{prefix}-a"
    target.broker.create_topic(first, 2, 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    try:
        member = ConfluentMember(target.bootstrap, [f"^{prefix}-.*"], group)
        members.append(member)
        with PortWatcher(member.proc.pid) as watcher:
            wait_until(lambda: member.owned() == {(first, 0), (first, 1)}, "the first topic")
            second = f"{prefix}-b"
            target.broker.create_topic(second, 3, 1)
            wait_until(lambda: member.owned() == {(first, 0), (first, 1), (second, 0),
                                                  (second, 1), (second, 2)},
                       "the topic created later")
        if target.proxy is not None:
            # the group coordinator (FindCoordinator) and every broker came from the proxy
            assert watcher.seen and watcher.seen <= target.proxy.listener_ports(), watcher.seen
    finally:
        for t in (f"{prefix}-a", f"{prefix}-b"):
            with contextlib.suppress(Exception):  # clean-up only
                target.broker.delete_topic(t, timeout=15)


# ------------------------------------------------------------------------------------------
# Offset commit fencing, spoken on the wire


class Wire:
    """A minimal blocking Kafka connection for hand-made requests (codec of the proxy)."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.correlation = 0

    def request(self, api_key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        self.correlation += 1
        payload = (encode_request_header(api_key, version, self.correlation, "zombie-test")
                   + messages.encode_request(api_key, version, value))
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", self._read(4))
        frame = self._read(size)
        header = 4 if messages.response_header_version(api_key, version) == 0 else 5
        response, _ = messages.decode_response(api_key, version, frame, header)
        return response

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def coordinator_of(bootstrap: str, group: str) -> Wire:
    host, port = bootstrap.rsplit(":", 1)
    boot = Wire(host, int(port))
    try:
        for _ in range(100):
            found = boot.request(10, 3, {"key": group, "key_type": 0})
            if found["error_code"] == 0:
                return Wire(found["host"], found["port"])
            time.sleep(0.2)
    finally:
        boot.close()
    raise AssertionError("no coordinator found")


def ask_coordinator(bootstrap: str, group: str, api_key: int, version: int,
                    value: dict[str, Any]) -> dict[str, Any]:
    """One request to the coordinator of ``group`` (found through ``bootstrap``), on a
    connection of its own."""
    conn = coordinator_of(bootstrap, group)
    try:
        return conn.request(api_key, version, value)
    finally:
        conn.close()


class RawMember:
    """One KIP-848 member driven by hand: heartbeats only when the test says so."""

    def __init__(self, conn: Wire, group: str, topic: str) -> None:
        self.conn = conn
        self.group = group
        self.topic = topic
        self.member_id = uuid.uuid4().hex[:22]
        self.epoch = 0
        self.owned: dict[uuid.UUID, list[int]] = {}

    def heartbeat(self, owned: dict[uuid.UUID, list[int]] | None = None) -> dict[str, Any]:
        joining = self.epoch == 0
        report = self.owned if owned is None else owned
        response = self.conn.request(68, 1, {
            "group_id": self.group, "member_id": self.member_id, "member_epoch": self.epoch,
            "rebalance_timeout_ms": 60_000 if joining else -1,
            "subscribed_topic_names": [self.topic] if joining else None,
            "topic_partitions": [{"topic_id": t, "partitions": sorted(ps)}
                                 for t, ps in report.items()],
        })
        assert response["error_code"] == 0, response
        self.epoch = response["member_epoch"]
        if response["assignment"] is not None:
            self.assigned = {tp["topic_id"]: sorted(tp["partitions"])
                             for tp in response["assignment"]["topic_partitions"]}
        return response

    def partitions(self) -> set[int]:
        return {p for ps in getattr(self, "assigned", {}).values() for p in ps}

    def commit(self, epoch: int, partitions: list[int], offset: int) -> set[int]:
        response = self.conn.request(8, 9, {
            "group_id": self.group, "generation_id_or_member_epoch": epoch,
            "member_id": self.member_id, "group_instance_id": None,
            "topics": [{"name": self.topic, "partitions": [
                {"partition_index": p, "committed_offset": offset, "committed_metadata": ""}
                for p in partitions]}]})
        return {p["error_code"] for t in response["topics"] for p in t["partitions"]}


def test_zombie_commit_is_stale_while_the_owner_commits_across_epoch_bumps(
        target: Target, topic: Callable[..., str]) -> None:
    name = topic(target.broker, partitions=4)
    group = f"g-{uuid.uuid4().hex[:8]}"
    conn = coordinator_of(target.bootstrap, group)
    try:
        a = RawMember(conn, group, name)
        b = RawMember(conn, group, name)

        def settle_a() -> bool:
            a.heartbeat()
            a.owned = dict(a.assigned) if hasattr(a, "assigned") else {}
            return a.partitions() == {0, 1, 2, 3}

        wait_until(settle_a, "member A to own all four partitions")
        first_epoch = a.epoch
        assert a.commit(first_epoch, [0, 1, 2, 3], 5) == {0}

        # B joins: the group epoch moves on; A must give up two partitions.
        b.heartbeat()

        def a_reconciled() -> bool:
            a.heartbeat()
            if hasattr(a, "assigned"):
                a.owned = dict(a.assigned)  # revoke at once: report only what is assigned
            return a.epoch > first_epoch and len(a.partitions()) == 2

        wait_until(a_reconciled, "member A to reach the new epoch")
        kept = sorted(a.partitions())
        given_up = sorted({0, 1, 2, 3} - set(kept))

        def b_owns() -> bool:
            b.heartbeat()
            b.owned = dict(getattr(b, "assigned", {}))
            return b.partitions() == set(given_up)

        wait_until(b_owns, "member B to receive the released partitions")
        # The owner still commits with the epoch its partitions were assigned at: accepted.
        assert a.commit(first_epoch, kept, 7) == {0}
        # A zombie commit for partitions A no longer owns, at A's old epoch: rejected.
        assert a.commit(first_epoch, given_up, 9) == {113}  # STALE_MEMBER_EPOCH
        # B commits them at its epoch; A's current epoch commit of its own: both accepted.
        assert b.commit(b.epoch, given_up, 11) == {0}
        assert a.commit(a.epoch, kept, 12) == {0}
        for m in (a, b):
            conn.request(68, 1, {"group_id": group, "member_id": m.member_id,
                                 "member_epoch": -1})
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------
# Offsets survive removing the proxy; direct classic clients are refused meanwhile


def produce(bootstrap: str, name: str, count: int, start: int = 0) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "logger": log, "linger.ms": 5})
    for i in range(start, start + count):
        producer.produce(name, value=b"%d" % i, partition=i % 3)
    assert producer.flush(30) == 0


def test_classic_client_is_refused_while_coordinated_then_resumes_from_committed_offsets(
        target: Target, topic: Callable[..., str], members: list[Member]) -> None:
    name = topic(target.broker, partitions=3)
    group = f"g-{uuid.uuid4().hex[:8]}"
    produce(target.broker.bootstrap, name, 300)
    member = ConfluentMember(target.bootstrap, [name], group)
    members.append(member)
    wait_until(lambda: len(member.records) >= 300, "the new-protocol member to consume 300")

    # A classic consumer that bypasses the proxy and joins the broker directly.
    direct = ConfluentMember(target.broker.bootstrap, [name], group, protocol="classic")
    members.append(direct)
    wait_until(lambda: bool(direct.errors), "the direct classic consumer to be refused")
    assert "INCONSISTENT_GROUP_PROTOCOL" in {e["error"] for e in direct.errors}, direct.errors
    assert not direct.records and not direct.owned()
    direct.stop()

    member.stop()  # commits were made per record; close leaves the group
    committed: dict[tuple[str, int], int] = {}
    for t, p, o in member.records:
        committed[(t, p)] = max(committed.get((t, p), -1), o + 1)
    if target.proxy is not None:
        target.proxy.stop()  # leaves the broker's group: the downgrade
    produce(target.broker.bootstrap, name, 90, start=300)

    classic = ConfluentMember(target.broker.bootstrap, [name], group, protocol="classic")
    members.append(classic)
    wait_until(lambda: len(classic.records) >= 90, "the classic consumer to consume the rest")
    first: dict[tuple[str, int], int] = {}
    for t, p, o in classic.records:
        first.setdefault((t, p), o)
    assert first == committed, "the classic consumer did not resume at the committed offsets"
    assert not classic.errors


# ------------------------------------------------------------------------------------------
# Kafka's consumer-groups command


def test_consumer_groups_command_lists_and_describes_the_group(
        target: Target, topic: Callable[..., str], members: list[Member]) -> None:
    name = topic(target.broker, partitions=6)
    partitions = {(name, p) for p in range(6)}
    group = f"g-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        members.append(ConfluentMember(target.bootstrap, [name], group, assignor="uniform"))
    wait_until(lambda: owned_exactly_once(members, partitions), "3 members owning all")

    listed = consumer_groups(target.tool_line, target.bootstrap, "--list", "--type").stdout
    rows = [r for r in parse_table(listed) if r.get("GROUP") == group]
    assert len(rows) == 1, listed
    assert rows[0]["TYPE"].lower() == "consumer"

    def described() -> list[dict[str, str]]:
        out = consumer_groups(target.tool_line, target.bootstrap, "--describe", "--group",
                              group, "--state").stdout
        return parse_table(out)

    wait_until(lambda: described()[0].get("STATE") == "Stable", "the group to be Stable")
    state = described()[0]
    assert state["#MEMBERS"] == "3"
    assert state["ASSIGNMENT-STRATEGY"] == "uniform"

    out = consumer_groups(target.tool_line, target.bootstrap, "--describe", "--group", group,
                          "--members", "--verbose").stdout
    rows = [r for r in parse_table(out) if r.get("GROUP") == group]
    assert len(rows) == 3, out
    assigned = set()
    for row in rows:
        assert row["#PARTITIONS"] == "2", out
        assert row["CURRENT-EPOCH"] == row["TARGET-EPOCH"], out
        assert row["CURRENT-ASSIGNMENT"] == row["TARGET-ASSIGNMENT"], out
        topic_name, _, numbers = row["CURRENT-ASSIGNMENT"].rpartition(":")
        assigned |= {(topic_name, int(p)) for p in numbers.split(",")}
    assert assigned == partitions, out


# ------------------------------------------------------------------------------------------
# Topic metadata changes reach the assignment


def test_added_partitions_and_a_recreated_topic_reach_the_member(
        target: Target, topic: Callable[..., str], members: list[Member]) -> None:
    from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

    name = topic(target.broker, partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    member = ConfluentMember(target.bootstrap, [name], group)
    members.append(member)
    wait_until(lambda: member.owned() == {(name, 0), (name, 1)}, "the first two partitions")

    admin = target.broker.admin()
    admin.create_partitions([NewPartitions(name, 4)])[name].result(30)
    wait_until(lambda: member.owned() == {(name, p) for p in range(4)},
               "the partitions added later")

    target.broker.delete_topic(name)
    wait_until(lambda: not member.owned(), "the deleted topic's partitions to be revoked")
    target.broker.create_topic(name, 3, 1)
    wait_until(lambda: member.owned() == {(name, p) for p in range(3)},
               "the partitions of the recreated topic")


# ------------------------------------------------------------------------------------------
# Empty groups expire (the proxy's own policy: Kafka keeps empty groups until their offsets
# expire, so this runs against the proxy only)


def test_empty_group_expires_and_the_broker_group_is_released(
        kafka39: KafkaBroker, topic: Callable[..., str], start_proxy: StartProxy,
        members: list[Member]) -> None:
    proxy = start_proxy(kafka39, *PROXY_FLAGS, "--group-empty-expiry-ms", "3000")
    name = topic(kafka39, partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    member = ConfluentMember(proxy.bootstrap, [name], group)
    members.append(member)
    wait_until(lambda: len(member.owned()) == 2, "the member's assignment")

    def listed() -> dict[str, str]:
        out = consumer_groups("4.4", proxy.bootstrap, "--list", "--type", "--state").stdout
        rows = [r for r in parse_table(out) if r.get("GROUP") == group]
        assert len(rows) <= 1, out
        return rows[0] if rows else {}

    assert listed()["TYPE"].lower() == "consumer"
    member.stop()
    wait_until(lambda: listed().get("STATE") == "Empty", "the group to be Empty")
    # expired: the proxy left the broker's group, which is now the broker's empty classic group
    wait_until(lambda: listed().get("TYPE", "").lower() == "classic",
               "the group to expire from the proxy")
    assert "group " + group + ": expired" in proxy.log()
    direct = consumer_groups("4.4", kafka39.bootstrap, "--describe", "--group", group,
                             "--state").stdout
    assert parse_table(direct)[0]["STATE"] == "Empty", direct


# ------------------------------------------------------------------------------------------
# In front of a Kafka 4.x broker (decision record 0018, section 2)


@pytest.mark.slow
def test_in_front_of_kafka_4_a_direct_kip848_client_never_shares_a_coordinated_group(
        kafka4: KafkaBroker, start_proxy: StartProxy, topic: Callable[..., str],
        members: list[Member]) -> None:
    """Kafka 4.x converts a classic group on a consumer-protocol heartbeat when the policy,
    the protocol type and the size allow it; the lock member's assignment carries user data,
    which makes it refuse (GROUP_ID_NOT_FOUND): the direct client gets nothing, and the member
    behind groupgate keeps all partitions and keeps consuming."""
    proxy = start_proxy(kafka4, *PROXY_FLAGS)
    name = topic(kafka4, partitions=3)
    group = f"g-{uuid.uuid4().hex[:8]}"
    produce(kafka4.bootstrap, name, 300)
    member = ConfluentMember(f"{proxy.host}:{proxy.port}", [name], group)
    members.append(member)
    wait_until(lambda: len(member.records) >= 300, "the member behind groupgate to consume 300")
    assert len(member.owned()) == 3

    direct = ConfluentMember(kafka4.bootstrap, [name], group)
    members.append(direct)
    wait_until(lambda: bool(direct.errors), "the direct KIP-848 client to be refused")
    assert "GROUP_ID_NOT_FOUND" in {e["error"] for e in direct.errors}, direct.errors
    produce(kafka4.bootstrap, name, 90, start=300)
    wait_until(lambda: len(member.records) >= 390, "the member behind groupgate to go on")
    assert not direct.records and not direct.owned()
    assert len(member.owned()) == 3
