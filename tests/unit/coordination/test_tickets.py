"""Commit tickets: a commit of a member behind a follower is validated by the holder and sent by
the follower on the client's own connection (:mod:`proxy.coordination.tickets`).

A follower and a holder, each a service of its own, the follower's link to the holder's fleet
listener played by :class:`HolderLink`, which hands ``FleetControl`` bodies to the holder's
fleet-listener router and records every relayed request.
"""

from __future__ import annotations

import struct
from typing import Any

import trio

from proxy.codec.api_keys import ApiKey
from proxy.codec.header import encode_request_header
from proxy.connection import Local, RequestInfo
from proxy.coordination import tickets
from proxy.coordination.fleet import Card, Holder, mark_forwarded
from proxy.coordination.fleet_control import FLEET_CONTROL, FleetControlRouter
from proxy.coordination.service import CoordinatorService
from proxy.coordination.tickets import TicketBook
from proxy.security.session import Session
from tests.unit.coordination.test_fuzz_requests import stub_broker

from .helpers import FakePool, coordinate, exchange, make_service, request, router

HOLDER = ("10.0.0.9", 9095)
HEARTBEAT_V0 = {"group_id": "g", "member_id": "", "member_epoch": 0, "instance_id": None,
                "rack_id": None, "rebalance_timeout_ms": 30000,
                "subscribed_topic_names": ["orders"], "server_assignor": None,
                "topic_partitions": []}
COMMIT_V9 = {"group_id": "g", "generation_id_or_member_epoch": 1, "member_id": "",
             "group_instance_id": None, "retention_time_ms": -1, "topics": [
                 {"name": "orders", "partitions": [
                     {"partition_index": 0, "committed_offset": 42,
                      "committed_leader_epoch": -1, "committed_metadata": "meta"}]}]}


def committed(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "topics": [
        {"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": 0}
            for p in t["partitions"]]} for t in value["topics"]]}


class HolderLink:
    """The follower's link to the holder: relayed requests are recorded (and refused),
    ``FleetControl`` bodies go to the holder's fleet-listener router."""

    def __init__(self, holder: CoordinatorService, *, takes_tickets: bool = True) -> None:
        self.holder = holder
        self.fleet_router = FleetControlRouter(router(holder, None, inbound=True), {},
                                               Session("fleet", fleet_peer=True), "follower")
        self.takes_tickets = takes_tickets
        self.relayed: list[tuple[int, dict[str, Any]]] = []
        self.controls: list[bytes] = []

    async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                      timeout: float | None = None, client_id: str | None = None
                      ) -> dict[str, Any]:
        self.relayed.append((api_key, value))
        return committed(api_key, version, value)

    async def exchange_raw(self, api_key: int, version: int, body: bytes, *,
                           timeout: float | None = None) -> bytes:
        assert api_key == FLEET_CONTROL
        self.controls.append(body)
        if not self.takes_tickets:  # a protocol-3 holder from before tickets
            return struct.pack(">h", 42)  # INVALID_REQUEST, no body
        payload = encode_request_header(api_key, version, 5, "f", flexible=False) + body
        decision = self.fleet_router.decide(RequestInfo(api_key, version, 5,
                                                        memoryview(payload)))
        assert isinstance(decision, Local)
        answer = decision.answer
        if not isinstance(answer, bytes | bytearray | memoryview):
            answer = await answer
        assert isinstance(answer, bytes)
        return answer[4:]

    async def aclose(self) -> None:
        return None


def fleet_of(**link: Any) -> tuple[CoordinatorService, CoordinatorService, HolderLink]:
    """A holder coordinating ``g`` and a follower that knows it holds it."""
    holder = make_service(stub_broker)
    coordinate(holder, "g")
    follower = make_service(stub_broker)
    follower.directory._views["g"] = Holder("sidecar", Card(HOLDER, "0.3.0"), "lock-member")
    peer = HolderLink(holder, **link)
    pool = follower.pool
    assert isinstance(pool, FakePool)
    pool.peer = lambda address, request_timeout: peer  # type: ignore[method-assign]
    return holder, follower, peer


async def member_of(holder: CoordinatorService) -> tuple[str, int]:
    """A KIP-848 member of ``g`` joined at the holder (relayed from the follower)."""
    joined = await exchange(router(holder, None, inbound=True), request(
        ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, HEARTBEAT_V0,
        client_id=mark_forwarded("app", "/h")))
    assert joined.response is not None and joined.response["error_code"] == 0
    return joined.response["member_id"], joined.response["member_epoch"]


async def test_a_followers_commit_is_sent_on_the_clients_connection_stamped_by_the_holder(
) -> None:
    """The holder validates and stamps; nothing is relayed, the holder sends nothing to the
    broker, and the follower sends the client's commit upstream on the client's own
    connection (where the broker authorizes the client), with its metadata."""
    holder, follower, peer = fleet_of()
    member, epoch = await member_of(holder)
    commit = dict(COMMIT_V9, member_id=member, generation_id_or_member_epoch=epoch)
    membership = holder.memberships["g"]
    result = await exchange(router(follower, fleet=True), request(ApiKey.OFFSET_COMMIT, 9,
                                                                   commit), committed)
    assert result.action == "rewrite" and result.sent is not None
    assert (result.sent["member_id"], result.sent["generation_id_or_member_epoch"]) == (
        "proxy-member", 7)
    assert result.sent["topics"][0]["partitions"][0]["committed_metadata"] == "meta"
    assert result.response is not None
    assert result.response["topics"][0]["partitions"][0]["error_code"] == 0
    assert peer.relayed == []
    assert not [r for r in holder.pool.fake.requests  # type: ignore[attr-defined]
                if r[0] == ApiKey.OFFSET_COMMIT]
    # the stamp is in flight at the holder until the follower reports the broker's answer
    assert membership.commits.count == 1 and len(holder.tickets.book) == 1
    await deliver_reports(follower, peer)
    assert membership.commits.count == 0 and len(holder.tickets.book) == 0


async def deliver_reports(follower: CoordinatorService, peer: HolderLink) -> None:
    with trio.move_on_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follower.tickets.run)
            while not any(b"CommitDone" in c for c in peer.controls):
                await trio.sleep(0.01)
            await trio.sleep(0.01)
            nursery.cancel_scope.cancel()


async def test_a_commit_the_holder_refuses_gets_its_error_and_nothing_is_sent() -> None:
    holder, follower, peer = fleet_of()
    member, epoch = await member_of(holder)
    stale = dict(COMMIT_V9, member_id=member, generation_id_or_member_epoch=epoch + 5)
    result = await exchange(router(follower, fleet=True),
                            request(ApiKey.OFFSET_COMMIT, 9, stale))
    assert result.action == "local" and result.response is not None
    assert result.response["topics"][0]["partitions"][0]["error_code"] == 113  # STALE_EPOCH
    assert peer.relayed == [] and len(holder.tickets.book) == 0
    assert holder.memberships["g"].commits.count == 0


async def test_a_stale_stamp_makes_the_holder_rejoin_and_the_client_retry() -> None:
    """The broker refuses the stamped generation on the client's connection: the client is
    told the retriable COORDINATOR_LOAD_IN_PROGRESS, and the holder, told by the report,
    rejoins (as for its own commits)."""
    holder, follower, peer = fleet_of()
    member, epoch = await member_of(holder)
    commit = dict(COMMIT_V9, member_id=member, generation_id_or_member_epoch=epoch)

    def illegal_generation(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        answer = committed(key, version, value)
        answer["topics"][0]["partitions"][0]["error_code"] = 22
        return answer

    result = await exchange(router(follower, fleet=True),
                            request(ApiKey.OFFSET_COMMIT, 9, commit), illegal_generation)
    assert result.response is not None
    assert result.response["topics"][0]["partitions"][0]["error_code"] == 14
    membership = holder.memberships["g"]
    assert membership.stable
    await deliver_reports(follower, peer)
    assert not membership.stable and membership.commits.count == 0


async def test_a_holder_without_tickets_gets_the_commit_relayed() -> None:
    holder, follower, peer = fleet_of(takes_tickets=False)
    member, epoch = await member_of(holder)
    commit = dict(COMMIT_V9, member_id=member, generation_id_or_member_epoch=epoch)
    result = await exchange(router(follower, fleet=True),
                            request(ApiKey.OFFSET_COMMIT, 9, commit))
    assert result.action == "local"
    assert [k for k, _ in peer.relayed] == [ApiKey.OFFSET_COMMIT]


def test_the_ticket_book_is_bounded_and_expires() -> None:
    released: list[int] = []
    errors: list[set[int]] = []
    book = TicketBook(limit=4, lifetime=10.0)
    ids = [book.issue("g", lambda i=i: released.append(i), errors.append, now=float(i))
           for i in range(6)]
    assert all(t is not None for t in ids[:4]) and ids[4:] == [None, None]
    assert released == [4, 5]  # refused tickets release their stamps at once
    assert len(book) == 4
    assert book.expire(now=11.5) == 2 and released == [4, 5, 0, 1]
    third, fourth = ids[2], ids[3]
    assert third is not None and fourth is not None
    assert not book.done("other-group", third, [])  # a ticket of another group: ignored
    assert book.done("g", third, [])
    assert not book.done("g", third, [22])  # once
    assert book.done("g", fourth, [22, 0])
    assert released == [4, 5, 0, 1, 2, 3] and errors == [{22, 0}] and len(book) == 0


def test_open_tickets_keep_no_commit_and_stay_small() -> None:
    """The memory a holder's open tickets take at the bound, however large the commits
    were: only the stamp's callables are kept (docs/decisions/0008)."""
    import tracemalloc

    from proxy.coordination.membership import BrokerMembership

    from .helpers import FakePool

    membership = BrokerMembership("g", FakePool(lambda k, v, value: {}), [("h", 1)],
                                  connect_timeout=1)
    book = TicketBook()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(tickets.MAX_TICKETS + 100):
            _member, generation, release = membership.stamp()
            book.issue("g", release, lambda errors, g=generation: None, now=0.0)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(book) == tickets.MAX_TICKETS
    assert membership.commits.count == tickets.MAX_TICKETS  # the 100 refused were released
    assert used < 4 << 20, used
    assert book.expire(now=tickets.TICKET_SECONDS) == tickets.MAX_TICKETS
    assert membership.commits.count == 0


async def test_a_followers_reports_are_bounded() -> None:
    follower = make_service(stub_broker)
    for i in range(tickets.MAX_REPORTS + 10):
        follower.tickets.report(HOLDER, "g", i, [0])
    assert follower.tickets.dropped == 10


def test_ticket_messages_round_trip() -> None:
    ticket = tickets.Ticket(12345, "proxy-member", 7, 8, 1)
    assert tickets.read_reply(tickets.reply_body(tickets.Reply(0, ticket))) == tickets.Reply(
        0, ticket)
    assert tickets.read_reply(tickets.reply_body(tickets.Reply(22))) == tickets.Reply(22)
    assert tickets.read_reply(struct.pack(">h", 42)) is None  # a holder without tickets
    body = tickets.ask_body(8, 9, "mark", b"\x00\x01")
    import json
    assert tickets.read_ask(json.loads(body)) == (8, 9, "mark", b"\x00\x01")
