"""Several sidecars, one group: the card in the broker's group, who holds a group, where its
requests go, and the broker membership as an election and a lease."""

from __future__ import annotations

from typing import Any

import trio

from proxy.codec.api_keys import ApiKey
from proxy.coordination.convert import parse_subscription
from proxy.coordination.fleet import (
    PROTOCOL_NAME,
    Card,
    Holder,
    card_of,
    mark_forwarded,
    read_holder,
    subscription_metadata,
    unmark,
)
from proxy.coordination.membership import LEASE_FRACTION, BrokerMembership
from proxy.coordination.peers import (
    LOCAL,
    LOOKUP,
    LOOKUP_SECONDS,
    REFUSE,
    RELAY,
    Directory,
    Routes,
    lookup_wait,
)
from proxy.security.session import Session
from tests.unit.coordination.test_fuzz_requests import stub_broker

from .helpers import (
    COORDINATOR,
    FakeLink,
    FakePool,
    coordinate,
    exchange,
    make_service,
    request,
    router,
)

PEER = ("10.233.0.3", 9191)
SELF = ("10.233.0.2", 9191)
NOT_COORDINATOR = 16
COORDINATOR_NOT_AVAILABLE = 15
UNKNOWN_MEMBER_ID = 25
REBALANCE_IN_PROGRESS = 27


def member(member_id: str, metadata: bytes | None) -> dict[str, Any]:
    return {"member_id": member_id, "group_instance_id": None, "client_id": "groupgate",
            "client_host": "/10.233.0.3", "member_metadata": metadata, "member_assignment": b""}


def described(*members: dict[str, Any], protocol: str = PROTOCOL_NAME) -> dict[str, Any]:
    return {"error_code": 0, "group_id": "g", "group_state": "Stable" if members else "Empty",
            "protocol_type": "consumer", "protocol_data": protocol if members else "",
            "members": list(members), "authorized_operations": -2147483648}


# -- the card ------------------------------------------------------------------------------


def test_the_card_rides_in_a_subscription_the_broker_still_reads_as_one() -> None:
    card = Card(PEER, "0.2.0")
    metadata = subscription_metadata(["orders", "payments"], card)
    subscription = parse_subscription(metadata)
    assert subscription is not None and subscription.topics == ("orders", "payments")
    assert card_of(metadata) == card
    assert card_of(subscription_metadata([], Card(None, "0.2.0"))) == Card(None, "0.2.0")


def test_anything_else_is_no_card() -> None:
    assert card_of(None) is None and card_of(b"") is None and card_of(b"\x00\x00junk") is None
    assert Card.decode(b"groupgate-fleet:{not json") is None
    assert Card.decode(b"groupgate-fleet:{\"address\":\"h:1\"}") is None  # no protocol


def test_who_holds_a_group() -> None:
    ours = subscription_metadata(["t"], Card(PEER, "0.2.0"))
    legacy = subscription_metadata(["t"], Card(None, "x"))[:-1]  # garbled user data
    assert read_holder(described()).kind == "free"
    holder = read_holder(described(member("m1", ours)))
    assert holder.kind == "sidecar" and holder.card == Card(PEER, "0.2.0") and holder.followable
    assert read_holder(described(member("m1", b"\x00\x00\x00\x00\x00\x00"))).kind == "legacy"
    assert read_holder(described(member("m1", legacy))).kind == "legacy"
    assert read_holder(described(member("c1", b"..."), protocol="range")).kind == "broker"
    assert read_holder(described(member("m1", ours)), frozenset({"m1"})).kind == "free"
    assert read_holder({"error_code": 15, "group_id": "g"}).kind == "unknown"


def test_the_holder_is_the_leader_whatever_order_the_broker_lists_the_members_in() -> None:
    """Two sidecars joined the broker's group at about the same time (a start-up race): until
    the one that lost the election has left, DescribeGroups lists both cards, in no
    particular order. The holder is the leader, whose assignment carries its card (it gives
    the card to itself only); the loser's empty assignment says nothing."""
    from proxy.coordination.membership import _ASSIGNMENT, lock_assignment

    holder_card, loser_card = Card(PEER, "0.2.0"), Card(("10.233.0.9", 9093), "0.2.0")
    holder = dict(member("m-holder", subscription_metadata(["t"], holder_card)),
                  member_assignment=lock_assignment(holder_card))
    loser = dict(member("m-loser", subscription_metadata(["t"], loser_card)),
                 member_assignment=_ASSIGNMENT)
    for members in ((holder, loser), (loser, holder)):
        seen = read_holder(described(*members))
        assert (seen.kind, seen.card, seen.member_id) == ("sidecar", holder_card, "m-holder")
    # before anyone synced (no assignment yet): the first card, as before
    unsynced = [dict(m, member_assignment=b"") for m in (loser, holder)]
    assert read_holder(described(*unsynced)).member_id == "m-loser"
    garbled = dict(holder, member_assignment=b"\x00\x01junk")
    assert read_holder(described(loser, garbled)).member_id == "m-loser"


def test_relayed_requests_carry_the_application_s_client_id_host_listener_and_software(
) -> None:
    from proxy.coordination.fleet import Relayed

    marked = mark_forwarded("app|1", "/10.233.0.4", 2, ("librdkafka", "2.16.0"))
    assert unmark(marked) == Relayed("app|1", "/10.233.0.4", 2, ("librdkafka", "2.16.0"))
    assert unmark(mark_forwarded(None, "/h")) == Relayed("", "/h", None, None)
    assert unmark("app-1") is None and unmark(None) is None
    assert unmark("groupgate-fleet|x|/h||app") is None  # a node id that is not a number
    assert unmark("groupgate-fleet|1|/h") is None  # cut short
    assert unmark("groupgate-fleet2|1|/h||app") is None  # protocol 2 without the principal


def test_protocol_2_marks_carry_the_principal_and_protocol_1_marks_are_still_read() -> None:
    from proxy.coordination.fleet import FLEET_PROTOCOL, Relayed

    assert FLEET_PROTOCOL == 3  # 3 marks relays as 2 does
    odd = "User:a|b%7C"  # separators and escapes in a name survive the round trip
    marked = mark_forwarded("app", "/h", 1, ("java", "4.1"), odd)
    assert marked.startswith("groupgate-fleet2|")
    assert unmark(marked) == Relayed("app", "/h", 1, ("java", "4.1"), odd)
    assert unmark(mark_forwarded("app", "/h", None, None, None)) == Relayed(
        "app", "/h", None, None, None)
    # a holder that speaks protocol 1 (its card says so) gets the mark it reads: no principal
    old = mark_forwarded("app|x", "/h", 3, ("java", "4.1"), "User:alice", protocol=1)
    assert old == "groupgate-fleet|3|/h|java/4.1|app|x"
    assert unmark(old) == Relayed("app|x", "/h", 3, ("java", "4.1"), None)


# -- routes ----------------------------------------------------------------------------------


def routes(held: set[str], views: dict[str, Holder]) -> Routes:
    directory = Directory(lambda: FakePool(stub_broker), [("b", 1)])
    for group_id, holder in views.items():
        directory._views[group_id] = holder
    return Routes(held.__contains__, directory, SELF)


async def test_where_a_group_s_requests_go() -> None:
    peer = Holder("sidecar", Card(PEER, "0.2.0"), "m1")
    table = routes({"mine"}, {
        "peer": peer, "free": Holder("free"), "direct": Holder("broker"),
        "restarted": Holder("sidecar", Card(SELF, "0.2.0"), "m0"),
        "old": Holder("legacy", detail="0.1.0"),
        "unlistened": Holder("sidecar", Card(None, "0.2.0"), "m2")})
    assert table.route(["mine"]).kind == LOCAL
    assert table.route(["peer"]).kind == RELAY and table.route(["peer"]).address == PEER
    assert table.route(["free"]).kind == LOCAL and table.route(["direct"]).kind == LOCAL
    assert table.route(["restarted"]).kind == LOCAL  # its own old member: take over
    assert table.route(["old"]).kind == REFUSE
    # a holder without a fleet listener cannot be followed: take over, the broker decides
    assert table.route(["unlistened"]).kind == LOCAL
    assert table.route(["never-seen"]).kind == LOOKUP
    assert table.route(["", " "]).kind == LOCAL  # the handlers answer INVALID_GROUP_ID
    assert table.route([]).kind == LOCAL
    assert table.route(["mine", "never-seen"]).kind == LOOKUP
    assert table.route(["mine", "peer"]).kind == LOCAL  # a describe of both: answered here


def _held_by_peer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    """A broker whose group ``g`` a 0.2.0 sidecar at ``PEER`` holds (its lock member m1)."""
    if key == ApiKey.DESCRIBE_GROUPS:
        card = subscription_metadata(["t"], Card(PEER, "0.2.0"))
        return {"throttle_time_ms": 0, "groups": [described(member("m1", card))]}
    return stub_broker(key, version, value)


async def test_a_lookup_asks_the_group_s_broker_coordinator_and_is_remembered(
        autojump_clock: trio.abc.Clock) -> None:
    broker = _held_by_peer
    pool = FakePool(broker)
    table = Routes(lambda _g: False, Directory(lambda: pool, [("b", 1)]), SELF)
    route = await table.lookup(["g"])
    assert route.kind == RELAY and route.address == PEER
    assert table.route(["g"]).kind == RELAY
    assert table.directory.last_kind("g") == "sidecar"
    described_ = [k for k, _v, _ in pool.fake.requests if k == ApiKey.DESCRIBE_GROUPS]
    assert len(described_) == 1
    await trio.sleep(5)  # a held group's view lasts longer than a free one's
    assert table.route(["g"]).kind == RELAY
    await trio.sleep(30)  # then it ages out; the memory of the holder's kind does not
    assert table.route(["g"]).kind == LOOKUP and table.directory.last_kind("g") == "sidecar"


async def test_a_free_group_is_looked_at_again_soon(autojump_clock: trio.abc.Clock) -> None:
    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == ApiKey.DESCRIBE_GROUPS:
            return {"throttle_time_ms": 0, "groups": [described()]}
        return stub_broker(key, version, value)

    table = Routes(lambda _g: False, Directory(lambda: FakePool(broker), [("b", 1)]), SELF)
    assert (await table.lookup(["g"])).kind == LOCAL
    await trio.sleep(5)
    assert table.route(["g"]).kind == LOOKUP



class _OutOfReach(FakeLink):
    """A broker link whose answers wait until ``reachable`` is set (the sidecar cut off from
    the broker)."""

    def __init__(self, answer: Any) -> None:
        super().__init__(answer)
        self.reachable = trio.Event()

    async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                      timeout: float | None = None, client_id: str | None = None
                      ) -> dict[str, Any]:
        self.requests.append((api_key, version, value))
        await self.reachable.wait()
        return self.answer(api_key, version, value)


async def test_a_request_waits_for_a_lookup_half_a_heartbeat_interval_at_most(
        autojump_clock: trio.abc.Clock) -> None:
    """A follower that cannot reach the broker: the request that starts the lookup is refused
    (COORDINATOR_NOT_AVAILABLE) half a heartbeat interval after it began, and one coming
    while the lookup goes on at once (a heartbeat queued behind a commit on its connection is
    not held in turn), without asking again; the lookup goes on, and the holder it finds
    once the broker answers is followed."""
    assert lookup_wait(5_000) == 2.5 and lookup_wait(60_000) == LOOKUP_SECONDS
    broker = _held_by_peer
    pool = FakePool(broker)
    link = pool.fake = _OutOfReach(broker)
    directory = Directory(lambda: pool, [("b", 1)])
    table = Routes(lambda _g: False, directory, SELF, lookup_wait=lookup_wait(1_000))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            directory.background = nursery
            began = trio.current_time()
            route = await table.lookup(["g"])
            assert route.kind == REFUSE and trio.current_time() - began == 0.5
            await trio.sleep(1.0)
            later = trio.current_time()
            assert (await table.lookup(["g"])).kind == REFUSE
            assert trio.current_time() == later and len(link.requests) == 1
            link.reachable.set()
            await trio.sleep(0.1)
    assert table.route(["g"]).kind == RELAY and table.route(["g"]).address == PEER
    # without a place for lookups to go on in, the request waits for the whole lookup
    inline = Routes(lambda _g: False, Directory(lambda: FakePool(broker), [("b", 1)]), SELF,
                    lookup_wait=lookup_wait(1_000))
    assert (await inline.lookup(["g"])).kind == RELAY

# -- the router ------------------------------------------------------------------------------

HEARTBEAT_V0 = {"group_id": "g", "member_id": "m-1", "member_epoch": 3, "instance_id": None,
                "rack_id": None, "rebalance_timeout_ms": -1, "subscribed_topic_names": None,
                "server_assignor": None, "topic_partitions": None}


async def test_a_follower_relays_a_held_group_s_request_marked_and_answers_with_the_reply(
) -> None:
    answered = {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                "member_id": "m-1", "member_epoch": 3, "heartbeat_interval_ms": 5000,
                "assignment": None}

    def peer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        assert key == ApiKey.CONSUMER_GROUP_HEARTBEAT and value["member_id"] == "m-1"
        return answered

    service = make_service(peer)
    service.directory._views["g"] = Holder("sidecar", Card(PEER, "0.2.0"), "m1")
    result = await exchange(router(service, fleet=True),
                            request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, HEARTBEAT_V0))
    assert result.action == "local" and result.response == answered
    assert service.pool.addresses == [PEER]  # type: ignore[attr-defined]
    assert service.pool.fake.client_ids == [  # type: ignore[attr-defined]
        mark_forwarded("client-1", "/10.0.0.7", 1)]


async def test_a_relay_carries_the_principal_as_the_coordinating_sidecar_s_protocol_reads_it(
) -> None:
    answered = {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                "member_id": "m-1", "member_epoch": 3, "heartbeat_interval_ms": 5000,
                "assignment": None}
    service = make_service(lambda key, version, value: answered)
    alice = Session("broker 1", mechanism="SCRAM-SHA-512", user="alice", authenticated=True)
    for protocol, mark in ((2, "groupgate-fleet2|1|/10.0.0.7||User:alice|client-1"),
                           (1, "groupgate-fleet|1|/10.0.0.7||client-1")):
        service.directory._views["g"] = Holder("sidecar", Card(PEER, "0.3.0", protocol), "m1")
        service.pool.fake.client_ids.clear()  # type: ignore[attr-defined]
        result = await exchange(router(service, fleet=True, session=alice),
                                request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, HEARTBEAT_V0))
        assert result.response == answered
        assert service.pool.fake.client_ids == [mark]  # type: ignore[attr-defined]


async def test_a_relayed_heartbeat_waits_for_the_coordinator_only_a_broker_session() -> None:
    """A frozen or unreachable coordinator must not keep a follower's members waiting on a
    relay for minutes (its broker membership ends within a broker session, and another sidecar
    can take the group over only once the follower looks again): heartbeats wait 6 s, other
    requests 20 s; only a JoinGroup or SyncGroup, which the coordinator may hold for the
    member's rebalance timeout, waits up to 330 s."""
    from proxy.coordination.peers import relay_timeout

    answered = {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                "member_id": "m-1", "member_epoch": 3, "heartbeat_interval_ms": 5000,
                "assignment": None}
    service = make_service(lambda key, version, value: answered)
    service.directory._views["g"] = Holder("sidecar", Card(PEER, "0.3.0"), "m1")
    await exchange(router(service, fleet=True),
                   request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, HEARTBEAT_V0))
    assert service.pool.fake.timeouts == [6.0]  # type: ignore[attr-defined]
    assert relay_timeout(ApiKey.HEARTBEAT) == 6.0
    assert relay_timeout(ApiKey.OFFSET_COMMIT) == 20.0
    assert relay_timeout(ApiKey.JOIN_GROUP) == relay_timeout(ApiKey.SYNC_GROUP) == 330.0


async def test_a_relay_that_fails_answers_not_coordinator_and_looks_again() -> None:
    def unreachable(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        from proxy.upstream import UpstreamError
        raise UpstreamError("connection refused")

    service = make_service(unreachable)
    service.directory._views["g"] = Holder("sidecar", Card(PEER, "0.2.0"), "m1")
    result = await exchange(router(service, fleet=True),
                            request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, HEARTBEAT_V0))
    assert result.response is not None and result.response["error_code"] == NOT_COORDINATOR
    assert service.directory.view("g") is None


async def test_a_relayed_request_for_a_group_not_held_here_is_not_relayed_again() -> None:
    service = make_service(stub_broker)
    service.directory._views["g"] = Holder("sidecar", Card(PEER, "0.2.0"), "m1")
    info = request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, HEARTBEAT_V0,
                   client_id=mark_forwarded("app", "/10.233.0.9"))
    result = await exchange(router(service, inbound=True), info)
    assert result.response is not None and result.response["error_code"] == NOT_COORDINATOR
    assert service.pool.fake.requests == []  # type: ignore[attr-defined]


async def test_a_relayed_request_for_a_group_held_here_is_served_as_the_application_s(
) -> None:
    service = make_service(stub_broker)
    coordinate(service, "g")
    info = request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                   dict(HEARTBEAT_V0, member_id="", member_epoch=0, rebalance_timeout_ms=30000,
                        subscribed_topic_names=["orders"], topic_partitions=[]),
                   client_id=mark_forwarded("app-7", "/10.233.0.9"))
    result = await exchange(router(service, inbound=True), info)
    assert result.response is not None and result.response["error_code"] == 0
    group = service.engine.group("g")
    assert group is not None
    (engine_member,) = group.members.values()
    assert (engine_member.client_id, engine_member.client_host) == ("app-7", "/10.233.0.9")


async def test_only_the_fleet_listener_trusts_the_relay_mark() -> None:
    """An application cannot pass itself off as another sidecar's relay: on a client listener
    a marked client id is just a client id."""
    service = make_service(stub_broker)
    coordinate(service, "g")
    info = request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                   dict(HEARTBEAT_V0, member_id="", member_epoch=0, rebalance_timeout_ms=30000,
                        subscribed_topic_names=["orders"], topic_partitions=[]),
                   client_id=mark_forwarded("app-7", "/10.233.0.9"))
    result = await exchange(router(service, fleet=True), info)
    assert result.response is not None and result.response["error_code"] == 0
    group = service.engine.group("g")
    assert group is not None
    (engine_member,) = group.members.values()
    assert engine_member.client_host == "/10.0.0.7"


async def test_on_the_fleet_listener_only_a_fleet_peer_s_mark_is_believed() -> None:
    """A connection on the fleet listener that did not prove it is a sidecar (a SASL user not
    in fleet-users, before the gate closes it) cannot pass itself off as a relay either."""
    service = make_service(stub_broker)
    coordinate(service, "g")
    info = request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                   dict(HEARTBEAT_V0, member_id="", member_epoch=0, rebalance_timeout_ms=30000,
                        subscribed_topic_names=["orders"], topic_partitions=[]),
                   client_id=mark_forwarded("app-7", "/10.233.0.9", None, None, "User:admin"))
    stranger = Session("fleet", mechanism="PLAIN", user="mallory", authenticated=True)
    result = await exchange(router(service, None, inbound=True, session=stranger), info)
    assert result.response is not None and result.response["error_code"] == 0
    group = service.engine.group("g")
    assert group is not None
    (engine_member,) = group.members.values()
    assert engine_member.client_host == "/10.0.0.7"
    assert engine_member.client_id is not None and engine_member.client_id.startswith(
        "groupgate-fleet2|")


COMMIT_V9 = {"group_id": "g", "generation_id_or_member_epoch": 1, "member_id": "",
             "group_instance_id": None, "retention_time_ms": -1, "topics": [
                 {"name": "orders", "partitions": [
                     {"partition_index": 0, "committed_offset": 42,
                      "committed_leader_epoch": -1, "committed_metadata": None}]}]}


async def test_a_relayed_commit_goes_to_the_group_s_broker_coordinator_stamped() -> None:
    """On the fleet listener, the connection's own upstream leads to a bootstrap server; the
    commit must go to the broker that coordinates the group, under the proxy's membership."""
    commits: list[dict[str, Any]] = []
    versions: list[int] = []

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == ApiKey.OFFSET_COMMIT:
            commits.append(value)
            versions.append(version)
            return {"throttle_time_ms": 0, "topics": [
                {"name": t["name"], "partitions": [
                    {"partition_index": p["partition_index"], "error_code": 0}
                    for p in t["partitions"]]} for t in value["topics"]]}
        return stub_broker(key, version, value)

    service = make_service(broker)
    coordinate(service, "g")
    join = dict(HEARTBEAT_V0, member_id="", member_epoch=0, rebalance_timeout_ms=30000,
                subscribed_topic_names=["orders"], topic_partitions=[])
    fleet_router = router(service, None, inbound=True)
    joined = await exchange(fleet_router, request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, join,
                                                  client_id=mark_forwarded("app", "/h")))
    assert joined.response is not None and joined.response["error_code"] == 0
    member_id, epoch = joined.response["member_id"], joined.response["member_epoch"]
    commit = dict(COMMIT_V9, member_id=member_id, generation_id_or_member_epoch=epoch)
    service.pool.addresses.clear()  # type: ignore[attr-defined]
    result = await exchange(fleet_router, request(ApiKey.OFFSET_COMMIT, 9, commit, 9,
                                                  client_id=mark_forwarded("app", "/h")))
    assert result.action == "local" and result.response is not None
    assert result.response["topics"][0]["partitions"][0]["error_code"] == 0
    assert service.pool.addresses == [COORDINATOR]  # type: ignore[attr-defined]
    assert [(c["member_id"], c["generation_id_or_member_epoch"]) for c in commits] == [
        ("proxy-member", 7)]
    assert versions == [8]  # v9 is v8 on the wire, and brokers before 3.7 lack v9
    membership = service.memberships["g"]
    assert membership.commits.count == 0  # released once answered


async def test_a_relayed_commit_for_a_group_no_longer_held_is_refused() -> None:
    service = make_service(stub_broker)
    result = await exchange(router(service, None, inbound=True),
                            request(ApiKey.OFFSET_COMMIT, 9, COMMIT_V9,
                                    client_id=mark_forwarded("app", "/h")))
    assert result.response is not None
    assert result.response["topics"][0]["partitions"][0]["error_code"] == NOT_COORDINATOR
    assert service.pool.fake.requests == []  # type: ignore[attr-defined]


async def test_a_group_an_old_groupgate_holds_is_refused_and_its_partitions_dropped() -> None:
    """A groupgate 0.1.0 hands partitions out on its own: members here must not join, and
    members that hold partitions (from this fleet's coordinator before the old one appeared)
    must let them go."""
    service = make_service(stub_broker)
    service.directory._views["g"] = Holder("legacy", detail="0.1.0")
    r = router(service, fleet=True)
    held = await exchange(r, request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, HEARTBEAT_V0))
    assert held.response is not None and held.response["error_code"] == UNKNOWN_MEMBER_ID
    join = await exchange(r, request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, dict(
        HEARTBEAT_V0, member_id="", member_epoch=0, rebalance_timeout_ms=30000,
        subscribed_topic_names=["orders"], topic_partitions=[])))
    assert join.response is not None
    assert join.response["error_code"] == COORDINATOR_NOT_AVAILABLE


# -- the membership: an election and a lease -------------------------------------------------


def contested(leader: str, others: list[dict[str, Any]] | None = None,
              sent: list[tuple[int, dict[str, Any]]] | None = None) -> Any:
    """A broker whose group already has ``leader`` (another sidecar) when the proxy joins."""
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if sent is not None:
            sent.append((key, value))
        reply = stub_broker(key, version, value)
        if key == ApiKey.JOIN_GROUP:
            reply["leader"] = leader
            if leader == reply["member_id"]:
                reply["members"] = reply["members"] + (others or [])
            else:
                reply["members"] = []
        return reply
    return answer


async def test_a_sidecar_that_joined_second_leaves_and_does_not_coordinate(
        autojump_clock: trio.abc.Clock) -> None:
    sent: list[tuple[int, dict[str, Any]]] = []
    membership = BrokerMembership("g", FakePool(contested("other", sent=sent)), [("b", 1)],
                                  connect_timeout=5, card=Card(SELF, "0.2.0"))
    await membership.run()
    assert membership.failure is not None and "another sidecar" in membership.failure
    assert not membership.stable and not membership.established
    assert [k for k, _ in sent].count(ApiKey.LEAVE_GROUP) == 1
    assert not any(k == ApiKey.SYNC_GROUP for k, _ in sent)


async def test_the_leader_never_coordinates_next_to_a_groupgate_without_a_card(
        autojump_clock: trio.abc.Clock) -> None:
    old = {"member_id": "old", "group_instance_id": None,
           "metadata": b"\x00\x00\x00\x00\x00\x01t\xff\xff\xff\xff"}
    membership = BrokerMembership("g", FakePool(contested("proxy-member-1", [old])),
                                  [("b", 1)], connect_timeout=5, card=Card(SELF, "0.2.0"))
    await membership.run()
    assert membership.failure is not None and "0.1.0" in membership.failure


async def test_the_lease_ends_before_the_broker_can_give_the_group_away(
        autojump_clock: trio.abc.Clock) -> None:
    silent = trio.Event()

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        return stub_broker(key, version, value)

    pool = FakePool(broker)
    original = pool.fake.request

    async def request_(api_key: int, version: int, value: dict[str, Any], **kw: Any
                       ) -> dict[str, Any]:
        if api_key == ApiKey.HEARTBEAT and silent.is_set():
            await trio.sleep_forever()  # the broker stopped answering
        return await original(api_key, version, value, **kw)

    pool.fake.request = request_  # type: ignore[method-assign]
    membership = BrokerMembership("g", pool, [("b", 1)], connect_timeout=5,
                                  session_timeout_ms=6000, card=Card(SELF, "0.2.0"))
    changes: list[tuple[float, bool]] = []
    membership.on_interrupted = lambda on: changes.append((trio.current_time(), on))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(membership.run)
        await membership.settled.wait()
        await trio.sleep(3)
        assert membership.stable
        last_answered = trio.current_time() - 1  # heartbeats at 2 s, 4 s...
        silent.set()
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    stopped = [t for t, on in changes if on]
    assert stopped, "the proxy kept acting without its lease"
    # the broker drops the member 6 s after the last heartbeat it received
    assert stopped[0] <= last_answered + LEASE_FRACTION * 6 + 0.01 < last_answered + 6


async def test_a_membership_the_broker_forgot_is_lost_not_joined_again(
        autojump_clock: trio.abc.Clock) -> None:
    forgotten = trio.Event()

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if forgotten.is_set() and key == ApiKey.HEARTBEAT:
            return {"throttle_time_ms": 0, "error_code": UNKNOWN_MEMBER_ID}
        if forgotten.is_set() and key == ApiKey.JOIN_GROUP and value.get("member_id"):
            return dict(stub_broker(key, version, value), error_code=UNKNOWN_MEMBER_ID)
        return stub_broker(key, version, value)

    membership = BrokerMembership("g", FakePool(broker), [("b", 1)], connect_timeout=5,
                                  card=Card(SELF, "0.2.0"))
    lost: list[str] = []
    membership.on_lost = lost.append
    async with trio.open_nursery() as nursery:
        nursery.start_soon(membership.run)
        await membership.settled.wait()
        forgotten.set()
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert len(lost) == 1 and not membership.stable and membership.left


async def test_losing_the_lease_forgets_the_group_and_answers_its_held_requests() -> None:
    service = make_service(stub_broker)
    membership = coordinate(service, "g")
    service.apply(service.engine.heartbeat(
        __import__("tests.unit.coordination.helpers", fromlist=["consumer_heartbeat"])
        .consumer_heartbeat(dict(HEARTBEAT_V0, member_id="", member_epoch=0,
                                 rebalance_timeout_ms=30000, subscribed_topic_names=["orders"],
                                 topic_partitions=[]),
                            client_id="c", client_host="/h", api_version=0), 0)[1])
    assert service.engine.group("g") is not None
    assert membership.on_lost is not None
    membership.on_lost("another sidecar holds it")
    assert service.engine.group("g") is None and "g" not in service.memberships


def test_a_takeover_after_another_holder_waits_one_session_for_its_members() -> None:
    service = make_service(stub_broker, takeover_wait_ms=9000)
    assert service.config.takeover_wait_seconds == 9.0
    assert make_service(stub_broker).config.takeover_wait_seconds == 6.0  # the session
    # with the state log too: it applies only when the log has no state for the group
    assert make_service(stub_broker, state_log=True).config.takeover_wait_seconds == 6.0
    assert make_service(stub_broker, state_log=True,
                        takeover_wait_ms=9000).config.takeover_wait_seconds == 9.0


def _taken_over_at(generation: int) -> Any:
    """A broker whose group had ``generation - 1`` generations before the proxy joined."""
    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        reply = stub_broker(key, version, value)
        if key == ApiKey.JOIN_GROUP:
            reply["generation_id"] = generation
        return reply
    return broker


JOIN_V0 = dict(HEARTBEAT_V0, member_id="", member_epoch=0, rebalance_timeout_ms=30000,
               subscribed_topic_names=["orders"], topic_partitions=[])


async def test_every_join_after_a_takeover_waits_for_the_members_of_the_last_holder(
        autojump_clock: trio.abc.Clock) -> None:
    """The wait after taking a group over from another holder applies to every join, also when
    the join that started the takeover gave up before the broker's group was held (its client
    timed out and closed the connection)."""
    service = make_service(_taken_over_at(5))
    original = service.pool.fake.request  # type: ignore[attr-defined]

    async def slow_join(api_key: int, version: int, value: dict[str, Any], **kw: Any
                        ) -> dict[str, Any]:
        if api_key == ApiKey.JOIN_GROUP:
            await trio.sleep(4)  # the broker waits for the last holder's member to expire
        return await original(api_key, version, value, **kw)

    service.pool.fake.request = slow_join  # type: ignore[attr-defined]
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        r = router(service)
        with trio.move_on_after(1):  # the first join's client gives up
            await exchange(r, request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, JOIN_V0, 1))
        await trio.sleep(4)  # the broker's group is held by now (at 4 s)
        assert service.coordinates("g")
        again = await exchange(r, request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, JOIN_V0, 2))
        assert again.response is not None
        assert again.response["error_code"] == 14  # COORDINATOR_LOAD_IN_PROGRESS
        await trio.sleep(6)
        after = await exchange(r, request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, JOIN_V0, 3))
        assert after.response is not None and after.response["error_code"] == 0
        nursery.cancel_scope.cancel()


async def test_a_group_that_never_had_members_is_assigned_at_once(
        autojump_clock: trio.abc.Clock) -> None:
    service = make_service(_taken_over_at(1))
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        result = await exchange(router(service),
                                request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, JOIN_V0))
        assert result.response is not None and result.response["error_code"] == 0
        nursery.cancel_scope.cancel()


# -- FindCoordinator -------------------------------------------------------------------------


async def test_find_coordinator_is_left_to_the_broker_and_its_answer_rewritten() -> None:
    """Followers forward (decision record 0014): a client's coordinator is always its own
    sidecar's listener for the broker that coordinates the group."""
    service = make_service(stub_broker)
    result = await exchange(router(service, fleet=True),
                            request(ApiKey.FIND_COORDINATOR, 3, {"key": "g", "key_type": 0}))
    assert result.action == "forward"


async def test_a_request_too_large_to_decode_is_refused_for_a_group_another_sidecar_holds(
) -> None:
    """It cannot be relayed without decoding it; a group whose holder is not known yet goes to
    the broker, which refuses a commit carrying no member of its group."""
    import pytest

    from proxy.connection import FORWARD, RejectRequest

    service = make_service(stub_broker)
    service.directory._views["peer"] = Holder("sidecar", Card(PEER, "0.2.0"), "m1")
    r = router(service, fleet=True)
    for group_id, expected in (("peer", None), ("unknown", FORWARD)):
        info = request(ApiKey.OFFSET_COMMIT, 9, dict(COMMIT_V9, group_id=group_id))
        if expected is None:
            with pytest.raises(RejectRequest, match="another sidecar"):
                r.decide_oversized(info)
        else:
            assert r.decide_oversized(info) == expected


def test_a_rebalancing_broker_group_shows_no_cards_and_is_not_taken_for_an_old_groupgate(
) -> None:
    """Kafka leaves members' metadata out of DescribeGroups unless the group is Stable."""
    bare = dict(member("m1", b""), member_metadata=b"")
    for state in ("PreparingRebalance", "CompletingRebalance"):
        holder = read_holder(dict(described(bare), group_state=state, protocol_data=""))
        assert holder.kind == "unknown" and holder.settling, state
    assert read_holder(dict(described(), group_state="Empty")).kind == "free"


async def test_a_lookup_asks_again_while_the_broker_s_group_rebalances(
        autojump_clock: trio.abc.Clock) -> None:
    card = subscription_metadata(["t"], Card(PEER, "0.2.0"))
    answers = [dict(described(dict(member("m1", b""), member_metadata=b"")),
                    group_state="CompletingRebalance", protocol_data="")] * 2 + [
        described(member("m1", card))]

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == ApiKey.DESCRIBE_GROUPS:
            return {"throttle_time_ms": 0, "groups": [answers.pop(0)]}
        return stub_broker(key, version, value)

    table = Routes(lambda _g: False, Directory(lambda: FakePool(broker), [("b", 1)]), SELF)
    route = await table.lookup(["g"])
    assert route.kind == RELAY and route.address == PEER and answers == []


async def test_the_groups_of_one_request_are_looked_up_together(
        autojump_clock: trio.abc.Clock) -> None:
    """A describe of many groups none of which is known: one FindCoordinator (v4, every key)
    and one DescribeGroups per coordinating broker, not two requests per group; a group whose
    coordinator is not known yet (COORDINATOR_NOT_AVAILABLE) is asked for again alone, and a
    group the broker is rebalancing is looked up again alone."""
    card = subscription_metadata(["t"], Card(PEER, "0.2.0"))
    groups = [f"g{i}" for i in range(300)]
    unavailable = {"g7"}
    rebalancing = {"g9": 1}

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == ApiKey.FIND_COORDINATOR:
            assert version >= 4
            found = [{"key": k, "error_code": COORDINATOR_NOT_AVAILABLE if k in unavailable
                      else 0, "error_message": None, "node_id": int(k[1:]) % 2,
                      "host": "b", "port": int(k[1:]) % 2} for k in value["coordinator_keys"]]
            unavailable.clear()
            return {"throttle_time_ms": 0, "coordinators": found}
        if key == ApiKey.DESCRIBE_GROUPS:
            answers = []
            for g in value["groups"]:
                if rebalancing.get(g):
                    rebalancing[g] -= 1
                    answers.append(dict(described(dict(member("m1", b""), member_metadata=b"")),
                                        group_id=g, group_state="PreparingRebalance",
                                        protocol_data=""))
                elif g in ("g1", "g9"):
                    answers.append(dict(described(member("m1", card)), group_id=g))
                else:
                    answers.append(dict(described(), group_id=g))
            return {"throttle_time_ms": 0, "groups": answers}
        return stub_broker(key, version, value)

    pool = FakePool(broker)
    table = Routes(lambda _g: False, Directory(lambda: pool, [("b", 1)]), SELF)
    assert (await table.lookup(groups)).kind == LOCAL  # held in different places
    assert table.route(["g1"]).address == PEER and table.route(["g9"]).address == PEER
    assert all(table.route([g]).kind == LOCAL for g in groups if g not in ("g1", "g9"))
    asked = [(k, v) for k, _, v in pool.fake.requests]
    finds = [v["coordinator_keys"] for k, v in asked if k == ApiKey.FIND_COORDINATOR]
    describes = sorted(v["groups"] for k, v in asked if k == ApiKey.DESCRIBE_GROUPS)
    # 250 at a time (LOOKUP_BATCH): g7's coordinator asked for again alone before the first
    # batch is described, on its two brokers; g9 looked up again alone
    assert finds == [groups[:250], ["g7"], ["g9"], groups[250:]]
    assert sorted(map(len, describes)) == [1, 25, 25, 125, 125]
    assert ["g9"] in describes


async def test_concurrent_lookups_of_overlapping_groups_ask_once_for_each(
        autojump_clock: trio.abc.Clock) -> None:
    asked: list[str] = []

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == ApiKey.DESCRIBE_GROUPS:
            asked.extend(value["groups"])
            return {"throttle_time_ms": 0,
                    "groups": [dict(described(), group_id=g) for g in value["groups"]]}
        return stub_broker(key, version, value)

    directory = Directory(lambda: FakePool(broker), [("b", 1)])
    seen: list[dict[str, Holder]] = []

    async def look(groups: list[str]) -> None:
        seen.append(await directory.lookup_many(groups))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(look, ["a", "b", "c"])
        nursery.start_soon(look, ["b", "c", "d"])
    assert sorted(asked) == ["a", "b", "c", "d"]
    assert sorted(sorted(s) for s in seen) == [["a", "b", "c"], ["b", "c", "d"]]
    assert all(h.kind == "free" for s in seen for h in s.values())


async def test_a_membership_whose_broker_died_finds_the_new_coordinator_and_keeps_its_member(
        autojump_clock: trio.abc.Clock) -> None:
    """The broker coordinating the group is killed: the proxy asks FindCoordinator again
    instead of knocking on the dead broker until its member expires at the new coordinator."""
    from proxy.upstream import UpstreamError

    dead = trio.Event()
    died_at = [0.0]
    joins: list[tuple[tuple[str, int], str]] = []

    class Link:
        def __init__(self, address: tuple[str, int]) -> None:
            self.address = address

        async def request(self, api_key: int, version: int, value: dict[str, Any],
                          **_kw: Any) -> dict[str, Any]:
            if dead.is_set() and self.address == ("old", 1):
                raise UpstreamError("connection refused")
            if api_key == ApiKey.FIND_COORDINATOR:
                # the cluster names the dead broker until it has fenced it
                moved = dead.is_set() and trio.current_time() >= died_at[0] + 3
                return dict(stub_broker(api_key, version, value),
                            host="new" if moved else "old", port=1)
            if api_key == ApiKey.JOIN_GROUP:
                joins.append((self.address, value["member_id"]))
            if api_key == ApiKey.HEARTBEAT:
                await trio.sleep(0.001)
            return stub_broker(api_key, version, value)

        async def aclose(self) -> None:
            return None

    class Pool(FakePool):
        def link(self, address: tuple[str, int]) -> Any:
            return Link(address)

        def dedicated(self, address: tuple[str, int], request_timeout: float) -> Any:
            return Link(address)

    membership = BrokerMembership("g", Pool(stub_broker), [("bootstrap", 1)],
                                  connect_timeout=5, card=Card(SELF, "0.2.0"))
    lost: list[str] = []
    membership.on_lost = lost.append
    async with trio.open_nursery() as nursery:
        nursery.start_soon(membership.run)
        await membership.settled.wait()
        member_id = membership.member_id
        died_at[0] = trio.current_time()
        dead.set()
        await trio.sleep(5)
        assert membership.stable and membership.coordinator == ("new", 1) and not lost
        assert joins[-1] == (("new", 1), member_id)  # rejoined as the same member
        nursery.cancel_scope.cancel()


async def test_a_commit_for_a_group_this_sidecar_holds_but_does_not_know_is_told_to_rejoin(
) -> None:
    """After a takeover (or a restart) the engine knows no member yet: a member's commit gets
    UNKNOWN_MEMBER_ID, like its heartbeats, not GROUP_ID_NOT_FOUND, which clients treat as
    final."""
    service = make_service(stub_broker)
    coordinate(service, "g")
    result = await exchange(router(service), request(ApiKey.OFFSET_COMMIT, 9, dict(
        COMMIT_V9, member_id="m-1", generation_id_or_member_epoch=4)))
    assert result.response is not None
    assert result.response["topics"][0]["partitions"][0]["error_code"] == UNKNOWN_MEMBER_ID


async def test_a_commit_on_the_listener_of_a_broker_that_no_longer_coordinates_the_group_fails(
) -> None:
    """The broker coordinating the group moved (node 1 -> 2) while a client's commits were on
    its way to the old one: they must fail, as at Kafka, not land after the commits the client
    sends to the new coordinator."""
    service = make_service(stub_broker)
    membership = coordinate(service, "g")
    join = dict(HEARTBEAT_V0, member_id="", member_epoch=0, rebalance_timeout_ms=30000,
                subscribed_topic_names=["orders"], topic_partitions=[])
    joined = await exchange(router(service), request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, join))
    assert joined.response is not None
    commit = dict(COMMIT_V9, member_id=joined.response["member_id"],
                  generation_id_or_member_epoch=joined.response["member_epoch"])
    membership.coordinator_node = 2
    old = await exchange(router(service, node_id=1), request(ApiKey.OFFSET_COMMIT, 9, commit))
    assert old.response is not None
    assert old.response["topics"][0]["partitions"][0]["error_code"] == NOT_COORDINATOR
    new = await exchange(router(service, node_id=2), request(ApiKey.OFFSET_COMMIT, 9, commit))
    assert new.action == "rewrite"  # stamped and sent to the broker
    relayed = await exchange(router(service, None, inbound=True), request(
        ApiKey.OFFSET_COMMIT, 9, commit, client_id=mark_forwarded("app", "/h", 1)))
    assert relayed.response is not None  # the listener a relayed commit came in on counts
    assert relayed.response["topics"][0]["partitions"][0]["error_code"] == NOT_COORDINATOR


def test_the_card_carries_the_state_log_settings_and_older_cards_mean_unknown() -> None:
    from proxy.coordination.fleet import StateLogSettingsId

    mine = StateLogSettingsId.of(True, "_groupgate-group-state", "groupgate-state")
    card = Card(SELF, "0.3.0", state_log=mine)
    assert Card.decode(card.encode()) == card
    assert b"groupgate-state\"" not in card.encode().split(b"prefix")[1]  # a digest only
    off = Card(SELF, "0.3.0", state_log=StateLogSettingsId.of(False, "t", "p"))
    assert Card.decode(off.encode()) == off
    # a protocol-2 card (no state_log key) is read, its settings unknown: never a mismatch
    old = Card.decode(b'groupgate-fleet:{"protocol":2,"version":"0.2.0","address":"h:1"}')
    assert old is not None and old.state_log is None
    assert card.state_log_differences(old) == ()
    # unknown keys of later protocols are ignored
    newer = Card.decode(b'groupgate-fleet:{"protocol":4,"version":"9","address":"h:1",'
                        b'"state_log":{"topic":"t","prefix":"x"},"more":1}')
    assert newer is not None and newer.protocol == 4
    assert card.state_log_differences(newer) == ("state-log-topic",
                                                 "state-log-transactional-id-prefix")
    other_prefix = StateLogSettingsId.of(True, "_groupgate-group-state", "other")
    assert mine.differences(other_prefix) == ("state-log-transactional-id-prefix",)
    assert mine.differences(off.state_log) == ("state-log",)  # type: ignore[arg-type]


async def test_a_group_held_with_other_state_log_settings_is_never_taken_over(
        caplog: Any) -> None:
    from proxy import metrics
    from proxy.coordination.fleet import StateLogSettingsId

    mine = Card(SELF, "0.3.0", state_log=StateLogSettingsId.of(True, "state", "gg"))
    theirs = StateLogSettingsId.of(True, "state-b", "gg")
    directory = Directory(lambda: FakePool(stub_broker), [("b", 1)])
    directory._views.update({
        # this sidecar before its restart, rolled with another topic: its old member
        "restarted": Holder("sidecar", Card(SELF, "0.3.0", state_log=theirs), "m0"),
        "unlistened": Holder("sidecar", Card(None, "0.3.0", state_log=theirs), "m1"),
        "peer": Holder("sidecar", Card(PEER, "0.3.0", state_log=theirs), "m2"),
        "same": Holder("sidecar", Card(SELF, "0.3.0", state_log=mine.state_log), "m3"),
        "older": Holder("sidecar", Card(SELF, "0.2.0", protocol=2), "m4")})
    table = Routes(lambda _g: False, directory, SELF, mine)
    before = metrics.FLEET_SETTINGS_MISMATCHES.labels("state-log-topic")._value.get()
    with caplog.at_level("WARNING", "groupgate.coordination"):
        # before: LOCAL (taken over here, finding no state in this sidecar's topic)
        assert table.route(["restarted"]).kind == REFUSE
        assert table.route(["unlistened"]).kind == REFUSE
    assert "state-log-topic" in caplog.text and "state-b" in caplog.text
    assert metrics.FLEET_SETTINGS_MISMATCHES.labels("state-log-topic")._value.get() == before + 2
    # a holder that can be followed is still followed (it coordinates with its own log)
    assert table.route(["peer"]).kind == RELAY
    # progress: same settings, or a card that does not say, are taken over as before
    assert table.route(["same"]).kind == LOCAL and table.route(["older"]).kind == LOCAL


def test_protocol_3_marks_name_the_relaying_sidecar() -> None:
    from proxy.coordination.fleet import Relayed

    marked = mark_forwarded("app|1", "/h", 2, ("java", "4.1"), "User:a", 3, "10.0.0.7:9094")
    assert marked == "groupgate-fleet3|2|/h|java/4.1|User:a|10.0.0.7:9094||app|1"
    relayed = unmark(marked)
    assert relayed == Relayed("app|1", "/h", 2, ("java", "4.1"), "User:a", "10.0.0.7:9094")
    assert relayed is not None and relayed.protocol == 3
    # without a fleet address (or to a protocol-2 holder) the protocol-2 mark, as before
    assert mark_forwarded("app", "/h", None, None, None, 3).startswith("groupgate-fleet2|")
    assert mark_forwarded("app", "/h", None, None, None, 2, "x:1").startswith(
        "groupgate-fleet2|")
    assert unmark("groupgate-fleet3|1|/h||||app") is None  # cut short


async def test_a_group_handed_back_is_decided_here_without_a_lookup() -> None:
    """Its requests go to the broker's group, which a lookup during the broker's own
    rebalance could not name (``unknown``: refused), keeping its members from rejoining."""
    from proxy.coordination.peers import LOCAL, LOOKUP, REFUSE

    table = routes(set(), {"settling": Holder("unknown", detail="PreparingRebalance")})
    assert table.route(["settling"]).kind == REFUSE and table.route(["new"]).kind == LOOKUP
    table.decided_here = {"settling", "new"}.__contains__
    assert table.route(["settling"]).kind == LOCAL and table.route(["new"]).kind == LOCAL
