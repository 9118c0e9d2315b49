"""Bridged members (:mod:`proxy.coordination.bridged`) against a scripted broker, on trio's mock
clock: a KIP-848 join refused the lock because of direct members is bridged into the broker's
group; the error paths (a JoinGroup the broker refuses, an unreachable coordinator, a task that
fails, a silent client, a full table, the proxy stopping); commits stamped with the bridged
member's broker member id and generation, never with another."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from proxy.codec.api_keys import ApiKey
from proxy.coordination.convert import parse_subscription
from proxy.coordination.service import CoordinatorService
from translation.heartbeat import ConsumerGroupHeartbeatRequest

from .helpers import (
    COORDINATOR,
    TOPIC,
    TOPIC_ID,
    FakeMembership,
    consumer_heartbeat,
    coordinator_found,
    exchange,
    make_service,
    request,
    router,
)

GROUP = "g"
DIRECT = "rdkafka-0b7c-direct"


class Broker:
    """A classic group at the broker with one direct member (``DIRECT``, which never leads):
    every bridged member that joins is its leader, gets the SyncGroup it sent back, and is
    answered as scripted."""

    def __init__(self) -> None:
        self.generation = 4
        self.sent: list[tuple[int, dict[str, Any]]] = []
        self.join_error = 0
        self.coordinator_error = 0
        self.heartbeat_error = 0
        self.commit_error = 0
        self.protocol = "cooperative-sticky"
        self.broken = False

    def __call__(self, key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        self.sent.append((key, value))
        if key == ApiKey.FIND_COORDINATOR:
            if self.coordinator_error:
                return coordinator_found(version, value, "", -1, -1, self.coordinator_error)
            return coordinator_found(version, value, *COORDINATOR)
        if key == ApiKey.DESCRIBE_GROUPS:
            return {"groups": [{"error_code": 0, "group_id": GROUP, "group_state": "Stable",
                                "protocol_type": "consumer", "protocol_data": self.protocol,
                                "members": []}]}
        if key == ApiKey.METADATA:
            return {"topics": [{"error_code": 0, "name": TOPIC, "topic_id": TOPIC_ID,
                                "is_internal": False,
                                "partitions": [{}] * 4}]}
        if key == ApiKey.JOIN_GROUP:
            if self.broken:
                return {"error_code": 0}  # a broken answer: the member's task fails
            if all(p["name"] != self.protocol for p in value["protocols"]):
                # the lock's JoinGroup: the direct member's protocol is another
                return {"error_code": 23, "generation_id": -1, "protocol_name": None,
                        "leader": "", "member_id": "", "members": []}
            if self.join_error:
                return {"error_code": self.join_error, "generation_id": -1,
                        "protocol_name": None, "leader": "", "member_id": "", "members": []}
            if not value["member_id"]:
                return {"error_code": 79, "generation_id": -1, "protocol_name": None,
                        "leader": "", "member_id": "bridged-1", "members": []}
            self.generation += 1
            ours = next(p for p in value["protocols"] if p["name"] == self.protocol)
            return {"error_code": 0, "generation_id": self.generation,
                    "protocol_name": self.protocol, "leader": value["member_id"],
                    "member_id": value["member_id"], "members": [
                        {"member_id": value["member_id"], "group_instance_id": None,
                         "metadata": ours["metadata"]},
                        {"member_id": DIRECT, "group_instance_id": None,
                         "metadata": ours["metadata"]}]}
        if key == ApiKey.SYNC_GROUP:
            mine = next(a["assignment"] for a in value["assignments"]
                        if a["member_id"] == value["member_id"])
            return {"error_code": 0, "protocol_type": "consumer",
                    "protocol_name": self.protocol, "assignment": mine}
        if key == ApiKey.HEARTBEAT:
            return {"error_code": self.heartbeat_error}
        if key == ApiKey.LEAVE_GROUP:
            return {"error_code": 0, "members": []}
        if key == ApiKey.OFFSET_COMMIT:
            return {"topics": [{"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "error_code": self.commit_error}
                for p in t["partitions"]]} for t in value["topics"]]}
        raise AssertionError(f"unexpected api key {key}")

    def of(self, key: int) -> list[dict[str, Any]]:
        return [value for k, value in self.sent if k == key]


def direct_members(service: CoordinatorService) -> None:
    """The next takeover of ``GROUP`` is refused: clients straight at the broker hold it."""
    refused = FakeMembership(GROUP, service.pool)
    refused.failure = "the broker's group g has members connected straight to the broker"
    refused.failure_kind = "refused"
    refused.direct_members = True
    service.memberships[GROUP] = refused


@asynccontextmanager
async def running(broker: Broker, **settings: Any
                  ) -> AsyncIterator[tuple[CoordinatorService, trio.Nursery]]:
    """A running service whose next takeover of ``GROUP`` is refused for direct members (so
    the group's KIP-848 joins are bridged), and the nursery it runs in."""
    service = make_service(broker, **settings)
    direct_members(service)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        yield service, nursery


def hb(member: str, epoch: int, owned: list[int] | None = None,
       group: str = GROUP) -> ConsumerGroupHeartbeatRequest:
    value: dict[str, Any] = {"group_id": group, "member_id": member, "member_epoch": epoch,
                             "rebalance_timeout_ms": 10_000 if epoch == 0 else -1,
                             "subscribed_topic_names": [TOPIC] if epoch == 0 else None,
                             "topic_partitions": [] if epoch == 0 else None}
    if owned is not None:
        value["topic_partitions"] = [{"topic_id": TOPIC_ID, "partitions": owned}]
    return consumer_heartbeat(value, client_id="app", client_host="/h", api_version=1)


async def joined(service: CoordinatorService, member: str = "m1") -> tuple[int, list[int]]:
    """Join ``member`` and follow its answers until it has an epoch; (epoch, partitions)."""
    response = await service.heartbeat(hb(member, 0))
    while response.member_epoch <= 0:
        assert response.error_code in (0, 14), response  # COORDINATOR_LOAD_IN_PROGRESS
        await trio.sleep(0.5)
        response = await service.heartbeat(hb(member, 0))
    assert response.assignment is not None
    parts = [p for tp in response.assignment for p in tp.partitions]
    assert all(tp.topic_id == TOPIC_ID for tp in response.assignment)
    return response.member_epoch, parts


async def test_a_kip848_join_refused_the_lock_is_bridged_into_the_broker_group(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    broker.protocol = "range"  # the direct members' protocol: offered first
    async with running(broker) as (service, nursery):
        epoch, parts = await joined(service)
        assert epoch == broker.generation == 5  # the member epoch is the broker generation
        assert parts == [0, 1]  # the leader's range share of 4 partitions
        assert service.bridges.has_group(GROUP) and service.claims(GROUP)
        joins = broker.of(ApiKey.JOIN_GROUP)
        assert [p["name"] for p in joins[-1]["protocols"]] == [
            "range", "cooperative-sticky", "roundrobin", "sticky"]
        # the member mark is the client id of every request the bridged member sends
        link = service.pool.fake  # type: ignore[attr-defined]
        marks = {c for (k, _v, _val), c in zip(link.requests, link.client_ids, strict=True)
                 if k in (ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT)}
        assert marks == {f"gg3|{service.upgrades.mark_address}|m1|app"}
        subscription = parse_subscription(joins[-1]["protocols"][0]["metadata"])
        assert subscription is not None and list(subscription.topics) == [TOPIC]
        # the broker's heartbeats are the bridged member's own; the client's answer keeps
        # the epoch
        again = await service.heartbeat(hb("m1", epoch, owned=parts))
        assert again.error_code == 0 and again.member_epoch == epoch
        await trio.sleep(3)
        assert broker.of(ApiKey.HEARTBEAT)
        nursery.cancel_scope.cancel()


async def test_the_client_leaving_or_going_silent_leaves_the_broker_group(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with running(broker) as (service, nursery):
        epoch, parts = await joined(service, "m1")
        left = await service.heartbeat(hb("m1", -1))
        assert left.error_code == 0 and left.member_epoch == -1
        await trio.sleep(0.1)
        assert [m["member_id"] for v in broker.of(ApiKey.LEAVE_GROUP) for m in v["members"]] \
            == ["bridged-1"]
        assert service.bridges.member(GROUP, "m1") is None

        epoch, parts = await joined(service, "m2")
        await trio.sleep(5.9)  # within the client's 6 s session: still a member
        assert service.bridges.member(GROUP, "m2") is not None
        await trio.sleep(0.5)
        assert service.bridges.member(GROUP, "m2") is None
        assert len(broker.of(ApiKey.LEAVE_GROUP)) == 2
        assert not service.bridges.has_group(GROUP)
        # its client comes back: told to rejoin, as for any member the proxy does not know
        late = await service.heartbeat(hb("m2", epoch, owned=parts))
        assert late.error_code == 25  # UNKNOWN_MEMBER_ID
        nursery.cancel_scope.cancel()


async def test_a_join_the_broker_refuses_ends_that_member_only(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with running(broker) as (service, nursery):
        await joined(service, "m1")
        broker.join_error = 30  # GROUP_AUTHORIZATION_FAILED
        response = await service.heartbeat(hb("m2", 0))
        assert response.error_code == 69, response  # GROUP_ID_NOT_FOUND, as Kafka 4.x
        await trio.sleep(0.1)
        assert service.bridges.member(GROUP, "m2") is None
        assert service.bridges.member(GROUP, "m1") is not None
        nursery.cancel_scope.cancel()


async def test_a_failing_member_task_stays_with_that_member(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with running(broker) as (service, nursery):
        epoch, parts = await joined(service, "m1")
        broker.broken = True
        response = await service.heartbeat(hb("m2", 0))
        assert response.error_code == 14  # retriable; the member's task failed meanwhile
        await trio.sleep(0.1)
        assert service.bridges.member(GROUP, "m2") is None
        broker.broken = False
        still = await service.heartbeat(hb("m1", epoch, owned=parts))
        assert still.error_code == 0 and still.member_epoch == epoch
        nursery.cancel_scope.cancel()


async def test_an_unreachable_coordinator_is_answered_retriably_and_tried_again(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with running(broker) as (service, nursery):
        broker.coordinator_error = 15  # COORDINATOR_NOT_AVAILABLE
        response = await service.heartbeat(hb("m1", 0))
        assert response.error_code == 14 and response.member_epoch == 0
        assert service.bridges.member(GROUP, "m1") is not None  # still trying
        broker.coordinator_error = 0
        epoch, _parts = await joined(service, "m1")
        assert epoch == 5
        nursery.cancel_scope.cancel()


async def test_the_table_of_bridged_members_is_bounded(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with running(broker, max_members=2) as (service, nursery):
        await joined(service, "m1")
        await joined(service, "m2")
        full = await service.heartbeat(hb("m3", 0))
        assert full.error_code == 15 and "max-members" in (full.error_message or "")
        assert len(service.bridges.members) == 2
        nursery.cancel_scope.cancel()


async def test_commits_are_stamped_with_the_bridged_members_broker_id_and_generation(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with running(broker) as (service, nursery):
        epoch, parts = await joined(service, "m1")
        await service.heartbeat(hb("m1", epoch, owned=parts))

        def commit(epoch: int, partition: int) -> Any:
            return request(8, 9, {
                "group_id": GROUP, "generation_id_or_member_epoch": epoch, "member_id": "m1",
                "group_instance_id": None, "retention_time_ms": -1,
                "topics": [{"name": TOPIC, "partitions": [
                    {"partition_index": partition, "committed_offset": 10,
                     "committed_leader_epoch": -1, "committed_metadata": ""}]}]})

        def errors(answer: dict[str, Any] | None) -> set[int]:
            assert answer is not None
            return {p["error_code"] for t in answer["topics"] for p in t["partitions"]}

        stamped = await exchange(router(service), commit(epoch, parts[0]), broker)
        assert stamped.action == "rewrite" and stamped.sent is not None
        assert stamped.sent["member_id"] == "bridged-1"
        assert stamped.sent["generation_id_or_member_epoch"] == epoch
        assert errors(stamped.response) == {0}
        # an old epoch, or a partition that is not the member's: never sent to the broker
        stale = await exchange(router(service), commit(epoch - 1, parts[0]), broker)
        assert stale.action == "local" and errors(stale.response) == {113}
        other = await exchange(router(service), commit(epoch, 3), broker)
        assert other.action == "local" and errors(other.response) == {113}
        # the broker moved on meanwhile: retriable for the client, never stamped again
        broker.commit_error = 22  # ILLEGAL_GENERATION
        refused = await exchange(router(service), commit(epoch, parts[0]), broker)
        assert errors(refused.response) == {14}
        nursery.cancel_scope.cancel()


async def test_describe_and_offset_fetch_of_a_bridged_group(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with running(broker) as (service, nursery):
        epoch, _parts = await joined(service, "m1")
        described = await exchange(router(service), request(69, 0, {
            "group_ids": [GROUP], "include_authorized_operations": False}))
        assert described.response is not None
        group = described.response["groups"][0]
        assert group["error_code"] == 69 and "classic group" in group["error_message"]

        def fetch(epoch: int) -> Any:
            return request(9, 9, {"groups": [{"group_id": GROUP, "member_id": "m1",
                                              "member_epoch": epoch, "topics": None}],
                                  "require_stable": False})

        fresh = await exchange(router(service), fetch(epoch))
        assert fresh.action == "rewrite" and fresh.sent is not None
        assert fresh.sent["groups"][0]["member_id"] is None  # the broker's group is classic
        stale = await exchange(router(service), fetch(epoch - 1))
        assert stale.response is not None and stale.response["groups"][0]["error_code"] == 113
        nursery.cancel_scope.cancel()


async def test_stopping_tells_bridged_clients_to_let_go_then_leaves(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with running(broker) as (service, nursery):
        epoch, parts = await joined(service, "m1")
        answers: list[int] = []

        async def client() -> None:
            await trio.sleep(1)
            answers.append((await service.heartbeat(hb("m1", epoch, owned=parts))).error_code)

        nursery.start_soon(client)
        await service.let_go(10)
        assert answers == [25]  # UNKNOWN_MEMBER_ID: it drops its partitions first
        await trio.sleep(0.1)
        assert broker.of(ApiKey.LEAVE_GROUP)
        await service.aclose()
        assert not service.bridges.members



async def test_a_group_with_a_bridged_member_is_a_conversion_candidate() -> None:
    """Every member marked, one of them bridged: the group converts (the bridged member is
    adopted under its client's KIP-848 member id)."""
    from proxy.coordination.upgrade import member_mark

    from .test_upgrade import GROUP as UPGRADED
    from .test_upgrade import _forward_join, _service

    service = _service()
    here = service.upgrades.mark_address
    forwarded = member_mark(here, "app-a") + "-0b6f9a4c-1d2e-4f3a-9b8c-7d6e5f4a3b2c"
    bridged = member_mark(here, "app-b", "kip848-m1") + "-1b6f9a4c-1d2e-4f3a-9b8c-7d6e5f4a3b2c"
    await _forward_join(service, forwarded, forwarded, [forwarded, bridged])
    assert UPGRADED in service.upgrades.candidates
    # a bridged member made leader notes the candidate too
    service.upgrades.candidates.clear()
    service.upgrades.note_leader(UPGRADED, 9, frozenset({forwarded, bridged}))
    assert service.upgrades.candidates[UPGRADED].generation == 9


async def test_with_migration_policy_disabled_a_kip848_join_is_refused_as_kafka_refuses_it(
        autojump_clock: trio.testing.MockClock) -> None:
    broker = Broker()
    async with running(broker, migration_policy="disabled") as (service, nursery):
        response = await service.heartbeat(hb("m1", 0))
        assert response.error_code == 69, response  # GROUP_ID_NOT_FOUND
        assert "disabled" in (response.error_message or "")
        assert not broker.of(ApiKey.JOIN_GROUP) or all(  # only the refused lock's join
            p["name"] == "groupgate-coordinated" for v in broker.of(ApiKey.JOIN_GROUP)
            for p in v["protocols"])
        assert not service.bridges.members
        nursery.cancel_scope.cancel()


async def test_a_conversion_suspends_bridged_members_then_ends_them_without_a_word(
        autojump_clock: trio.testing.MockClock) -> None:
    """While a conversion is announced the member sends nothing to the broker; aborted, it
    goes on; done, its task ends with no LeaveGroup (the conversion removed it) and its
    client's next heartbeat is no longer the bridge's."""
    broker = Broker()
    async with running(broker) as (service, nursery):
        epoch, parts = await joined(service, "m1")
        assert service.bridges.timeouts(GROUP) == {
            "bridged-1": [service.bridges.settings.client_session_ms, 10_000]}
        # its client has not heartbeated at the epoch yet: it would be fenced if adopted
        assert "has not heartbeated" in (service.bridges.unconvertible(GROUP, epoch) or "")
        await service.heartbeat(hb("m1", epoch, owned=parts))
        assert service.bridges.unconvertible(GROUP, epoch) is None  # stable, client told
        assert "not stable" in (service.bridges.unconvertible(GROUP, epoch + 1) or "")
        assert service.bridges.suspend(GROUP) == 1
        assert await service.bridges.drained(GROUP, 1.0)
        beats = len(broker.of(ApiKey.HEARTBEAT))
        await trio.sleep(4)  # within the client's session: the member is kept
        assert len(broker.of(ApiKey.HEARTBEAT)) == beats  # suspended: nothing sent
        service.bridges.resume(GROUP)
        await trio.sleep(1)
        assert len(broker.of(ApiKey.HEARTBEAT)) > beats
        assert service.bridges.convert_away(GROUP) == 1
        await trio.sleep(0.1)
        assert not service.bridges.has_group(GROUP) and not service.bridges.members
        assert not broker.of(ApiKey.LEAVE_GROUP)
        assert await service.bridges.heartbeat(hb("m1", epoch, owned=parts), 0) is None
        nursery.cancel_scope.cancel()


def regex_hb(member: str, epoch: int, regex: str | None, owned: list[int] | None = None,
             rights: Any = None) -> ConsumerGroupHeartbeatRequest:
    value: dict[str, Any] = {"group_id": GROUP, "member_id": member, "member_epoch": epoch,
                             "rebalance_timeout_ms": 10_000 if epoch == 0 else -1,
                             # librdkafka sends an empty list of names beside its regex
                             "subscribed_topic_names": [] if regex else None,
                             "subscribed_topic_regex": regex,
                             "topic_partitions": [] if epoch == 0 else None}
    if owned is not None:
        value["topic_partitions"] = [{"topic_id": TOPIC_ID, "partitions": owned}]
    request = consumer_heartbeat(value, client_id="app", client_host="/h", api_version=1)
    return dataclasses.replace(request, topic_rights=rights) if rights is not None else request


async def test_a_regex_subscriber_is_bridged_with_its_regex_resolved_and_rejoins_on_change(
        autojump_clock: trio.testing.MockClock) -> None:
    """A KIP-848 client subscribing by regex is bridged with the names of the watched topics
    the regex matches; a new matching topic makes the bridged member rejoin with it, one the
    client may not DESCRIBE is left out, and the regex goes with the member into a
    conversion."""
    from translation.regex import TopicRights
    from translation.topics import TopicMetadata, TopicsImage

    other, later, hidden = f"{TOPIC}-2", f"{TOPIC}-3", f"{TOPIC}-secret"
    broker = Broker()
    async with running(broker) as (service, nursery):
        image = [TopicMetadata(TOPIC_ID, TOPIC, 4), TopicMetadata(uuid.UUID(int=2),
                                                                  "unrelated", 2)]
        service.engine.update_topics(TopicsImage.of(image), 0)
        regex = f"{TOPIC}.*"
        response = await service.heartbeat(regex_hb("m1", 0, regex))
        while response.member_epoch <= 0:
            assert response.error_code in (0, 14), response
            await trio.sleep(0.5)
            response = await service.heartbeat(regex_hb("m1", 0, None))
        joins = broker.of(ApiKey.JOIN_GROUP)

        def subscribed(join: dict[str, Any]) -> list[str]:
            subscription = parse_subscription(join["protocols"][0]["metadata"])
            assert subscription is not None
            return sorted(subscription.topics)

        assert subscribed(joins[-1]) == [TOPIC]
        assert service.bridges.has_regex()
        assert service._wanted_topics()[1]  # the sidecar lists every topic meanwhile
        before = len(joins)
        image.append(TopicMetadata(uuid.UUID(int=3), other, 2))
        service.engine.update_topics(TopicsImage.of(image), 1000)
        epoch = response.member_epoch
        parts = [p for tp in response.assignment or () for p in tp.partitions]
        for _ in range(20):  # its client's heartbeats: the member rejoins with both topics
            answer = await service.heartbeat(regex_hb("m1", epoch, None, owned=parts))
            epoch = max(epoch, answer.member_epoch)
            await trio.sleep(0.5)
            if len(broker.of(ApiKey.JOIN_GROUP)) > before:
                break
        assert subscribed(broker.of(ApiKey.JOIN_GROUP)[-1]) == sorted([TOPIC, other])
        # a match the client may not DESCRIBE is left out; one not checked yet stays out too
        image += [TopicMetadata(uuid.UUID(int=4), hidden, 1),
                  TopicMetadata(uuid.UUID(int=5), later, 1)]
        service.engine.update_topics(TopicsImage.of(image), 2000)
        assert service.bridges.regex_topics_to_check(GROUP, "m1") == frozenset(
            {TOPIC, other, hidden, later})
        rights = TopicRights(frozenset({TOPIC, other, hidden}), frozenset({TOPIC, other}))
        bridge = service.bridges.member(GROUP, "m1")
        assert bridge is not None
        joins_now = len(broker.of(ApiKey.JOIN_GROUP))
        await service.heartbeat(regex_hb("m1", epoch, None, rights=rights))
        assert bridge.resolved == frozenset({TOPIC, other})
        assert len(broker.of(ApiKey.JOIN_GROUP)) == joins_now  # nothing changed: no rejoin
        # the regex goes with the member into a conversion
        assert service.bridges.regexes(GROUP) == {bridge.machine.broker_member_id: regex}
        # an invalid new regex is refused, the member stays as it was
        bad = await service.heartbeat(regex_hb("m1", epoch, "("))
        assert bad.error_code == 128  # INVALID_REGULAR_EXPRESSION
        assert bridge.regex == regex
        nursery.cancel_scope.cancel()
