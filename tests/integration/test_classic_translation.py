"""Classic clients on the proxy's engine (``classic-translation``), in front of Kafka 3.9.

kafka-python consumers (classic protocol only) join groups through groupgate, whose engine
serves their JoinGroup / SyncGroup / Heartbeat / LeaveGroup as classic members of a KIP-848
group, and commit offsets that the proxy writes to the broker under its own membership:

* a group of three (range, roundrobin and cooperative-sticky): every partition owned exactly
  once, every record produced is consumed;
* a fourth cooperative member: the members that keep partitions revoke none of them (seen from
  the clients' own rebalance listener callbacks);
* a mixed group: two confluent-kafka ``group.protocol=consumer`` members and two kafka-python
  classic members share one group;
* a group whose broker-side group has members connected straight to the broker stays the
  broker's: a classic member joining through the proxy is sent there and shares it;
* a JoinGroup with protocol type ``connect`` (Kafka Connect) passes through to the broker,
  which answers it as the leader of its own classic group;
* a static member (``group.instance.id``, confluent-kafka classic) killed and restarted within
  its session timeout gets its partitions back and the other members see no callback at all.

Members run in processes of their own and report their rebalance callbacks and records as
JSON lines (``tests/integration/members.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from proxy.process import ProxyProcess
from tests.integration.conftest import StartProxy
from tests.integration.members import (
    SESSION_MS,
    ConfluentMember,
    KafkaPythonMember,
    Member,
    owned_exactly_once,
    wait_until,
)
from tests.integration.test_new_protocol import PROXY_FLAGS, ask_coordinator, coordinator_of
from tests.testbed.broker import KafkaBroker

FLAGS = (*PROXY_FLAGS, "--classic-translation", "on")


@pytest.fixture
def proxy(kafka39: KafkaBroker, start_proxy: StartProxy) -> ProxyProcess:
    return start_proxy(kafka39, *FLAGS)


CLASSIC, CONSUMER = 0, 1
"""ConsumerGroupDescribe v1 member types."""


def member_types(bootstrap: str, group: str) -> list[int]:
    """The engine's members of ``group`` by type (ConsumerGroupDescribe through the proxy)."""
    entry = described(bootstrap, group)
    assert entry["error_code"] == 0, entry
    return sorted(m["member_type"] for m in entry["members"])


def described(bootstrap: str, group: str) -> dict[str, Any]:
    """The group's entry in ConsumerGroupDescribe (v1) through ``bootstrap``."""
    entry: dict[str, Any] = ask_coordinator(bootstrap, group, 69, 1, {
        "group_ids": [group], "include_authorized_operations": False})["groups"][0]
    return entry


def produce(bootstrap: str, name: str, count: int, partitions: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce(name, value=b"%d" % i, partition=i % partitions)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_classic_members_form_a_group_and_consume_everything(
        kafka39: KafkaBroker, proxy: ProxyProcess, topic: Callable[..., str],
        members: list[Member], assignor: str) -> None:
    name = topic(kafka39, partitions=6)
    partitions = {(name, p) for p in range(6)}
    produce(kafka39.bootstrap, name, 120, 6)
    group = f"classic-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        members.append(KafkaPythonMember(proxy.bootstrap, [name], group, assignor))
    wait_until(lambda: owned_exactly_once(members, partitions), "3 classic members owning all")
    assert member_types(proxy.bootstrap, group) == [CLASSIC] * 3  # served by the engine

    def consumed() -> set[tuple[str, int, int]]:
        seen: set[tuple[str, int, int]] = set()
        for m in members:
            with m.lock:
                seen.update(m.records)
        return seen

    wait_until(lambda: len(consumed()) >= 120, "every record to be consumed")
    assert {(t, p) for t, p, _ in consumed()} == partitions
    assert {(p, o) for _, p, o in consumed()} == {(i % 6, i // 6) for i in range(120)}
    assert not any(m.errors for m in members)


def test_fourth_cooperative_member_takes_partitions_without_revoking_kept_ones(
        kafka39: KafkaBroker, proxy: ProxyProcess, topic: Callable[..., str],
        members: list[Member]) -> None:
    name = topic(kafka39, partitions=12)
    partitions = {(name, p) for p in range(12)}
    group = f"coop-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        members.append(KafkaPythonMember(proxy.bootstrap, [name], group, "cooperative-sticky"))
    wait_until(lambda: owned_exactly_once(members, partitions), "3 members owning all")
    before = [m.owned() for m in members]
    revoked_before = [set(m.revoked) for m in members]

    members.append(KafkaPythonMember(proxy.bootstrap, [name], group, "cooperative-sticky"))
    wait_until(lambda: owned_exactly_once(members, partitions), "4 members owning all")
    moved = set()
    for m, owned_then, revoked_then in zip(members[:3], before, revoked_before, strict=True):
        revoked_now = m.revoked - revoked_then
        now = m.owned()
        # only partitions that moved away were revoked: what a member kept never went
        # through its on_partitions_revoked callback
        assert not revoked_now & now, f"revoked and re-assigned {revoked_now & now}"
        assert revoked_now == owned_then - now, (revoked_now, owned_then, now)
        moved |= revoked_now
    assert moved == members[3].owned(), "the fourth member got exactly what the others released"


def test_new_protocol_and_classic_members_share_a_group(
        kafka39: KafkaBroker, proxy: ProxyProcess, topic: Callable[..., str],
        members: list[Member]) -> None:
    name = topic(kafka39, partitions=8)
    partitions = {(name, p) for p in range(8)}
    group = f"mixed-{uuid.uuid4().hex[:8]}"
    members.append(ConfluentMember(proxy.bootstrap, [name], group))
    members.append(KafkaPythonMember(proxy.bootstrap, [name], group, "cooperative-sticky"))
    members.append(ConfluentMember(proxy.bootstrap, [name], group))
    # (classic members of one group must share a protocol name, as at a Kafka broker)
    members.append(KafkaPythonMember(proxy.bootstrap, [name], group, "cooperative-sticky"))
    wait_until(lambda: owned_exactly_once(members, partitions),
               "2 new-protocol and 2 classic members owning all")
    assert member_types(proxy.bootstrap, group) == [CLASSIC, CLASSIC, CONSUMER, CONSUMER]
    assert not any(m.errors for m in members)


def test_group_with_direct_members_stays_the_brokers(
        kafka39: KafkaBroker, proxy: ProxyProcess, topic: Callable[..., str],
        members: list[Member]) -> None:
    name = topic(kafka39, partitions=4)
    partitions = {(name, p) for p in range(4)}
    group = f"direct-{uuid.uuid4().hex[:8]}"
    members.append(KafkaPythonMember(kafka39.bootstrap, [name], group, "range"))
    wait_until(lambda: owned_exactly_once(members, partitions), "the direct member owning all")
    members.append(KafkaPythonMember(proxy.bootstrap, [name], group, "range"))
    wait_until(lambda: owned_exactly_once(members, partitions),
               "the direct member and the member behind the proxy sharing the broker's group")
    entry = described(proxy.bootstrap, group)
    assert entry["error_code"] == 69, entry  # not an engine group


def test_connect_join_group_is_forwarded_to_the_broker(
        kafka39: KafkaBroker, proxy: ProxyProcess) -> None:
    group = f"connect-{uuid.uuid4().hex[:8]}"
    conn = coordinator_of(proxy.bootstrap, group)
    try:
        join: dict[str, Any] = {
            "group_id": group, "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
            "member_id": "", "group_instance_id": None, "protocol_type": "connect",
            "protocols": [{"name": "sessioned", "metadata": b"\x00\x01worker-config"}]}
        first = conn.request(11, 5, join)
        assert first["error_code"] == 79, first  # MEMBER_ID_REQUIRED, from the broker
        member_id = first["member_id"]
        second = conn.request(11, 5, dict(join, member_id=member_id))
        # Only the broker elects a leader and lists the members: the engine never does.
        assert second["error_code"] == 0, second
        assert second["leader"] == member_id
        assert [m["member_id"] for m in second["members"]] == [member_id]
        assert second["members"][0]["metadata"] == b"\x00\x01worker-config"
        # the proxy took nothing over: no engine group of that id
        described = conn.request(69, 0, {"group_ids": [group],
                                         "include_authorized_operations": False})
        assert described["groups"][0]["error_code"] == 69, described  # GROUP_ID_NOT_FOUND
        left = conn.request(13, 3, {"group_id": group, "members": [
            {"member_id": member_id, "group_instance_id": None}]})
        assert left["error_code"] == 0, left
    finally:
        conn.close()


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_static_member_bounce_moves_nothing(
        kafka39: KafkaBroker, proxy: ProxyProcess, topic: Callable[..., str],
        members: list[Member], assignor: str) -> None:
    name = topic(kafka39, partitions=6)
    partitions = {(name, p) for p in range(6)}
    group = f"static-{uuid.uuid4().hex[:8]}"

    def static(instance: str) -> ConfluentMember:
        return ConfluentMember(proxy.bootstrap, [name], group, protocol="classic", extra={
            "group.instance.id": instance, "partition.assignment.strategy": assignor})

    members.extend(static(f"pod-{i}") for i in range(3))
    wait_until(lambda: owned_exactly_once(members, partitions), "3 static members owning all")
    before = [m.owned() for m in members]
    events_before = [(set(m.revoked), m.owned()) for m in members]
    members[1].kill()  # a crash: no LeaveGroup; the session (6 s) keeps its place
    members[1] = static("pod-1")
    wait_until(lambda: members[1].owned() == before[1], "the bounced member's partitions back",
               timeout=SESSION_MS / 1000)
    assert owned_exactly_once(members, partitions)
    for i in (0, 2):
        # the others were never called back: nothing revoked, nothing new assigned
        assert (members[i].revoked, members[i].owned()) == events_before[i]
