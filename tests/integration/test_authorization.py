"""What the proxy answers or relays itself is authorized as the client's, as Kafka authorizes it.

On a test-bed Kafka 3.9 with a SASL_SSL listener, SCRAM users and the standard authorizer,
groupgate in front with its own identity (``groupgate``: READ and DESCRIBE on every group and
topic, tests/testbed/security.py), and the user ``bob`` given, for this test only, READ and
DESCRIBE on one topic and DESCRIBE (not READ) on a prefix of group names. Requests are sent at
the protocol level (the proxy's own client, authenticating as bob with SCRAM), so every error
code is the one a client library would see. The same requests straight at Kafka 4.4's own
KIP-848 coordinator, with the same ACLs, are the reference (``slow``).

Default run (about a minute): KIP-848 and classic joins without READ refused
(GROUP_AUTHORIZATION_FAILED) through the proxy, where before they were served all partitions;
with READ allowed, a member joins and a topic without DESCRIBE fails its heartbeat as a whole;
a commit's topic without READ is refused and nothing of a refused client is written (read
straight at the broker); a DENY on one group overrides the prefixed ALLOW; an ACL removed while
the member is in its group refuses its next heartbeat after ``authorization-ttl-ms``; a
client behind a follower sidecar is refused on its own sidecar before anything is relayed; a
regex matching two topics, one of which the member may describe, gets it only that one; a
TxnOffsetCommit without WRITE on its transactional id is refused before anything else (with it,
inside a transaction, it lands); and DESCRIBE denied with DELETE allowed refuses DescribeGroups
and deletes with DeleteGroups. Each of these has its Kafka 4.4 reference case (``slow``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
import trio

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.config import ProxyConfig
from proxy.security.policy import Security
from proxy.upstream import UpstreamClient
from tests.integration.conftest import StartProxy
from tests.integration.test_security import produce, security_of, start_secured_proxy
from tests.testbed.broker import KafkaBroker, free_ports

GROUP_AUTH, TOPIC_AUTH = 30, 29
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


def heartbeat(group: str, topics: list[str] | None, member: str = "", epoch: int = 0
              ) -> dict[str, Any]:
    return {"group_id": group, "member_id": member, "member_epoch": epoch,
            "instance_id": None, "rack_id": None,
            "rebalance_timeout_ms": 30_000 if epoch == 0 else -1,
            "subscribed_topic_names": topics, "subscribed_topic_regex": None,
            "server_assignor": None, "topic_partitions": [] if epoch == 0 else None}


def join(group: str, topic: str) -> dict[str, Any]:
    metadata = messages.encode_data("ConsumerProtocolSubscription", 0, {"topics": [topic]})
    return {"group_id": group, "session_timeout_ms": 10_000, "rebalance_timeout_ms": 10_000,
            "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": metadata}]}


def commit(group: str, topics: list[str], member: str = "", epoch: int = -1
           ) -> dict[str, Any]:
    return {"group_id": group, "generation_id_or_member_epoch": epoch, "member_id": member,
            "group_instance_id": None, "topics": [
                {"name": t, "partitions": [{"partition_index": 0, "committed_offset": 3,
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
    """ACLs of this test on the broker, removed when it ends."""

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
        for future in self.admin.create_acls([binding]).values():
            future.result(timeout=30)
        self.bindings.append(binding)
        return binding

    def remove(self, binding: Any) -> None:
        from confluent_kafka.admin import AclBindingFilter

        as_filter = AclBindingFilter(binding.restype, binding.name,
                                     binding.resource_pattern_type, binding.principal,
                                     binding.host, binding.operation, binding.permission_type)
        for future in self.admin.delete_acls([as_filter]).values():
            future.result(timeout=30)
        self.bindings.remove(binding)

    def clear(self) -> None:
        for binding in list(self.bindings):
            self.remove(binding)


@contextmanager
def acls_of(broker: KafkaBroker) -> Iterator[Acls]:
    acls = Acls(broker)
    try:
        yield acls
    finally:
        acls.clear()


async def until(probe: Callable[[], Awaitable[Any]], done: Callable[[Any], bool],
                seconds: float = 30) -> Any:
    """``probe()`` again until ``done`` says so (an ACL change reaches the authorizer soon
    after it is committed; a right given up reaches a proxy within its answers' lifetime)."""
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
    connect = client_for(broker, "alice", address_of(broker.secure_bootstrap), tls=True)
    client = await connect()
    try:
        found = await until(lambda: client.request(ApiKey.FIND_COORDINATOR, 4, {
            "key_type": 0, "coordinator_keys": ["warm-up"]}),
            lambda a: a["coordinators"][0]["error_code"] == 0, seconds=60)
        assert found["coordinators"][0]["error_code"] == 0, found
        described = await until(lambda: client.request(ApiKey.DESCRIBE_GROUPS, 5, {
            "groups": ["warm-up"], "include_authorized_operations": False}),
            lambda a: a["groups"][0]["error_code"] not in (14, 15, 16), seconds=60)
        assert described["groups"][0]["error_code"] == 0, described
    finally:
        await client.aclose()


def setup_names(broker: KafkaBroker, topic: Callable[..., str]) -> tuple[str, str, str]:
    readable = topic(broker, partitions=2)
    secret = topic(broker, partitions=1)
    produce(broker, readable, 20)
    return readable, secret, f"authz-{uuid.uuid4().hex[:8]}-"


async def refusals(connect: Connect, readable: str, secret: str, prefix: str
                   ) -> dict[str, Any]:
    """What bob is told with READ and DESCRIBE on ``readable`` and only DESCRIBE on groups
    ``prefix*``: the codes Kafka 4.4 gives (GROUP_AUTHORIZATION_FAILED before anything)."""
    client = await connect()
    try:
        out: dict[str, Any] = {}
        answer = await client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                      heartbeat(prefix + "kip848", [readable]))
        out["kip848 join"] = answer["error_code"]
        out["kip848 join assignment"] = answer.get("assignment")
        out["classic join"] = (await client.request(
            ApiKey.JOIN_GROUP, 7, join(prefix + "classic", readable)))["error_code"]
        out["commit"] = partition_errors(await client.request(
            ApiKey.OFFSET_COMMIT, 9, commit(prefix + "commit", [readable])))
        out["describe"] = [(g["group_id"][len(prefix):], g["error_code"]) for g in (
            await client.request(ApiKey.DESCRIBE_GROUPS, 5, {
                "groups": [prefix + "kip848"], "include_authorized_operations": True}))["groups"]]
        out["delete"] = [(g["group_id"][len(prefix):], g["error_code"]) for g in (
            await client.request(ApiKey.DELETE_GROUPS, 2, {
                "groups_names": [prefix + "kip848"]}))["results"]]
        return out
    finally:
        await client.aclose()


async def with_read(connect: Connect, readable: str, secret: str, prefix: str
                    ) -> dict[str, Any]:
    """With READ on the groups too: a member joins and commits; a topic without DESCRIBE
    fails a heartbeat as a whole, one without READ its commit's partitions."""
    client = await connect()
    try:
        out: dict[str, Any] = {}
        group = prefix + "member"
        answer = await until(lambda: client.request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat(group, [readable])),
            lambda a: a["error_code"] != GROUP_AUTH)
        out["kip848 join"] = answer["error_code"]
        member, epoch = answer["member_id"], answer["member_epoch"]
        out["secret topic heartbeat"] = (await client.request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
            heartbeat(prefix + "other", [readable, secret])))["error_code"]
        out["commit with a secret topic"] = partition_errors(await client.request(
            ApiKey.OFFSET_COMMIT, 9, commit(group, [readable, secret], member, epoch)))
        out["member"] = (member, epoch)
        return out
    finally:
        await client.aclose()


async def read_removed(connect: Connect, readable: str, prefix: str, member: tuple[str, int],
                       remove: Callable[[], None]) -> int:
    """The member's heartbeats after its READ on the group is removed: refused (Kafka at once,
    the proxy within its answers' lifetime)."""
    client = await connect()
    try:
        member_id, epoch = member
        group = prefix + "member"

        async def beat() -> int:
            nonlocal epoch
            answer = await client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                          heartbeat(group, None, member_id, epoch))
            epoch = answer["member_epoch"] if answer["error_code"] == 0 else epoch
            return int(answer["error_code"])

        assert await beat() == 0
        remove()
        return int(await until(beat, lambda code: code == GROUP_AUTH,
                               seconds=TTL_MS / 1000 + 20))
    finally:
        await client.aclose()


EXPECTED_REFUSALS = {
    "kip848 join": GROUP_AUTH, "classic join": GROUP_AUTH, "kip848 join assignment": None,
    "describe": [("kip848", 0)], "delete": [("kip848", GROUP_AUTH)]}
"""Kafka 4.4's answers (and the proxy's): without READ on the group, both joins are refused and
nothing is assigned; with DESCRIBE the group is described, without DELETE it is not deleted."""


async def test_without_read_on_the_group_the_proxy_refuses_as_kafka_does(
        secured_kafka39: KafkaBroker, topic: Callable[..., str],
        start_proxy: StartProxy) -> None:
    broker = secured_kafka39
    readable, secret, prefix = setup_names(broker, topic)
    proxy = start_secured_proxy(start_proxy, broker, "--authorization-ttl-ms", str(TTL_MS))
    connect = client_for(broker, "bob", address_of(proxy.bootstrap), tls=False)
    with acls_of(broker) as acls:
        for operation in ("READ", "DESCRIBE"):
            acls.add("User:bob", "TOPIC", readable, "LITERAL", operation)
        # nothing on ``secret`` (WRITE, READ, DELETE or ALTER would imply DESCRIBE)
        acls.add("User:bob", "GROUP", prefix, "PREFIXED", "DESCRIBE")
        got = await refusals(connect, readable, secret, prefix)
        commit_codes = got.pop("commit")
        assert {k: got[k] for k in EXPECTED_REFUSALS} == EXPECTED_REFUSALS, got
        assert commit_codes == {readable: GROUP_AUTH}
        assert committed(broker, prefix + "commit", readable) < 0  # nothing written

        read = acls.add("User:bob", "GROUP", prefix, "PREFIXED", "READ")
        deny = acls.add("User:bob", "GROUP", prefix + "denied", "LITERAL", "READ", allow=False)
        got = await with_read(connect, readable, secret, prefix)
        assert got["kip848 join"] == 0 and got["secret topic heartbeat"] == TOPIC_AUTH, got
        assert got["commit with a secret topic"] == {secret: TOPIC_AUTH, readable: 0}, got
        assert committed(broker, prefix + "member", readable) == 3  # progress: it commits
        client = await connect()
        try:  # DENY on one group overrides the prefixed ALLOW
            denied = await client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                          heartbeat(prefix + "denied", [readable]))
            assert denied["error_code"] == GROUP_AUTH
        finally:
            await client.aclose()
        acls.remove(deny)
        code = await read_removed(connect, readable, prefix, got["member"],
                                  lambda: acls.remove(read))
        assert code == GROUP_AUTH


async def test_a_client_behind_a_follower_is_refused_on_its_own_sidecar(
        secured_kafka39: KafkaBroker, topic: Callable[..., str],
        start_proxy: StartProxy) -> None:
    """alice's member makes the first sidecar coordinate a group; bob, without READ on it,
    joins and commits through the second sidecar: refused there, nothing relayed, nothing
    written by the coordinating sidecar under the proxies' identity."""
    broker = secured_kafka39
    readable, _secret, prefix = setup_names(broker, topic)
    fleet_a, fleet_b = free_ports(2)
    holder = start_secured_proxy(start_proxy, broker, "--fleet-listen", f"127.0.0.1:{fleet_a}")
    follower = start_secured_proxy(start_proxy, broker, "--fleet-listen",
                                   f"127.0.0.1:{fleet_b}")
    group = prefix + "shared"
    alice = client_for(broker, "alice", address_of(holder.bootstrap), tls=False)
    bob = client_for(broker, "bob", address_of(follower.bootstrap), tls=False)
    with acls_of(broker) as acls:
        for operation in ("READ", "DESCRIBE"):
            acls.add("User:bob", "TOPIC", readable, "LITERAL", operation)
        acls.add("User:bob", "GROUP", prefix, "PREFIXED", "DESCRIBE")
        owner = await alice()
        try:
            joined = await owner.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                         heartbeat(group, [readable]))
            assert joined["error_code"] == 0
            client = await bob()
            try:
                refused = await client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                               heartbeat(group, [readable]))
                assert refused["error_code"] == GROUP_AUTH
                answer = await client.request(ApiKey.OFFSET_COMMIT, 9, commit(
                    group, [readable], joined["member_id"], joined["member_epoch"]))
                assert partition_errors(answer) == {readable: GROUP_AUTH}
            finally:
                await client.aclose()
            assert committed(broker, group, readable) < 0
            # progress: with READ, bob's member joins through the follower (relayed)
            acls.add("User:bob", "GROUP", prefix, "PREFIXED", "READ")
            client = await bob()
            try:
                relayed = await until(lambda: client.request(
                    ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat(group, [readable])),
                    lambda a: a["error_code"] == 0)
                assert relayed["error_code"] == 0
            finally:
                await client.aclose()
        finally:
            await owner.aclose()


@pytest.mark.slow
async def test_kafka_4_4_gives_the_same_answers(
        secured_kafka4: KafkaBroker, topic: Callable[..., str]) -> None:
    """The reference: the same requests and ACLs straight at Kafka 4.4's own coordinator."""
    broker = secured_kafka4
    readable, secret, prefix = setup_names(broker, topic)
    await coordinator_ready(broker)
    connect = client_for(broker, "bob", address_of(broker.secure_bootstrap), tls=True)
    with acls_of(broker) as acls:
        for operation in ("READ", "DESCRIBE"):
            acls.add("User:bob", "TOPIC", readable, "LITERAL", operation)
        acls.add("User:bob", "GROUP", prefix, "PREFIXED", "DESCRIBE")
        got = await refusals(connect, readable, secret, prefix)
        commit_codes = got.pop("commit")
        assert {k: got[k] for k in EXPECTED_REFUSALS} == EXPECTED_REFUSALS, got
        assert commit_codes == {readable: GROUP_AUTH}
        read = acls.add("User:bob", "GROUP", prefix, "PREFIXED", "READ")
        got = await with_read(connect, readable, secret, prefix)
        assert got["kip848 join"] == 0 and got["secret topic heartbeat"] == TOPIC_AUTH, got
        assert got["commit with a secret topic"] == {secret: TOPIC_AUTH, readable: 0}, got
        code = await read_removed(connect, readable, prefix, got["member"],
                                  lambda: acls.remove(read))
        assert code == GROUP_AUTH


async def every_api(connect: Connect, owner: Connect, readable: str, secret: str, prefix: str,
                    group: str) -> dict[str, Any]:
    """bob's answers for every API the proxy answers or relays, for ``group`` (where alice,
    through ``owner``, has a member assigned ``secret`` too): bob has READ on every group
    (wildcard) but a DENY on ``prefix + 'denied'``, READ and DESCRIBE on ``readable``, nothing
    on ``secret`` and no DELETE anywhere."""
    out: dict[str, Any] = {}
    client = await connect()
    try:
        answer = await until(lambda: client.request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat(group, [readable])),
            lambda a: a["error_code"] == 0)
        out["join"] = answer["error_code"]
        member, epoch = answer["member_id"], answer["member_epoch"]
        out["denied join"] = (await client.request(
            ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
            heartbeat(prefix + "denied", [readable])))["error_code"]
        described = await client.request(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, {
            "group_ids": [group, prefix + "denied"], "include_authorized_operations": True})
        out["consumer group describe"] = sorted(
            (g["group_id"][len(prefix):], g["error_code"]) for g in described["groups"])
        classic = await client.request(ApiKey.DESCRIBE_GROUPS, 5, {
            "groups": [group, prefix + "denied"], "include_authorized_operations": True})
        out["describe groups"] = sorted((g["group_id"][len(prefix):], g["error_code"])
                                        for g in classic["groups"])
        out["commit"] = partition_errors(await client.request(
            ApiKey.OFFSET_COMMIT, 9, commit(group, [readable, secret], member, epoch)))
        fetched = await client.request(ApiKey.OFFSET_FETCH, 8, {"groups": [
            {"group_id": group, "topics": [{"name": readable, "partition_indexes": [0]},
                                           {"name": secret, "partition_indexes": [0]}]}],
            "require_stable": False})
        out["offset fetch"] = sorted((t["name"] == secret, t["partitions"][0]["error_code"])
                                     for t in fetched["groups"][0]["topics"])
        out["offset delete"] = (await client.request(ApiKey.OFFSET_DELETE, 0, {
            "group_id": group, "topics": [{"name": readable, "partitions": [
                {"partition_index": 0}]}]}))["error_code"]
        out["delete groups"] = [r["error_code"] for r in (await client.request(
            ApiKey.DELETE_GROUPS, 2, {"groups_names": [group]}))["results"]]
    finally:
        await client.aclose()
    return out


EXPECTED_EVERY_API = {
    "join": 0, "denied join": GROUP_AUTH,
    "consumer group describe": [("denied", GROUP_AUTH), ("shared", TOPIC_AUTH)],
    "describe groups": [("denied", GROUP_AUTH), ("shared", 0)],
    "offset fetch": [(False, 0), (True, TOPIC_AUTH)],
    "offset delete": GROUP_AUTH, "delete groups": [GROUP_AUTH]}
"""What Kafka 4.4 answers bob (and the proxy, behind either sidecar): the group alice's member
is assigned the secret topic in is replaced in ConsumerGroupDescribe (KAFKA-18813); a DENY on
one group overrides the wildcard ALLOW; no DELETE: neither OffsetDelete nor DeleteGroups."""


def grant_every_api(acls: Acls, readable: str, secret: str, prefix: str) -> None:
    for operation in ("READ", "DESCRIBE"):
        acls.add("User:bob", "TOPIC", readable, "LITERAL", operation)
    acls.add("User:bob", "GROUP", "*", "LITERAL", "READ")
    acls.add("User:bob", "GROUP", prefix + "denied", "LITERAL", "ALL", allow=False)


@pytest.mark.slow
@pytest.mark.parametrize("behind", ["coordinating sidecar", "follower"])
async def test_every_api_behind_each_sidecar(
        secured_kafka39: KafkaBroker, topic: Callable[..., str], start_proxy: StartProxy,
        behind: str) -> None:
    broker = secured_kafka39
    readable, secret, prefix = setup_names(broker, topic)
    fleet_a, fleet_b = free_ports(2)
    holder = start_secured_proxy(start_proxy, broker, "--fleet-listen", f"127.0.0.1:{fleet_a}",
                                 "--authorization-ttl-ms", str(TTL_MS))
    follower = start_secured_proxy(start_proxy, broker, "--fleet-listen",
                                   f"127.0.0.1:{fleet_b}", "--authorization-ttl-ms",
                                   str(TTL_MS))
    group = prefix + "shared"
    owner = client_for(broker, "alice", address_of(holder.bootstrap), tls=False)
    via = holder if behind == "coordinating sidecar" else follower
    bob = client_for(broker, "bob", address_of(via.bootstrap), tls=False)
    with acls_of(broker) as acls:
        grant_every_api(acls, readable, secret, prefix)
        alice = await owner()
        try:
            first = await alice.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                        heartbeat(group, [readable, secret]))
            assert first["error_code"] == 0
            got = await every_api(bob, owner, readable, secret, prefix, group)
        finally:
            await alice.aclose()
        commit_codes = got.pop("commit")
        assert commit_codes[secret] == TOPIC_AUTH, commit_codes
        assert got == EXPECTED_EVERY_API, got


@pytest.mark.slow
async def test_kafka_4_4_answers_every_api_the_same(
        secured_kafka4: KafkaBroker, topic: Callable[..., str]) -> None:
    broker = secured_kafka4
    readable, secret, prefix = setup_names(broker, topic)
    await coordinator_ready(broker)
    group = prefix + "shared"
    address = address_of(broker.secure_bootstrap)
    owner = client_for(broker, "alice", address, tls=True)
    bob = client_for(broker, "bob", address, tls=True)
    with acls_of(broker) as acls:
        grant_every_api(acls, readable, secret, prefix)
        alice = await owner()
        try:
            first = await alice.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                        heartbeat(group, [readable, secret]))
            assert first["error_code"] == 0
            await until(lambda: alice.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat(
                group, None, first["member_id"], first["member_epoch"])),
                lambda a: bool(a.get("assignment")))
            got = await every_api(bob, owner, readable, secret, prefix, group)
        finally:
            await alice.aclose()
        commit_codes = got.pop("commit")
        assert commit_codes[secret] == TOPIC_AUTH, commit_codes
        assert got == EXPECTED_EVERY_API, got


async def regex_assignment(connect: Connect, group: str, regex: str) -> set[uuid.UUID]:
    """The topics bob's member subscribing to ``regex`` is assigned, once it is assigned
    anything (Kafka 4.4 resolves a regex in the background, so not in the joining answer)."""
    client = await connect()
    try:
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
                assigned.update(tp["topic_id"]
                                for tp in answer["assignment"]["topic_partitions"])
            return assigned

        await until(beat, bool)
        return assigned
    finally:
        await client.aclose()


async def topic_ids(connect: Connect, names: list[str]) -> dict[str, uuid.UUID]:
    client = await connect()
    try:
        answer = await client.request(ApiKey.METADATA, 12, {
            "topics": [{"topic_id": uuid.UUID(int=0), "name": n} for n in names],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False})
        return {t["name"]: t["topic_id"] for t in answer["topics"]}
    finally:
        await client.aclose()


@contextmanager
def regex_topics(broker: KafkaBroker) -> Iterator[tuple[str, str, str]]:
    """Two topics one regex matches, ``rx-<hex>-open`` and ``rx-<hex>-secret``; the regex."""
    stem = f"rx-{uuid.uuid4().hex[:8]}-"
    names = (stem + "open", stem + "secret")
    for name in names:
        broker.create_topic(name, 2, 1)
    try:
        yield names[0], names[1], stem + ".*"  # letters, digits and "-": literal
    finally:
        for name in names:
            with suppress(Exception):
                broker.delete_topic(name, timeout=15)


async def regex_case(broker: KafkaBroker, bob: Connect, alice: Connect) -> None:
    """bob may READ and DESCRIBE ``open`` only, READ every group: his regex matching both
    topics gets him ``open``'s partitions, never ``secret``'s."""
    with regex_topics(broker) as (open_topic, secret, regex), acls_of(broker) as acls:
        for operation in ("READ", "DESCRIBE"):
            acls.add("User:bob", "TOPIC", open_topic, "LITERAL", operation)
        acls.add("User:bob", "GROUP", "*", "LITERAL", "READ")
        ids = await topic_ids(alice, [open_topic, secret])
        assigned = await regex_assignment(bob, f"authz-regex-{uuid.uuid4().hex[:8]}", regex)
        assert assigned == {ids[open_topic]}, (assigned, ids)


async def test_a_regex_member_is_assigned_only_the_topics_it_may_describe(
        secured_kafka39: KafkaBroker, start_proxy: StartProxy) -> None:
    broker = secured_kafka39
    proxy = start_secured_proxy(start_proxy, broker, "--authorization-ttl-ms", str(TTL_MS))
    address = address_of(proxy.bootstrap)
    await regex_case(broker, client_for(broker, "bob", address, tls=False),
                     client_for(broker, "alice", address, tls=False))


@pytest.mark.slow
async def test_kafka_4_4_assigns_a_regex_member_only_the_topics_it_may_describe(
        secured_kafka4: KafkaBroker) -> None:
    broker = secured_kafka4
    await coordinator_ready(broker)
    address = address_of(broker.secure_bootstrap)
    await regex_case(broker, client_for(broker, "bob", address, tls=True),
                     client_for(broker, "alice", address, tls=True))


def txn_commit(txn: str, group: str, topics: list[str], producer: tuple[int, int],
               member: tuple[str, int]) -> dict[str, Any]:
    value = commit(group, topics, *member)
    del value["generation_id_or_member_epoch"]
    return dict(value, transactional_id=txn, producer_id=producer[0],
                producer_epoch=producer[1], generation_id_or_member_epoch=member[1])


async def txn_offsets(client: UpstreamClient, value: dict[str, Any]) -> dict[str, int]:
    return partition_errors(await client.request(ApiKey.TXN_OFFSET_COMMIT, 3, value))


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


async def txn_case(broker: KafkaBroker, connect: Connect, owner: Connect, readable: str,
                   prefix: str, acls: Acls) -> dict[str, Any]:
    """bob, READ on the group and on ``readable``: TxnOffsetCommit without WRITE on its
    transactional id (also to a group alice's member is in, on which bob is denied READ),
    then with it inside a real transaction."""
    out: dict[str, Any] = {}
    group, txn, denied = prefix + "txn", prefix + "txn-id", prefix + "txn-denied"
    alice = await owner()
    try:
        await assigned_member(alice, denied, readable)
    finally:
        await alice.aclose()
    acls.add("User:bob", "GROUP", denied, "LITERAL", "READ", allow=False)
    client = await connect()
    try:
        member = await assigned_member(client, group, readable)
        out["without write"] = partition_errors(await client.request(
            ApiKey.TXN_OFFSET_COMMIT, 3, txn_commit(txn, group, [readable], (7, 0), member)))
        out["without write or read on the group"] = partition_errors(await client.request(
            ApiKey.TXN_OFFSET_COMMIT, 3, txn_commit(txn, denied, [readable], (7, 0), member)))
        acls.add("User:bob", "TRANSACTIONAL_ID", txn, "LITERAL", "WRITE")
        # as a producer does: find the transaction coordinator first (a fresh broker creates
        # its transaction state topic then; until it is loaded, InitProducerId answers
        # NOT_COORDINATOR)
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
            "transactional_id": txn, "producer_id": producer[0],
            "producer_epoch": producer[1], "group_id": group}),
            lambda a: a["error_code"] == 0)
        assert added["error_code"] == 0, added
        # a refusal the proxy still holds is believed for its answers' lifetime
        out["with write"] = await until(lambda: txn_offsets(client, txn_commit(
            txn, group, [readable], producer, member)), lambda e: e != {readable: 53})
        ended = await client.request(ApiKey.END_TXN, 3, {
            "transactional_id": txn, "producer_id": producer[0],
            "producer_epoch": producer[1], "committed": True})
        assert ended["error_code"] == 0, ended
    finally:
        await client.aclose()
    deadline = time.monotonic() + 30  # the commit marker lands after EndTxn's answer
    while (offset := committed(broker, group, readable)) != 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    out["committed"] = offset
    return out


EXPECTED_TXN = {"without write": {"readable": 53},
                "without write or read on the group": {"readable": 53},
                "with write": {"readable": 0}, "committed": 3}
"""Kafka 4.4's answers (and the proxy's, for groups its engine coordinates): WRITE on the
transactional id is checked before READ on the group (TRANSACTIONAL_ID_AUTHORIZATION_FAILED
for every partition, where the proxy answered GROUP_AUTHORIZATION_FAILED before); with it, the
transactional commit lands."""


def _named(got: dict[str, Any], readable: str) -> dict[str, Any]:
    return {k: ({"readable" if t == readable else t: c for t, c in v.items()}
                if isinstance(v, dict) else v) for k, v in got.items()}


async def test_a_txn_commit_needs_write_on_its_transactional_id(
        secured_kafka39: KafkaBroker, topic: Callable[..., str],
        start_proxy: StartProxy) -> None:
    broker = secured_kafka39
    readable, _secret, prefix = setup_names(broker, topic)
    proxy = start_secured_proxy(start_proxy, broker, "--authorization-ttl-ms", str(TTL_MS))
    address = address_of(proxy.bootstrap)
    connect = client_for(broker, "bob", address, tls=False)
    with acls_of(broker) as acls:
        for operation in ("READ", "DESCRIBE"):
            acls.add("User:bob", "TOPIC", readable, "LITERAL", operation)
        acls.add("User:bob", "GROUP", prefix, "PREFIXED", "READ")
        got = await txn_case(broker, connect, client_for(broker, "alice", address, tls=False),
                             readable, prefix, acls)
    assert _named(got, readable) == EXPECTED_TXN, got


@pytest.mark.slow
async def test_kafka_4_4_needs_write_on_the_transactional_id_of_a_txn_commit(
        secured_kafka4: KafkaBroker, topic: Callable[..., str]) -> None:
    broker = secured_kafka4
    readable, _secret, prefix = setup_names(broker, topic)
    await coordinator_ready(broker)
    address = address_of(broker.secure_bootstrap)
    connect = client_for(broker, "bob", address, tls=True)
    with acls_of(broker) as acls:
        for operation in ("READ", "DESCRIBE"):
            acls.add("User:bob", "TOPIC", readable, "LITERAL", operation)
        acls.add("User:bob", "GROUP", prefix, "PREFIXED", "READ")
        got = await txn_case(broker, connect, client_for(broker, "alice", address, tls=True),
                             readable, prefix, acls)
    assert _named(got, readable) == EXPECTED_TXN, got


async def deny_describe_case(bob: Connect, alice: Connect, readable: str, prefix: str,
                             acls: Acls) -> dict[str, Any]:
    """bob is denied DESCRIBE on a group alice's member left empty, and allowed DELETE on it:
    what DescribeGroups and DeleteGroups answer him."""
    group = prefix + "deletable"
    owner = await alice()
    try:
        joined = await owner.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                     heartbeat(group, [readable]))
        assert joined["error_code"] == 0, joined
        left = await owner.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, heartbeat(
            group, None, joined["member_id"], -1))
        assert left["error_code"] == 0, left
    finally:
        await owner.aclose()
    acls.add("User:bob", "GROUP", prefix, "PREFIXED", "DELETE")
    acls.add("User:bob", "GROUP", group, "LITERAL", "DESCRIBE", allow=False)
    client = await bob()
    try:
        out: dict[str, Any] = {}
        described = await client.request(ApiKey.DESCRIBE_GROUPS, 5, {
            "groups": [group], "include_authorized_operations": True})
        out["describe groups"] = [g["error_code"] for g in described["groups"]]
        deleted = await until(lambda: client.request(ApiKey.DELETE_GROUPS, 2, {
            "groups_names": [group]}), lambda a: a["results"][0]["error_code"] != GROUP_AUTH)
        out["delete groups"] = [r["error_code"] for r in deleted["results"]]
        return out
    finally:
        await client.aclose()


EXPECTED_DENY_DESCRIBE = {"describe groups": [GROUP_AUTH], "delete groups": [0]}
"""Kafka 4.4 (and the proxy): each API checks its own operation; DESCRIBE denied refuses
DescribeGroups, DELETE allowed deletes the empty group."""


async def test_deny_describe_with_allow_delete_deletes_the_group(
        secured_kafka39: KafkaBroker, topic: Callable[..., str],
        start_proxy: StartProxy) -> None:
    broker = secured_kafka39
    readable, _secret, prefix = setup_names(broker, topic)
    proxy = start_secured_proxy(start_proxy, broker, "--authorization-ttl-ms", str(TTL_MS))
    address = address_of(proxy.bootstrap)
    with acls_of(broker) as acls:
        got = await deny_describe_case(client_for(broker, "bob", address, tls=False),
                                       client_for(broker, "alice", address, tls=False),
                                       readable, prefix, acls)
    assert got == EXPECTED_DENY_DESCRIBE, got


@pytest.mark.slow
async def test_kafka_4_4_deletes_with_describe_denied_and_delete_allowed(
        secured_kafka4: KafkaBroker, topic: Callable[..., str]) -> None:
    broker = secured_kafka4
    readable, _secret, prefix = setup_names(broker, topic)
    await coordinator_ready(broker)
    address = address_of(broker.secure_bootstrap)
    with acls_of(broker) as acls:
        got = await deny_describe_case(client_for(broker, "bob", address, tls=True),
                                       client_for(broker, "alice", address, tls=True),
                                       readable, prefix, acls)
    assert got == EXPECTED_DENY_DESCRIBE, got


# -- commits of a member behind a follower, under the client's own principal -----------------


LONG_TTL_MS = 600_000
"""The follower's ``authorization-ttl-ms`` in the commit tests: its answers outlive the test,
so what decides a commit is the broker checking the client's own request."""


async def behind_a_follower(start_proxy: StartProxy, broker: KafkaBroker, group: str,
                            other_topic: str) -> tuple[Connect, Connect, UpstreamClient]:
    """A holder and a follower; alice's member (subscribed to ``other_topic``, so nothing
    of bob's topic is hers) makes the holder coordinate ``group``. Returns bob's connections
    through the follower, alice's through the holder, and alice's open connection."""
    fleet_a, fleet_b = free_ports(2)
    holder = start_secured_proxy(start_proxy, broker, "--fleet-listen", f"127.0.0.1:{fleet_a}")
    follower = start_secured_proxy(start_proxy, broker, "--fleet-listen",
                                   f"127.0.0.1:{fleet_b}", "--authorization-ttl-ms",
                                   str(LONG_TTL_MS))
    alice = client_for(broker, "alice", address_of(holder.bootstrap), tls=False)
    bob = client_for(broker, "bob", address_of(follower.bootstrap), tls=False)
    owner = await alice()
    joined = await owner.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                 heartbeat(group, [other_topic]))
    assert joined["error_code"] == 0, joined
    return bob, alice, owner


async def test_a_followers_commit_is_authorized_by_the_broker_as_the_client(
        secured_kafka39: KafkaBroker, topic: Callable[..., str],
        start_proxy: StartProxy) -> None:
    """bob's member sits behind a follower. Its commit lands (read straight at the broker);
    with its READ on the topic removed, its next commit is refused by the broker with
    TOPIC_AUTHORIZATION_FAILED, although the follower still holds the answer that allowed it,
    and nothing is written; and with the proxies' own identity denied READ on the topic, bob's
    commit still lands: it reached the broker as bob's, never as the proxy's (before: relayed
    and written by the holder as the proxy, so the refused commit landed and the allowed one
    was refused)."""
    broker = secured_kafka39
    readable, secret, prefix = setup_names(broker, topic)
    group = prefix + "relayed"
    with acls_of(broker) as acls:
        acls.add("User:bob", "TOPIC", readable, "LITERAL", "DESCRIBE")
        read = acls.add("User:bob", "TOPIC", readable, "LITERAL", "READ")
        acls.add("User:bob", "GROUP", prefix, "PREFIXED", "READ")
        bob, _alice, owner = await behind_a_follower(start_proxy, broker, group, secret)
        try:
            client = await bob()
            try:
                member = await assigned_member(client, group, readable)

                async def commit_at(offset: int) -> dict[str, int]:
                    value = commit(group, [readable], *member)
                    value["topics"][0]["partitions"][0]["committed_offset"] = offset
                    return partition_errors(await client.request(ApiKey.OFFSET_COMMIT, 9,
                                                                 value))

                assert await commit_at(3) == {readable: 0}
                assert committed(broker, group, readable) == 3  # progress: it commits

                acls.remove(read)
                refused = await until(lambda: commit_at(5), lambda e: e != {readable: 0})
                assert refused == {readable: TOPIC_AUTH}
                assert committed(broker, group, readable) == 3  # nothing of the refusal

                acls.add("User:bob", "TOPIC", readable, "LITERAL", "READ")
                acls.add("User:groupgate", "TOPIC", readable, "LITERAL", "READ", allow=False)
                landed = await until(lambda: commit_at(7), lambda e: e == {readable: 0})
                assert landed == {readable: 0}
                assert committed(broker, group, readable) == 7
            finally:
                await client.aclose()
        finally:
            await owner.aclose()


async def test_a_followers_txn_commit_needs_no_write_of_the_proxy_on_the_transactional_id(
        secured_kafka39: KafkaBroker, topic: Callable[..., str],
        start_proxy: StartProxy) -> None:
    """bob's TxnOffsetCommit behind a follower, inside a real transaction: WRITE on the
    transactional id is bob's (the proxies' identity has none); it lands (before: relayed and
    sent by the holder as the proxy, refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED)."""
    broker = secured_kafka39
    readable, secret, prefix = setup_names(broker, topic)
    group, txn = prefix + "relayed-txn", prefix + "txn-id"
    with acls_of(broker) as acls:
        for operation in ("READ", "DESCRIBE"):
            acls.add("User:bob", "TOPIC", readable, "LITERAL", operation)
        acls.add("User:bob", "GROUP", prefix, "PREFIXED", "READ")
        acls.add("User:bob", "TRANSACTIONAL_ID", txn, "LITERAL", "WRITE")
        bob, _alice, owner = await behind_a_follower(start_proxy, broker, group, secret)
        try:
            client = await bob()
            try:
                member = await assigned_member(client, group, readable)
                found = await until(lambda: client.request(ApiKey.FIND_COORDINATOR, 4, {
                    "key_type": 1, "coordinator_keys": [txn]}),
                    lambda a: a["coordinators"][0]["error_code"] == 0, seconds=60)
                assert found["coordinators"][0]["error_code"] == 0, found
                started = await until(lambda: client.request(ApiKey.INIT_PRODUCER_ID, 4, {
                    "transactional_id": txn, "transaction_timeout_ms": 30_000,
                    "producer_id": -1, "producer_epoch": -1}),
                    lambda a: a["error_code"] == 0, seconds=60)
                assert started["error_code"] == 0, started
                producer = (started["producer_id"], started["producer_epoch"])
                added = await until(lambda: client.request(ApiKey.ADD_OFFSETS_TO_TXN, 3, {
                    "transactional_id": txn, "producer_id": producer[0],
                    "producer_epoch": producer[1], "group_id": group}),
                    lambda a: a["error_code"] == 0)
                assert added["error_code"] == 0, added
                got = await txn_offsets(client, txn_commit(txn, group, [readable], producer,
                                                           member))
                assert got == {readable: 0}, got
                ended = await client.request(ApiKey.END_TXN, 3, {
                    "transactional_id": txn, "producer_id": producer[0],
                    "producer_epoch": producer[1], "committed": True})
                assert ended["error_code"] == 0, ended
            finally:
                await client.aclose()
        finally:
            await owner.aclose()
    deadline = time.monotonic() + 30  # the commit marker lands after EndTxn's answer
    while (offset := committed(broker, group, readable)) != 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert offset == 3
