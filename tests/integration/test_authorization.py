"""What the proxy answers or relays itself is authorized as the client's, as Kafka authorizes it.

On a test-bed Kafka 3.9 with a SASL_SSL listener, SCRAM users and the standard authorizer, two
groupgate sidecars in front with their own identity (``groupgate``: READ and DESCRIBE on every
group, DESCRIBE on every topic, tests/testbed/security.py), one coordinating the test's groups
(alice's KIP-848 member joins through it) and one following it; ``bob`` is given, per case, the
ACLs the case names. Requests are sent at the protocol level (the proxy's own client,
authenticating as bob with SCRAM), so every error code is the one a client library would see.
The same requests straight at Kafka 4.4's own KIP-848 coordinator, with the same ACLs, are the
reference (``slow``).

The matrix (:data:`CASES`): for every API the proxy answers and every one a follower relays,
bob's answers behind the coordinating sidecar and behind the follower (the two at once, each
on groups of its own) must be what Kafka 4.4 answers:

* ``no-read-on-the-group``: DESCRIBE only, on a prefix of group names (a prefixed ACL);
* ``no-describe-on-a-topic``: READ on every group (the wildcard), nothing on one topic;
* ``deny-over-allow``: ALL on the prefix, DENY ALL on one group of it;
* ``allowed``: a classic member of the KIP-848 group (JoinGroup, SyncGroup, Heartbeat,
  LeaveGroup), its commits and offsets, and OffsetDelete and DeleteGroups with DELETE;
* ``acl-removed``: a member in its group whose READ on the group, then on its topic, is
  removed: refused (behind the follower, its commit is refused by the broker at once);
* ``describe-on-the-cluster``: DESCRIBE on the cluster only: the group listed, not described.

Each case reads the offsets straight at the broker: nothing a refused client sent is written.
The proxies and the broker are shared by the cases (module-scoped), so the matrix costs a few
seconds per case. Then the cases that need a setting or a setup of their own: TxnOffsetCommit
and WRITE on its transactional id, DESCRIBE denied with DELETE allowed, regexes resolved under
the member's rights (behind either sidecar), and commits behind a follower whose answers
outlive the test (the broker decides them as the client's).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.config import ProxyConfig
from proxy.process import ProxyProcess
from proxy.security.policy import Security
from proxy.upstream import UpstreamClient
from tests.conftest import BrokerPool
from tests.integration.conftest import StartProxy, keep_if_failed
from tests.integration.test_security import produce, security_of, start_secured_proxy
from tests.testbed.broker import KafkaBroker, free_ports
from tests.testbed.security import PROXY_USER

GROUP_AUTH, TOPIC_AUTH = 30, 29
NON_EMPTY_GROUP, GROUP_SUBSCRIBED_TO_TOPIC, MEMBER_ID_REQUIRED = 68, 86, 79
REBALANCE_IN_PROGRESS = 27
TTL_MS = 2_000
"""``authorization-ttl-ms`` of the proxies here (shorter than the default, so that the test of
a removed ACL waits less)."""

Connect = Callable[[], Awaitable[UpstreamClient]]


def client_for(broker: KafkaBroker, user: str, address: tuple[str, int], *, tls: bool
               ) -> Connect:
    """Connections authenticated as ``user`` (SCRAM-SHA-256): over TLS straight at the broker,
    in plaintext to a proxy (which speaks TLS to the broker)."""
    security = security_of(broker)
    config = ProxyConfig(upstream=(address,),
                         security_protocol="SASL_SSL" if tls else "SASL_PLAINTEXT",
                         tls_ca_file=str(security.ca_file) if tls else "",
                         sasl_mechanism="SCRAM-SHA-256", sasl_username=user,
                         sasl_password=security.users[user])

    async def connect() -> UpstreamClient:
        return await UpstreamClient.connect(address, timeout=15, max_frame_bytes=16 << 20,
                                            security=Security(config))
    return connect


def address_of(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    return host, int(port)


@asynccontextmanager
async def connected(connect: Connect) -> AsyncIterator[UpstreamClient]:
    client = await connect()
    try:
        yield client
    finally:
        await client.aclose()


def heartbeat(group: str, topics: list[str] | None, member: str = "", epoch: int = 0
              ) -> dict[str, Any]:
    return {"group_id": group, "member_id": member, "member_epoch": epoch,
            "instance_id": None, "rack_id": None,
            "rebalance_timeout_ms": 30_000 if epoch == 0 else -1,
            "subscribed_topic_names": topics, "subscribed_topic_regex": None,
            "server_assignor": None, "topic_partitions": [] if epoch == 0 else None}


def join(group: str, topic: str, member: str = "") -> dict[str, Any]:
    metadata = messages.encode_data("ConsumerProtocolSubscription", 0, {"topics": [topic]})
    return {"group_id": group, "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
            "member_id": member, "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": metadata}]}


def commit(group: str, topics: list[str], member: str = "", epoch: int = -1,
           offset: int = 3) -> dict[str, Any]:
    return {"group_id": group, "generation_id_or_member_epoch": epoch, "member_id": member,
            "group_instance_id": None, "topics": [
                {"name": t, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                            "committed_leader_epoch": -1,
                                            "committed_metadata": ""}]} for t in topics]}


def partition_errors(answer: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in answer["topics"]:
        codes = {p["error_code"] for p in t["partitions"]}
        assert len(codes) == 1, t
        out[t["name"]] = codes.pop()
    return out


class Acls:
    """ACLs of this test on the broker, removed when it ends. Each change is waited for until
    the broker's authorizer shows it (DescribeAcls answers from the authorizer's own state)."""

    def __init__(self, broker: KafkaBroker) -> None:
        self.admin = broker.admin()
        self.bindings: list[Any] = []

    def add(self, principal: str, kind: str, name: str, pattern: str, operation: str,
            allow: bool = True) -> Any:
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        binding = AclBinding(ResourceType[kind], name, ResourcePatternType[pattern], principal,
                             "*", AclOperation[operation],
                             AclPermissionType.ALLOW if allow else AclPermissionType.DENY)
        if binding in self.bindings:
            return binding
        for future in self.admin.create_acls([binding]).values():
            future.result(timeout=30)
        self.bindings.append(binding)
        self._until(lambda shown: binding in shown)
        return binding

    def grant(self, principal: str, kind: str, name: str, pattern: str, *operations: str
              ) -> list[Any]:
        return [self.add(principal, kind, name, pattern, op) for op in operations]

    def remove(self, binding: Any) -> None:
        for future in self.admin.delete_acls([self._filter(binding)]).values():
            future.result(timeout=30)
        self.bindings.remove(binding)
        self._until(lambda shown: binding not in shown)

    def clear(self) -> None:
        for binding in list(self.bindings):
            self.remove(binding)

    @staticmethod
    def _filter(binding: Any) -> Any:
        from confluent_kafka.admin import AclBindingFilter

        return AclBindingFilter(binding.restype, binding.name, binding.resource_pattern_type,
                                binding.principal, binding.host, binding.operation,
                                binding.permission_type)

    def _until(self, done: Callable[[list[Any]], bool]) -> None:
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                 AclOperation.ANY, AclPermissionType.ANY)
        deadline = time.monotonic() + 30
        while True:
            shown = self.admin.describe_acls(every).result(timeout=30)
            if done(shown) or time.monotonic() > deadline:
                return
            time.sleep(0.05)


@contextmanager
def acls_of(broker: KafkaBroker) -> Iterator[Acls]:
    acls = Acls(broker)
    try:
        yield acls
    finally:
        acls.clear()


async def until(probe: Callable[[], Awaitable[Any]], done: Callable[[Any], bool],
                seconds: float = 30) -> Any:
    """``probe()`` again until ``done`` says so (a right given up reaches a proxy within its
    answers' lifetime; a group's assignment is computed in the background)."""
    deadline = time.monotonic() + seconds
    while True:
        result = await probe()
        if done(result) or time.monotonic() > deadline:
            return result
        await trio.sleep(0.2)


def committed(broker: KafkaBroker, group: str, topic: str) -> int:
    """The committed offset of ``group`` on partition 0 of ``topic``, read straight at the
    broker on its administration listener (-1001: none)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    admin = broker.admin()
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])
    result = admin.list_consumer_group_offsets([request])[group].result(timeout=30)
    return int(result.topic_partitions[0].offset)


async def coordinator_ready(broker: KafkaBroker) -> None:
    """Wait until the broker's group coordinator answers (a fresh broker creates and loads its
    offsets topic on the first FindCoordinator; until then groups get NOT_COORDINATOR)."""
    async with connected(client_for(broker, "alice", address_of(broker.secure_bootstrap),
                                    tls=True)) as client:
        found = await until(lambda: client.request(ApiKey.FIND_COORDINATOR, 4, {
            "key_type": 0, "coordinator_keys": ["warm-up"]}),
            lambda a: a["coordinators"][0]["error_code"] == 0, seconds=60)
        assert found["coordinators"][0]["error_code"] == 0, found
        described = await until(lambda: client.request(ApiKey.DESCRIBE_GROUPS, 5, {
            "groups": ["warm-up"], "include_authorized_operations": False}),
            lambda a: a["groups"][0]["error_code"] not in (14, 15, 16), seconds=60)
        assert described["groups"][0]["error_code"] == 0, described


def setup_names(broker: KafkaBroker, topic: Callable[..., str]) -> tuple[str, str, str]:
    readable = topic(broker, partitions=2)
    secret = topic(broker, partitions=1)
    produce(broker, readable, 20)
    return readable, secret, f"authz-{uuid.uuid4().hex[:8]}-"


async def assigned_member(client: UpstreamClient, group: str, topic_name: str
                          ) -> tuple[str, int]:
    """A KIP-848 member of ``group`` once it is assigned partitions of ``topic_name``."""
    member, epoch = str(uuid.uuid4()), 0

    async def beat() -> dict[str, Any]:
        nonlocal epoch
        value = dict(heartbeat(group, [topic_name] if epoch == 0 else None, member, epoch))
        answer = await client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, value)
        assert answer["error_code"] == 0, answer
        epoch = answer["member_epoch"]
        return answer

    await until(beat, lambda a: bool((a.get("assignment") or {}).get("topic_partitions")))
    return member, epoch


async def member_of(client: UpstreamClient, group: str, topics: list[str]
                    ) -> tuple[str, int]:
    """A KIP-848 member of ``group`` subscribed to ``topics``, once it is assigned some of
    them (Kafka 4.4 assigns in the background)."""
    member, epoch = str(uuid.uuid4()), 0

    async def beat() -> dict[str, Any]:
        nonlocal epoch
        answer = await client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, heartbeat(
            group, topics if epoch == 0 else None, member, epoch))
        assert answer["error_code"] == 0, answer
        epoch = answer["member_epoch"]
        return answer

    answer = await until(beat, lambda a: bool(
        (a.get("assignment") or {}).get("topic_partitions")))
    assert answer["assignment"]["topic_partitions"], answer
    return member, epoch


# -- the shared test bed: one broker, two sidecars --------------------------------------------


@dataclass
class Place:
    """Where bob's requests are sent from, and where alice's member makes the group."""

    name: str
    broker: KafkaBroker
    bob: Connect
    alice: Connect
    readable: str
    secret: str


@dataclass
class Bed:
    broker: KafkaBroker
    readable: str
    secret: str
    places: list[Place]
    logs: list[Path]


def _topics(broker: KafkaBroker) -> tuple[str, str]:
    stem = f"authz-{uuid.uuid4().hex[:6]}"
    readable, secret = f"{stem}-readable", f"{stem}-secret"
    broker.create_topic(readable, 2, 1)
    broker.create_topic(secret, 1, 1)
    produce(broker, readable, 20)
    return readable, secret


def _drop_topics(broker: KafkaBroker, *names: str) -> None:
    for name in names:
        with suppress(Exception):
            broker.delete_topic(name, timeout=15)


def _secured_proxy(broker: KafkaBroker, log: Path, *flags: str) -> ProxyProcess:
    return ProxyProcess.start(broker.secure_bootstrap, log, args=[
        *security_of(broker).proxy_flags(PROXY_USER), *flags])


@pytest.fixture(scope="module")
def fleet39(broker_pool: BrokerPool, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Bed]:
    """The secured Kafka 3.9 of the pool, two sidecars (``holder``: alice's members join
    through it, so it coordinates the groups; ``follower``), their topics."""
    key = "3.9-sasl-ssl"
    broker = broker_pool.acquire(key)
    assert isinstance(broker, KafkaBroker)
    base = tmp_path_factory.mktemp("authorization")
    started: list[ProxyProcess] = []
    readable, secret = _topics(broker)
    try:
        ports = free_ports(2)
        for name, port in zip(("holder", "follower"), ports, strict=True):
            started.append(_secured_proxy(broker, base / f"groupgate-{name}.log",
                                          "--fleet-listen", f"127.0.0.1:{port}",
                                          "--authorization-ttl-ms", str(TTL_MS)))
        holder, follower = (address_of(p.bootstrap) for p in started)
        alice = client_for(broker, "alice", holder, tls=False)
        places = [Place(name, broker, client_for(broker, "bob", address, tls=False), alice,
                        readable, secret)
                  for name, address in (("coordinating sidecar", holder),
                                        ("follower", follower))]
        yield Bed(broker, readable, secret, places, [p.log_file for p in started])
    finally:
        for proxy in started:
            proxy.stop()
        _drop_topics(broker, readable, secret)
        broker_pool.release(key)


@pytest.fixture(scope="module")
def reference44(broker_pool: BrokerPool) -> Iterator[Bed]:
    """The secured Kafka 4.4 of the pool: bob and alice straight at it."""
    key = "4.4-sasl-ssl"
    broker = broker_pool.acquire(key)
    assert isinstance(broker, KafkaBroker)
    readable, secret = _topics(broker)
    try:
        trio.run(coordinator_ready, broker)
        address = address_of(broker.secure_bootstrap)
        place = Place("kafka 4.4", broker, client_for(broker, "bob", address, tls=True),
                      client_for(broker, "alice", address, tls=True), readable, secret)
        yield Bed(broker, readable, secret, [place], [])
    finally:
        _drop_topics(broker, readable, secret)
        broker_pool.release(key)


@pytest.fixture
def fleet(request: pytest.FixtureRequest, secured_kafka39: KafkaBroker, fleet39: Bed
          ) -> Iterator[Bed]:
    """:func:`fleet39` for one test (the sidecars' logs kept if it fails)."""
    assert fleet39.broker is secured_kafka39
    yield fleet39
    keep_if_failed(request, fleet39.logs)


@pytest.fixture
def reference(secured_kafka4: KafkaBroker, reference44: Bed) -> Bed:
    assert reference44.broker is secured_kafka4
    return reference44


# -- the matrix -------------------------------------------------------------------------------


@dataclass
class Case:
    """One row of the matrix at one place: bob's ACLs for this case's groups are granted by
    the case itself (``prefix``: its groups' names start with it)."""

    place: Place
    acls: Acls
    prefix: str

    @property
    def bob(self) -> Connect:
        return self.place.bob

    def group(self, name: str) -> str:
        return self.prefix + name

    def written(self, group: str, topic: str) -> int | None:
        """The group's offset at the broker (None: none written)."""
        offset = committed(self.place.broker, group, topic)
        return None if offset < 0 else offset


async def group_apis(client: UpstreamClient, group: str, topic: str) -> dict[str, Any]:
    """bob's answers for ``group`` to every API the proxy answers or relays, as a client with
    no member in it sends them: the error codes."""
    out: dict[str, Any] = {}
    out["ConsumerGroupHeartbeat"] = (await client.request(
        ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat(group, [topic])))["error_code"]
    out["ConsumerGroupDescribe"] = [g["error_code"] for g in (await client.request(
        ApiKey.CONSUMER_GROUP_DESCRIBE, 0, {"group_ids": [group],
                                             "include_authorized_operations": True}))["groups"]]
    out["JoinGroup"] = (await client.request(ApiKey.JOIN_GROUP, 5, join(group, topic)))[
        "error_code"]
    out["SyncGroup"] = (await client.request(ApiKey.SYNC_GROUP, 3, {
        "group_id": group, "generation_id": 1, "member_id": "m", "group_instance_id": None,
        "assignments": []}))["error_code"]
    out["Heartbeat"] = (await client.request(ApiKey.HEARTBEAT, 4, {
        "group_id": group, "generation_id": 1, "member_id": "m",
        "group_instance_id": None}))["error_code"]
    out["LeaveGroup"] = (await client.request(ApiKey.LEAVE_GROUP, 3, {
        "group_id": group, "members": [{"member_id": "m", "group_instance_id": None}]}))[
        "error_code"]
    out["DescribeGroups"] = [g["error_code"] for g in (await client.request(
        ApiKey.DESCRIBE_GROUPS, 5, {"groups": [group],
                                    "include_authorized_operations": True}))["groups"]]
    listed = await client.request(ApiKey.LIST_GROUPS, 4, {"states_filter": []})
    out["ListGroups lists it"] = group in {g["group_id"] for g in listed["groups"]}
    out["OffsetCommit"] = partition_errors(await client.request(
        ApiKey.OFFSET_COMMIT, 9, commit(group, [topic])))
    fetched = await client.request(ApiKey.OFFSET_FETCH, 8, {"groups": [
        {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}]}],
        "require_stable": False})
    out["OffsetFetch"] = fetched["groups"][0]["error_code"]
    out["OffsetDelete"] = (await client.request(ApiKey.OFFSET_DELETE, 0, {
        "group_id": group, "topics": [{"name": topic, "partitions": [
            {"partition_index": 0}]}]}))["error_code"]
    out["DeleteGroups"] = [r["error_code"] for r in (await client.request(
        ApiKey.DELETE_GROUPS, 2, {"groups_names": [group]}))["results"]]
    return out


async def no_read_on_the_group(case: Case) -> dict[str, Any]:
    place, group = case.place, case.group("g")
    case.acls.grant("User:bob", "TOPIC", place.readable, "LITERAL", "READ", "DESCRIBE")
    # nothing on ``secret`` (WRITE, READ, DELETE or ALTER would imply DESCRIBE)
    case.acls.add("User:bob", "GROUP", case.prefix, "PREFIXED", "DESCRIBE")
    async with connected(place.alice) as alice:
        await member_of(alice, group, [place.readable])
        async with connected(case.bob) as bob:
            out = await group_apis(bob, group, place.readable)
    out["written"] = case.written(group, place.readable)
    return out


async def no_describe_on_a_topic(case: Case) -> dict[str, Any]:
    place, group = case.place, case.group("g")
    readable, secret = place.readable, place.secret
    case.acls.grant("User:bob", "TOPIC", readable, "LITERAL", "READ", "DESCRIBE")
    case.acls.grant("User:bob", "GROUP", "*", "LITERAL", "READ", "DELETE")  # the wildcard
    out: dict[str, Any] = {}
    async with connected(place.alice) as alice:
        await member_of(alice, group, [secret])  # the group is assigned the secret topic
        async with connected(case.bob) as bob:
            out["ConsumerGroupHeartbeat naming it"] = (await bob.request(
                ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat(group, [readable, secret])))[
                "error_code"]
            member, epoch = await member_of(bob, group, [readable])
            out["ConsumerGroupDescribe"] = [g["error_code"] for g in (await bob.request(
                ApiKey.CONSUMER_GROUP_DESCRIBE, 0, {
                    "group_ids": [group], "include_authorized_operations": True}))["groups"]]
            out["DescribeGroups"] = [g["error_code"] for g in (await bob.request(
                ApiKey.DESCRIBE_GROUPS, 5, {"groups": [group],
                                            "include_authorized_operations": True}))["groups"]]
            listed = await bob.request(ApiKey.LIST_GROUPS, 4, {"states_filter": []})
            out["ListGroups lists it"] = group in {g["group_id"] for g in listed["groups"]}
            out["OffsetCommit"] = _named(partition_errors(await bob.request(
                ApiKey.OFFSET_COMMIT, 9, commit(group, [readable, secret], member, epoch))),
                readable, secret)
            fetched = await bob.request(ApiKey.OFFSET_FETCH, 8, {"groups": [
                {"group_id": group, "topics": [{"name": t, "partition_indexes": [0]}
                                               for t in (readable, secret)]}],
                "require_stable": False})
            out["OffsetFetch"] = _named({t["name"]: t["partitions"][0]["error_code"]
                                         for t in fetched["groups"][0]["topics"]},
                                        readable, secret)
            every = await bob.request(ApiKey.OFFSET_FETCH, 8, {"groups": [
                {"group_id": group, "topics": None}], "require_stable": False})
            out["OffsetFetch of all topics"] = sorted(_name(t["name"], readable, secret)
                                                      for t in every["groups"][0]["topics"])
            mine = await bob.request(ApiKey.OFFSET_FETCH, 9, {"groups": [
                {"group_id": group, "member_id": member, "member_epoch": epoch,
                 "topics": [{"name": readable, "partition_indexes": [0]}]}],
                "require_stable": False})
            out["OffsetFetch as the member"] = [
                (p["error_code"], p["committed_offset"])
                for t in mine["groups"][0]["topics"] for p in t["partitions"]]
            deleted = await bob.request(ApiKey.OFFSET_DELETE, 0, {
                "group_id": group, "topics": [{"name": t, "partitions": [
                    {"partition_index": 0}]} for t in (readable, secret)]})
            out["OffsetDelete"] = (deleted["error_code"], _named(
                partition_errors(deleted), readable, secret))
            out["DeleteGroups"] = [r["error_code"] for r in (await bob.request(
                ApiKey.DELETE_GROUPS, 2, {"groups_names": [group]}))["results"]]
    out["written"] = (case.written(group, readable), case.written(group, secret))
    return out


async def deny_over_allow(case: Case) -> dict[str, Any]:
    place = case.place
    denied, allowed = case.group("denied"), case.group("open")
    case.acls.grant("User:bob", "TOPIC", place.readable, "LITERAL", "READ", "DESCRIBE")
    case.acls.add("User:bob", "GROUP", case.prefix, "PREFIXED", "ALL")
    case.acls.add("User:bob", "GROUP", denied, "LITERAL", "ALL", allow=False)
    async with connected(place.alice) as alice:
        await member_of(alice, denied, [place.readable])
        await member_of(alice, allowed, [place.readable])
        async with connected(case.bob) as bob:
            out: dict[str, Any] = {"denied": await group_apis(bob, denied, place.readable)}
            out["allowed: ConsumerGroupHeartbeat"] = (await bob.request(
                ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat(allowed, [place.readable])))[
                "error_code"]
            out["allowed: DescribeGroups"] = [g["error_code"] for g in (await bob.request(
                ApiKey.DESCRIBE_GROUPS, 5, {"groups": [allowed],
                                            "include_authorized_operations": False}))["groups"]]
    out["written"] = case.written(denied, place.readable)
    return out


async def classic_member(bob: UpstreamClient, group: str, topic: str) -> dict[str, Any]:
    """A classic member of the KIP-848 group: joined (MEMBER_ID_REQUIRED first), synced,
    heartbeating, committing, leaving; each step's error code."""
    out: dict[str, Any] = {}
    member, generation = "", -1
    first = await bob.request(ApiKey.JOIN_GROUP, 5, join(group, topic))
    out["JoinGroup without a member id"] = first["error_code"]
    member = first["member_id"]
    deadline = time.monotonic() + 30
    while True:
        joined = await bob.request(ApiKey.JOIN_GROUP, 5, join(group, topic, member))
        if joined["error_code"] == 0:
            generation = joined["generation_id"]
            synced = await bob.request(ApiKey.SYNC_GROUP, 3, {
                "group_id": group, "generation_id": generation, "member_id": member,
                "group_instance_id": None, "assignments": []})
            if synced["error_code"] != REBALANCE_IN_PROGRESS or time.monotonic() > deadline:
                break
        elif joined["error_code"] != REBALANCE_IN_PROGRESS or time.monotonic() > deadline:
            break
        await trio.sleep(0.2)
    out["JoinGroup"] = joined["error_code"]
    out["SyncGroup"] = synced["error_code"] if joined["error_code"] == 0 else None
    beat = await bob.request(ApiKey.HEARTBEAT, 4, {
        "group_id": group, "generation_id": generation, "member_id": member,
        "group_instance_id": None})
    # the group's target may have moved on since: Kafka asks the member to join again
    out["Heartbeat"] = "ok" if beat["error_code"] in (0, REBALANCE_IN_PROGRESS) else beat
    out["OffsetCommit"] = list(partition_errors(await bob.request(
        ApiKey.OFFSET_COMMIT, 9, commit(group, [topic], member, generation))).values())
    left = await bob.request(ApiKey.LEAVE_GROUP, 3, {
        "group_id": group, "members": [{"member_id": member, "group_instance_id": None}]})
    out["LeaveGroup"] = (left["error_code"], [m["error_code"] for m in left["members"]])
    return out


async def allowed(case: Case) -> dict[str, Any]:
    place, group = case.place, case.group("g")
    empty = case.group("empty")
    readable = place.readable
    case.acls.grant("User:bob", "TOPIC", readable, "LITERAL", "READ", "DESCRIBE")
    case.acls.grant("User:bob", "TOPIC", place.secret, "LITERAL", "READ", "DESCRIBE")
    case.acls.grant("User:bob", "GROUP", case.prefix, "PREFIXED", "READ", "DELETE")
    out: dict[str, Any] = {}
    async with connected(place.alice) as alice:
        await member_of(alice, group, [place.secret])  # bob's member gets the readable topic
        alice_empty, _epoch = await member_of(alice, empty, [readable])
        left = await alice.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat(
            empty, None, alice_empty, -1))
        assert left["error_code"] == 0, left
        async with connected(case.bob) as bob:
            out["classic member"] = await classic_member(bob, group, readable)
            out["written"] = case.written(group, readable)
            fetched = await bob.request(ApiKey.OFFSET_FETCH, 8, {"groups": [
                {"group_id": group, "topics": [{"name": readable, "partition_indexes": [0]}]}],
                "require_stable": False})
            out["OffsetFetch"] = [(p["error_code"], p["committed_offset"])
                                  for t in fetched["groups"][0]["topics"]
                                  for p in t["partitions"]]
            # the error codes (Kafka 4.4 shows a KIP-848 group in DescribeGroups before v6 as
            # Dead without members; the proxy shows its members in the classic shape, for the
            # tools that only speak DescribeGroups: proxy/coordination/listing.py)
            out["DescribeGroups"] = [g["error_code"] for g in (await bob.request(
                ApiKey.DESCRIBE_GROUPS, 5, {"groups": [group],
                                            "include_authorized_operations": False}))["groups"]]
            # the empty group: offsets of a topic it never subscribed to deleted, then the
            # group itself (through the proxy, its member in the broker's group keeps
            # advertising the topics the group subscribed to when it was taken over, so that
            # the broker keeps their offsets (KIP-211): docs/security.md, the parity table)
            secret = place.secret
            assert partition_errors(await alice.request(ApiKey.OFFSET_COMMIT, 9, commit(
                empty, [secret]))) == {secret: 0}
            deleted = await until(lambda: bob.request(ApiKey.OFFSET_DELETE, 0, {
                "group_id": empty, "topics": [{"name": secret, "partitions": [
                    {"partition_index": 0}]}]}), lambda a: a["error_code"] not in (14, 15, 16))
            out["OffsetDelete of the empty group"] = (deleted["error_code"],
                                                      list(partition_errors(deleted).values()))
            out["offset after OffsetDelete"] = case.written(empty, secret)
            gone = await until(lambda: bob.request(ApiKey.DELETE_GROUPS, 2, {
                "groups_names": [empty]}), lambda a: a["results"][0]["error_code"] == 0)
            out["DeleteGroups of the empty group"] = [r["error_code"] for r in gone["results"]]
            out["DeleteGroups of the group with members"] = [r["error_code"] for r in (
                await bob.request(ApiKey.DELETE_GROUPS, 2, {"groups_names": [group]}))[
                "results"]]
    return out


async def acl_removed(case: Case) -> dict[str, Any]:
    """bob's member commits; its READ on the group is removed while it is in the group: its
    heartbeats are refused (the proxy within its answers' lifetime, Kafka at once), and so is
    its next commit; with READ on the group again and READ on its topic removed, its commit
    is refused for the topic. Nothing of the refused commits is written."""
    place, group = case.place, case.group("g")
    readable = f"{case.prefix}topic"  # its READ is removed: a topic of this place's own
    place.broker.create_topic(readable, 1, 1)
    try:
        return await _acl_removed(case, group, readable)
    finally:
        _drop_topics(place.broker, readable)


async def _acl_removed(case: Case, group: str, readable: str) -> dict[str, Any]:
    place = case.place
    case.acls.add("User:bob", "TOPIC", readable, "LITERAL", "DESCRIBE")
    topic_read = case.acls.add("User:bob", "TOPIC", readable, "LITERAL", "READ")
    group_read = case.acls.add("User:bob", "GROUP", case.prefix, "PREFIXED", "READ")
    out: dict[str, Any] = {}
    async with connected(place.alice) as alice:
        await member_of(alice, group, [place.secret])  # the group is alice's sidecar's
        async with connected(case.bob) as bob:
            member, epoch = await member_of(bob, group, [readable])

            async def beat() -> int:
                nonlocal epoch
                answer = await bob.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                           heartbeat(group, None, member, epoch))
                epoch = answer["member_epoch"] if answer["error_code"] == 0 else epoch
                return int(answer["error_code"])

            async def commit_at(offset: int) -> dict[str, int]:
                return partition_errors(await bob.request(ApiKey.OFFSET_COMMIT, 9, commit(
                    group, [readable], member, epoch, offset)))

            out["commit"] = await commit_at(3) == {readable: 0}
            out["written"] = case.written(group, readable)
            case.acls.remove(group_read)
            out["heartbeat after READ on the group is removed"] = await until(
                beat, lambda code: code == GROUP_AUTH, seconds=TTL_MS / 1000 + 20)
            out["commit after READ on the group is removed"] = list(
                (await commit_at(5)).values())
            out["written after"] = case.written(group, readable)
            case.acls.add("User:bob", "GROUP", case.prefix, "PREFIXED", "READ")
            await until(beat, lambda code: code == 0, seconds=TTL_MS / 1000 + 20)
            case.acls.remove(topic_read)
            refused = await until(lambda: commit_at(7), lambda e: e != {readable: 0},
                                  seconds=TTL_MS / 1000 + 20)
            out["commit after READ on the topic is removed"] = list(refused.values())
            out["written at the end"] = case.written(group, readable)
    return out


def _name(topic: str, readable: str, secret: str) -> str:
    return {readable: "readable", secret: "secret"}.get(topic, topic)


def _named(codes: dict[str, int], readable: str, secret: str) -> dict[str, int]:
    return {_name(t, readable, secret): c for t, c in codes.items()}


REFUSED_EVERYWHERE = {
    "ConsumerGroupHeartbeat": GROUP_AUTH, "ConsumerGroupDescribe": [GROUP_AUTH],
    "JoinGroup": GROUP_AUTH, "SyncGroup": GROUP_AUTH, "Heartbeat": GROUP_AUTH,
    "LeaveGroup": GROUP_AUTH, "DescribeGroups": [GROUP_AUTH], "ListGroups lists it": False,
    "OffsetCommit": {}, "OffsetFetch": GROUP_AUTH, "OffsetDelete": GROUP_AUTH,
    "DeleteGroups": [GROUP_AUTH]}

CASES: dict[str, tuple[Callable[[Case], Awaitable[dict[str, Any]]], dict[str, Any]]] = {
    "no-read-on-the-group": (no_read_on_the_group, {
        # DESCRIBE without READ: described, listed and its offsets read; never joined,
        # committed to, deleted from
        "ConsumerGroupHeartbeat": GROUP_AUTH, "ConsumerGroupDescribe": [0],
        "JoinGroup": GROUP_AUTH, "SyncGroup": GROUP_AUTH, "Heartbeat": GROUP_AUTH,
        "LeaveGroup": GROUP_AUTH, "DescribeGroups": [0], "ListGroups lists it": True,
        "OffsetCommit": {"topic": GROUP_AUTH}, "OffsetFetch": 0, "OffsetDelete": GROUP_AUTH,
        "DeleteGroups": [GROUP_AUTH], "written": None}),
    "no-describe-on-a-topic": (no_describe_on_a_topic, {
        # the group's assignment names the secret topic: ConsumerGroupDescribe replaces it
        # (KAFKA-18813); the topic is refused wherever it is named, and filtered where it is
        # not
        "ConsumerGroupHeartbeat naming it": TOPIC_AUTH, "ConsumerGroupDescribe": [TOPIC_AUTH],
        "DescribeGroups": [0], "ListGroups lists it": True,
        "OffsetCommit": {"readable": 0, "secret": TOPIC_AUTH},
        "OffsetFetch": {"readable": 0, "secret": TOPIC_AUTH},
        "OffsetFetch of all topics": ["readable"], "OffsetFetch as the member": [(0, 3)],
        "OffsetDelete": (0, {"readable": GROUP_SUBSCRIBED_TO_TOPIC, "secret": TOPIC_AUTH}),
        "DeleteGroups": [NON_EMPTY_GROUP], "written": (3, None)}),
    "deny-over-allow": (deny_over_allow, {
        "denied": {**REFUSED_EVERYWHERE, "OffsetCommit": {"topic": GROUP_AUTH}},
        "allowed: ConsumerGroupHeartbeat": 0, "allowed: DescribeGroups": [0],
        "written": None}),
    "allowed": (allowed, {
        "classic member": {"JoinGroup without a member id": MEMBER_ID_REQUIRED, "JoinGroup": 0,
                           "SyncGroup": 0, "Heartbeat": "ok", "OffsetCommit": [0],
                           "LeaveGroup": (0, [0])},
        "written": 3, "OffsetFetch": [(0, 3)], "DescribeGroups": [0],
        "OffsetDelete of the empty group": (0, [0]), "offset after OffsetDelete": None,
        "DeleteGroups of the empty group": [0],
        "DeleteGroups of the group with members": [NON_EMPTY_GROUP]}),
    "acl-removed": (acl_removed, {
        "commit": True, "written": 3,
        "heartbeat after READ on the group is removed": GROUP_AUTH,
        "commit after READ on the group is removed": [GROUP_AUTH], "written after": 3,
        "commit after READ on the topic is removed": [TOPIC_AUTH], "written at the end": 3}),
}
"""Per case: what it does at one place, and what Kafka 4.4 answers bob (and the proxy must,
behind either sidecar)."""


def _topic_free(got: dict[str, Any], topic: str) -> dict[str, Any]:
    """``got`` with the topic's name replaced by ``topic`` (the expectations do not name it)."""
    out: dict[str, Any] = {}
    for key, value in got.items():
        if isinstance(value, dict) and key == "OffsetCommit":
            value = {"topic" if name == topic else name: code for name, code in value.items()}
        elif isinstance(value, dict):
            value = _topic_free(value, topic)
        out[key] = value
    return out


async def _run_case(bed: Bed, name: str) -> dict[str, dict[str, Any]]:
    scenario, _expected = CASES[name]
    results: dict[str, dict[str, Any]] = {}
    with acls_of(bed.broker) as acls:
        async def at(place: Place) -> None:
            prefix = f"authz-{name}-{uuid.uuid4().hex[:6]}-"
            results[place.name] = _topic_free(await scenario(Case(place, acls, prefix)),
                                              place.readable)

        async with trio.open_nursery() as nursery:
            for place in bed.places:
                nursery.start_soon(at, place)
    return results


# -- cases with a setup of their own ---------------------------------------------------------


def txn_commit(txn: str, group: str, topics: list[str], producer: tuple[int, int],
               member: tuple[str, int]) -> dict[str, Any]:
    value = commit(group, topics, *member)
    del value["generation_id_or_member_epoch"]
    return dict(value, transactional_id=txn, producer_id=producer[0],
                producer_epoch=producer[1], generation_id_or_member_epoch=member[1])


async def txn_offsets(client: UpstreamClient, value: dict[str, Any]) -> dict[str, int]:
    return partition_errors(await client.request(ApiKey.TXN_OFFSET_COMMIT, 3, value))


async def in_a_transaction(client: UpstreamClient, txn: str, group: str
                           ) -> tuple[int, int]:
    """A producer of ``txn`` with ``group``'s offsets added to its transaction, as a producer
    does it: the transaction coordinator found first (a fresh broker creates its transaction
    state topic then; until it is loaded, InitProducerId answers NOT_COORDINATOR)."""
    found = await until(lambda: client.request(ApiKey.FIND_COORDINATOR, 4, {
        "key_type": 1, "coordinator_keys": [txn]}),
        lambda a: a["coordinators"][0]["error_code"] == 0, seconds=60)
    assert found["coordinators"][0]["error_code"] == 0, found
    started = await until(lambda: client.request(ApiKey.INIT_PRODUCER_ID, 4, {
        "transactional_id": txn, "transaction_timeout_ms": 30_000, "producer_id": -1,
        "producer_epoch": -1}), lambda a: a["error_code"] == 0, seconds=60)
    assert started["error_code"] == 0, started
    producer = (started["producer_id"], started["producer_epoch"])
    added = await until(lambda: client.request(ApiKey.ADD_OFFSETS_TO_TXN, 3, {
        "transactional_id": txn, "producer_id": producer[0], "producer_epoch": producer[1],
        "group_id": group}), lambda a: a["error_code"] == 0)
    assert added["error_code"] == 0, added
    return producer


async def end_transaction(client: UpstreamClient, txn: str, producer: tuple[int, int],
                          broker: KafkaBroker, group: str, topic: str) -> int | None:
    """Commit the transaction; the group's offset at the broker once its marker landed
    (after EndTxn's answer)."""
    ended = await client.request(ApiKey.END_TXN, 3, {
        "transactional_id": txn, "producer_id": producer[0], "producer_epoch": producer[1],
        "committed": True})
    assert ended["error_code"] == 0, ended
    deadline = time.monotonic() + 30
    while (offset := committed(broker, group, topic)) < 0 and time.monotonic() < deadline:
        await trio.sleep(0.2)
    return None if offset < 0 else offset


async def txn_write(case: Case) -> dict[str, Any]:
    """bob, READ on the groups and the topic: TxnOffsetCommit without WRITE on its
    transactional id (also to a group alice's member is in, on which bob is denied READ),
    then with it inside a real transaction."""
    place, readable = case.place, case.place.readable
    group, txn, denied = case.group("txn"), case.group("txn-id"), case.group("txn-denied")
    case.acls.grant("User:bob", "TOPIC", readable, "LITERAL", "READ", "DESCRIBE")
    case.acls.add("User:bob", "GROUP", case.prefix, "PREFIXED", "READ")
    out: dict[str, Any] = {}
    async with connected(place.alice) as alice:
        await member_of(alice, denied, [readable])
        await member_of(alice, group, [place.secret])  # the group is alice's sidecar's
    case.acls.add("User:bob", "GROUP", denied, "LITERAL", "READ", allow=False)
    async with connected(case.bob) as bob:
        member = await member_of(bob, group, [readable])
        out["without WRITE"] = list((await txn_offsets(bob, txn_commit(
            txn, group, [readable], (7, 0), member))).values())
        out["without WRITE or READ on the group"] = list((await txn_offsets(bob, txn_commit(
            txn, denied, [readable], (7, 0), member))).values())
        case.acls.add("User:bob", "TRANSACTIONAL_ID", txn, "LITERAL", "WRITE")
        producer = await in_a_transaction(bob, txn, group)
        # a refusal the proxy still holds is believed for its answers' lifetime
        out["with WRITE"] = list((await until(lambda: txn_offsets(bob, txn_commit(
            txn, group, [readable], producer, member)), lambda e: e != {readable: 53})).values())
        out["written"] = await end_transaction(bob, txn, producer, place.broker, group,
                                               readable)
    return out


async def deny_describe_allow_delete(case: Case) -> dict[str, Any]:
    """bob is denied DESCRIBE on a group alice's member left empty, and allowed DELETE on
    it: DescribeGroups refuses, DeleteGroups deletes (each API checks its own operation)."""
    place, group = case.place, case.group("deletable")
    async with connected(place.alice) as alice:
        member, _epoch = await member_of(alice, group, [place.readable])
        left = await alice.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat(
            group, None, member, -1))
        assert left["error_code"] == 0, left
    case.acls.add("User:bob", "GROUP", case.prefix, "PREFIXED", "DELETE")
    case.acls.add("User:bob", "GROUP", group, "LITERAL", "DESCRIBE", allow=False)
    async with connected(case.bob) as bob:
        out: dict[str, Any] = {}
        described = await bob.request(ApiKey.DESCRIBE_GROUPS, 5, {
            "groups": [group], "include_authorized_operations": True})
        out["DescribeGroups"] = [g["error_code"] for g in described["groups"]]
        deleted = await until(lambda: bob.request(ApiKey.DELETE_GROUPS, 2, {
            "groups_names": [group]}), lambda a: a["results"][0]["error_code"] != GROUP_AUTH)
        out["DeleteGroups"] = [r["error_code"] for r in deleted["results"]]
    return out


async def regex_assignment(client: UpstreamClient, group: str, regex: str) -> set[uuid.UUID]:
    """The topics bob's member subscribing to ``regex`` is assigned, once it is assigned
    anything (Kafka 4.4 resolves a regex in the background, so not in the joining answer)."""
    member, epoch = str(uuid.uuid4()), 0
    assigned: set[uuid.UUID] = set()

    async def beat() -> set[uuid.UUID]:
        nonlocal epoch
        value = dict(heartbeat(group, None, member, epoch),
                     subscribed_topic_regex=regex if epoch == 0 else None)
        answer = await client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, value)
        assert answer["error_code"] == 0, answer
        epoch = answer["member_epoch"]
        if answer.get("assignment") is not None:
            assigned.clear()
            assigned.update(tp["topic_id"] for tp in answer["assignment"]["topic_partitions"])
        return assigned

    await until(beat, bool)
    return assigned


async def topic_ids(client: UpstreamClient, names: list[str]) -> dict[str, uuid.UUID]:
    answer = await client.request(ApiKey.METADATA, 12, {
        "topics": [{"topic_id": uuid.UUID(int=0), "name": n} for n in names],
        "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
    return {t["name"]: t["topic_id"] for t in answer["topics"]}


async def regex_rights(case: Case) -> dict[str, Any]:
    """bob may READ and DESCRIBE ``open`` only, READ the case's groups: his regex matching
    both ``open`` and ``secret`` gets him ``open``'s partitions, never ``secret``'s, also in a
    group another member (alice's, through the coordinating sidecar) made first."""
    place, group = case.place, case.group("regex")
    stem = f"rx-{uuid.uuid4().hex[:8]}-"
    open_topic, secret = stem + "open", stem + "secret"
    for name in (open_topic, secret):
        place.broker.create_topic(name, 2, 1)
    try:
        case.acls.grant("User:bob", "TOPIC", open_topic, "LITERAL", "READ", "DESCRIBE")
        case.acls.add("User:bob", "GROUP", case.prefix, "PREFIXED", "READ")
        async with connected(place.alice) as alice:
            ids = await topic_ids(alice, [open_topic, secret])
            await member_of(alice, group, [place.readable])
            async with connected(case.bob) as bob:
                assigned = await regex_assignment(bob, group, stem + ".*")
        return {"assigned": sorted({ids[open_topic]: "open", ids[secret]: "secret"}.get(
            t, str(t)) for t in assigned)}
    finally:
        _drop_topics(place.broker, open_topic, secret)


async def describe_on_the_cluster(case: Case) -> dict[str, Any]:
    """bob may DESCRIBE the cluster and nothing on the case's groups: ListGroups lists the
    group (Kafka lists every group to a principal with DESCRIBE on the cluster, without
    filtering), and describing it is still refused."""
    place, group = case.place, case.group("g")
    case.acls.add("User:bob", "BROKER", "kafka-cluster", "LITERAL", "DESCRIBE")
    out: dict[str, Any] = {}
    async with connected(place.alice) as alice:
        await member_of(alice, group, [place.readable])
        async with connected(case.bob) as bob:
            listed = await until(lambda: bob.request(ApiKey.LIST_GROUPS, 4, {
                "states_filter": []}), lambda a: group in {g["group_id"] for g in a["groups"]})
            out["ListGroups lists it"] = group in {g["group_id"] for g in listed["groups"]}
            out["DescribeGroups"] = [g["error_code"] for g in (await bob.request(
                ApiKey.DESCRIBE_GROUPS, 5, {"groups": [group],
                                            "include_authorized_operations": True}))["groups"]]
            out["ConsumerGroupDescribe"] = [g["error_code"] for g in (await bob.request(
                ApiKey.CONSUMER_GROUP_DESCRIBE, 0, {
                    "group_ids": [group], "include_authorized_operations": True}))["groups"]]
    return out


CASES.update({
    "describe-on-the-cluster": (describe_on_the_cluster, {
        "ListGroups lists it": True, "DescribeGroups": [GROUP_AUTH],
        "ConsumerGroupDescribe": [GROUP_AUTH]}),
    "txn-needs-write-on-its-transactional-id": (txn_write, {
        # WRITE on the transactional id is checked before READ on the group (the proxy
        # answered GROUP_AUTHORIZATION_FAILED before); with it, the transactional commit lands
        "without WRITE": [53], "without WRITE or READ on the group": [53], "with WRITE": [0],
        "written": 3}),
    "deny-describe-allow-delete": (deny_describe_allow_delete, {
        "DescribeGroups": [GROUP_AUTH], "DeleteGroups": [0]}),
    "regex-under-the-members-rights": (regex_rights, {"assigned": ["open"]}),
})


@pytest.mark.parametrize("name", list(CASES))
async def test_every_api_behind_either_sidecar_answers_as_kafka_4_4(fleet: Bed,
                                                                   name: str) -> None:
    """One row of the matrix, behind the coordinating sidecar and behind the follower at
    once (groups of their own), on Kafka 3.9: bob gets what Kafka 4.4 answers him."""
    results = await _run_case(fleet, name)
    expected = CASES[name][1]
    for place, got in results.items():
        assert got == expected, (place, got)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
async def test_kafka_4_4_answers_the_matrix(reference: Bed, name: str) -> None:
    """The reference: the same row straight at Kafka 4.4's own coordinator."""
    results = await _run_case(reference, name)
    assert results["kafka 4.4"] == CASES[name][1], results


# -- commits behind a follower whose answers outlive the test ---------------------------------


LONG_TTL_MS = 600_000
"""The follower's ``authorization-ttl-ms`` here: its answers outlive the test, so what decides
a commit is the broker checking the client's own request."""


async def test_a_followers_commits_are_authorized_by_the_broker_as_the_client(
        secured_kafka39: KafkaBroker, topic: Callable[..., str],
        start_proxy: StartProxy) -> None:
    """bob's member sits behind a follower whose answers live 10 minutes. Its commit lands
    (read straight at the broker); with its READ on the topic removed, its next commit is
    refused by the broker with TOPIC_AUTHORIZATION_FAILED, although the follower still holds
    the answer that allowed it, and nothing is written; with the proxies' own identity denied
    READ on the topic, bob's commit still lands; and its TxnOffsetCommit lands inside a
    transaction with WRITE on the transactional id granted to bob only. It reached the broker
    as bob's, never as the proxy's (before: relayed and written by the holder as the proxy, so
    the refused commit landed, the allowed one was refused, and the TxnOffsetCommit was
    refused, 53)."""
    broker = secured_kafka39
    readable, secret, prefix = setup_names(broker, topic)
    group, txn_group, txn = prefix + "relayed", prefix + "relayed-txn", prefix + "txn-id"
    fleet_a, fleet_b = free_ports(2)
    holder = start_secured_proxy(start_proxy, broker, "--fleet-listen", f"127.0.0.1:{fleet_a}")
    follower = start_secured_proxy(start_proxy, broker, "--fleet-listen",
                                   f"127.0.0.1:{fleet_b}", "--authorization-ttl-ms",
                                   str(LONG_TTL_MS))
    alice = client_for(broker, "alice", address_of(holder.bootstrap), tls=False)
    bob = client_for(broker, "bob", address_of(follower.bootstrap), tls=False)
    with acls_of(broker) as acls:
        acls.add("User:bob", "TOPIC", readable, "LITERAL", "DESCRIBE")
        read = acls.add("User:bob", "TOPIC", readable, "LITERAL", "READ")
        acls.add("User:bob", "GROUP", prefix, "PREFIXED", "READ")
        acls.add("User:bob", "TRANSACTIONAL_ID", txn, "LITERAL", "WRITE")
        async with connected(alice) as owner:
            # alice's members (subscribed to the other topic, so nothing of bob's topic is
            # theirs) make the holder coordinate both groups
            await member_of(owner, group, [secret])
            await member_of(owner, txn_group, [secret])
            async with connected(bob) as client:
                member = await member_of(client, group, [readable])

                async def commit_at(offset: int) -> dict[str, int]:
                    return partition_errors(await client.request(
                        ApiKey.OFFSET_COMMIT, 9, commit(group, [readable], *member, offset)))

                assert await commit_at(3) == {readable: 0}
                assert committed(broker, group, readable) == 3  # progress: it commits

                acls.remove(read)
                refused = await until(lambda: commit_at(5), lambda e: e != {readable: 0})
                assert refused == {readable: TOPIC_AUTH}
                assert committed(broker, group, readable) == 3  # nothing of the refusal

                acls.add("User:bob", "TOPIC", readable, "LITERAL", "READ")
                acls.add(f"User:{PROXY_USER}", "TOPIC", readable, "LITERAL", "READ",
                         allow=False)
                landed = await until(lambda: commit_at(7), lambda e: e == {readable: 0})
                assert landed == {readable: 0}
                assert committed(broker, group, readable) == 7

                txn_member = await member_of(client, txn_group, [readable])
                producer = await in_a_transaction(client, txn, txn_group)
                got = await txn_offsets(client, txn_commit(txn, txn_group, [readable],
                                                           producer, txn_member))
                assert got == {readable: 0}, got
                assert await end_transaction(client, txn, producer, broker, txn_group,
                                             readable) == 3
