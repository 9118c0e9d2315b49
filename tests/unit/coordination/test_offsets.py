"""Offset requests of coordinated groups: engine validation, then the broker on the client's own
connection, stamped with the proxy's membership."""

from __future__ import annotations

import struct
import uuid
from typing import Any

import trio
import trio.testing

from proxy.codec import messages
from proxy.codec.header import parse_request_header, response_header_for
from proxy.connection import EXAMINE, FORWARD, Rewrite
from proxy.coordination import offsets
from proxy.router import body_offset
from translation.topics import TopicMetadata, TopicsImage

from .helpers import (
    TOPIC,
    TOPIC_ID,
    consumer_heartbeat,
    coordinate,
    exchange,
    make_service,
    request,
    router,
)


def _join(service: Any, group: str, member: str) -> int:
    response, _ = service.engine.heartbeat(consumer_heartbeat(
        {"group_id": group, "member_id": member, "member_epoch": 0, "rebalance_timeout_ms": 1000,
         "subscribed_topic_names": [TOPIC], "topic_partitions": []},
        client_id="c", client_host="/h", api_version=1), 0)
    assert response.error_code == 0
    return int(response.member_epoch)


def _commit(member: str, epoch: int, partitions: list[int], group: str = "g"
            ) -> dict[str, Any]:
    return {"group_id": group, "generation_id_or_member_epoch": epoch, "member_id": member,
            "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [
                {"partition_index": p, "committed_offset": 10, "committed_leader_epoch": -1,
                 "committed_metadata": ""} for p in partitions]}]}


def _ok(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    return offsets.commit_error(value, 0)


def _errors(response: dict[str, Any] | None) -> set[int]:
    assert response is not None
    return {p["error_code"] for t in response["topics"] for p in t["partitions"]}


def test_topic_ids_by_id_by_name_and_for_unknown_names() -> None:
    image = TopicsImage.of([TopicMetadata(TOPIC_ID, TOPIC, 1)])
    other = uuid.uuid4()
    assert offsets.topic_id_of({"topic_id": other, "name": ""}, image) == other
    assert offsets.topic_id_of({"name": TOPIC}, image) == TOPIC_ID
    unknown = offsets.topic_id_of({"name": "gone"}, image)
    assert unknown == offsets.topic_id_of({"name": "gone"}, image) != TOPIC_ID


async def test_accepted_commit_goes_upstream_stamped_with_the_proxys_membership() -> None:
    service = make_service()
    membership = coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    result = await exchange(router(service), request(8, 9, _commit("m1", epoch, [0, 1])), _ok)
    assert result.action == "rewrite" and _errors(result.response) == {0}
    assert result.sent is not None
    assert result.sent["member_id"] == "proxy-member"
    assert result.sent["generation_id_or_member_epoch"] == 7
    assert [(t["name"], t["partitions"]) for t in result.sent["topics"]] == [
        (t["name"], t["partitions"]) for t in _commit("m1", epoch, [0, 1])["topics"]]
    assert membership.commits.count == 0  # answered


async def test_commits_of_other_groups_pass_untouched() -> None:
    service = make_service()
    coordinate(service, "g")
    result = await exchange(router(service), request(8, 9, _commit("m", 3, [0], "theirs")))
    assert result.action == "forward"


async def test_rejected_commit_never_reaches_the_broker() -> None:
    service = make_service()
    coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    stale = await exchange(router(service), request(8, 9, _commit("m1", epoch + 1, [0])))
    unknown = await exchange(router(service), request(8, 9, _commit("zombie", epoch, [0])))
    assert (stale.action, _errors(stale.response)) == ("local", {113})  # STALE_MEMBER_EPOCH
    assert (unknown.action, _errors(unknown.response)) == ("local", {25})  # UNKNOWN_MEMBER_ID


async def test_broker_refusing_the_membership_means_rejoin_and_a_retriable_error() -> None:
    service = make_service()
    membership = coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    refused = await exchange(router(service), request(8, 9, _commit("m1", epoch, [0])),
                             lambda k, v, value: offsets.commit_error(value, 22))
    assert _errors(refused.response) == {14}  # COORDINATOR_LOAD_IN_PROGRESS
    assert not membership.stable


async def test_a_commit_waits_while_the_membership_rejoins_and_is_stamped_after(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    membership = coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    membership.request_rejoin()
    results = []

    async def commit() -> None:
        results.append(await exchange(router(service), request(8, 9, _commit("m1", epoch, [0])),
                                      _ok))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(commit)
        await trio.sleep(1)
        assert not results  # held while the membership is not usable
        membership.generation = 8
        membership._set_stable(True)
    (result,) = results
    assert result.action == "rewrite" and result.sent is not None
    assert result.sent["generation_id_or_member_epoch"] == 8


async def test_a_commit_never_reaches_a_membership_that_stays_down(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    membership = coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    membership.request_rejoin()
    result = await exchange(router(service), request(8, 9, _commit("m1", epoch, [0])))
    assert (result.action, _errors(result.response)) == ("local", {14})


async def test_in_flight_commits_are_counted_until_answered_or_abandoned() -> None:
    service = make_service()
    membership = coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    sent = await exchange(router(service), request(8, 9, _commit("m1", epoch, [0])))
    assert sent.action == "rewrite" and membership.commits.count == 1
    assert sent.abandon is not None
    sent.abandon()  # the client's connection closed before the broker answered
    sent.abandon()
    assert membership.commits.count == 0


async def test_txn_commit_validated_as_transactional() -> None:
    service = make_service()
    coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    value = dict(_commit("m1", epoch + 3, [0]), transactional_id="t", producer_id=1,
                 producer_epoch=0)
    stale = await exchange(router(service), request(28, 3, value))
    assert _errors(stale.response) == {22}  # ILLEGAL_GENERATION for transactional commits
    value["generation_id_or_member_epoch"] = epoch
    ok = await exchange(router(service), request(28, 3, value), _ok)
    assert ok.sent is not None and ok.sent["member_id"] == "proxy-member"


async def test_offset_fetch_checks_member_epoch_and_strips_member_fields() -> None:
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        return {"groups": [{"group_id": g["group_id"], "topics": [], "error_code": 0}
                           for g in value["groups"]]}

    service = make_service()
    coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    group = {"group_id": "g", "member_id": "m1", "member_epoch": epoch, "topics": None}
    value = {"groups": [group, dict(group, member_epoch=epoch + 1), dict(group, member_id="x"),
                        dict(group, member_id=None, member_epoch=-1),
                        {"group_id": "theirs", "member_id": "y", "member_epoch": 4,
                         "topics": None}],
             "require_stable": True}
    result = await exchange(router(service), request(9, 9, value), answer)
    assert result.response is not None and result.sent is not None
    assert [g["error_code"] for g in result.response["groups"]] == [0, 113, 25, 0, 0]
    assert [g["group_id"] for g in result.response["groups"]] == ["g"] * 4 + ["theirs"]
    assert [(g["member_id"], g["member_epoch"]) for g in result.sent["groups"]] == [
        (None, -1), (None, -1), ("y", 4)]  # a group the proxy does not coordinate: untouched
    old = await exchange(router(service), request(9, 7, {"group_id": "g", "topics": None}))
    assert old.action == "forward"


async def test_offset_delete_refuses_subscribed_topics() -> None:
    def answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        assert [t["name"] for t in value["topics"]] == ["old"]
        return {"error_code": 0, "topics": [{"name": "old", "partitions": [
            {"partition_index": 0, "error_code": 0}]}]}

    service = make_service()
    coordinate(service, "g")
    _join(service, "g", "m1")
    value = {"group_id": "g", "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0}]},
        {"name": "old", "partitions": [{"partition_index": 0}]}]}
    result = await exchange(router(service), request(47, 0, value), answer)
    assert result.response is not None
    errors = {t["name"]: [p["error_code"] for p in t["partitions"]]
              for t in result.response["topics"]}
    assert errors == {"old": [0], TOPIC: [86]}  # GROUP_SUBSCRIBED_TO_TOPIC
    only_subscribed = dict(value, topics=value["topics"][:1])
    local = await exchange(router(service), request(47, 0, only_subscribed))
    assert local.action == "local"


async def test_a_broker_request_of_the_proxy_that_hangs_does_not_hold_commits() -> None:
    """The proxy's own broker requests (Metadata, its membership's heartbeats) go through its
    link pool; commits and offset fetches go on the client's connection, so one slow request
    of the proxy's holds none of them."""
    hung = trio.Event()

    class HangingLink:
        async def request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            hung.set()
            await trio.sleep_forever()
            raise AssertionError("unreachable")

    service = make_service()
    coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    service.pool.link = lambda address: HangingLink()  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(service.pool.link(("b", 1)).request, 3, 12, {})
        await hung.wait()
        with trio.fail_after(1):
            commit = await exchange(router(service),
                                    request(8, 9, _commit("m1", epoch, [0])), _ok)
            fetch = await exchange(router(service), request(9, 8, {
                "groups": [{"group_id": "g", "member_id": "m1", "member_epoch": epoch,
                            "topics": None}], "require_stable": False}),
                lambda k, v, value: {"groups": [{"group_id": "g", "topics": [],
                                                 "error_code": 0}]})
        assert commit.action == "rewrite" and _errors(commit.response) == {0}
        assert fetch.action == "rewrite"
        nursery.cancel_scope.cancel()


async def test_a_commit_for_a_membership_lost_but_not_yet_removed_is_refused_once() -> None:
    """The broker's group was lost (its lease ended) and the membership is still registered:
    the commit is answered the retriable COORDINATOR_NOT_AVAILABLE at once. (Deciding it again
    after the takeover wait found the same state and waited again, without end: a
    RecursionError answered as UNKNOWN_SERVER_ERROR.)"""
    service = make_service()
    membership = coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    membership.failure = "the broker forgot member proxy-member"
    result = await exchange(router(service), request(8, 9, _commit("m1", epoch, [0])))
    assert (result.action, _errors(result.response)) == ("local", {15})


# -- OffsetCommit v9 in front of a broker without it (Kafka 3.6 and older) -------------------

def _api_versions_answer(offset_commit_max: int) -> bytes:
    """A broker's ApiVersions v3 answer (header and body) naming OffsetCommit 0..max."""
    body = messages.encode_response(18, 3, {
        "error_code": 0, "throttle_time_ms": 0, "api_keys": [
            {"api_key": 8, "min_version": 0, "max_version": offset_commit_max},
            {"api_key": 18, "min_version": 0, "max_version": 3}]})
    return struct.pack(">i", 1) + body


def _learned(r: Any, offset_commit_max: int) -> int:
    """Pass the broker's ApiVersions answer through ``r``; the newest OffsetCommit the
    client is offered."""
    rewrite = r.response_rewriter(18, 3)
    out = rewrite(memoryview(_api_versions_answer(offset_commit_max)))
    view, _ = messages.decode_response(18, 3, out, 4)
    return int({e["api_key"]: e["max_version"] for e in view["api_keys"]}[8])


async def test_a_v9_commit_of_a_coordinated_group_goes_to_the_broker_as_v8() -> None:
    service = make_service()
    coordinate(service, "g")
    epoch = _join(service, "g", "m1")
    r = router(service)
    assert _learned(r, 8) == 9
    info = request(8, 9, _commit("m1", epoch, [0, 1]))
    assert r.classify(info) == EXAMINE
    decision = r.decide(info)
    assert isinstance(decision, Rewrite)
    header = parse_request_header(decision.payload)
    assert (header.api_key, header.api_version) == (8, 8)
    sent, _ = messages.decode_request(8, 8, decision.payload, header.header_length)
    assert sent["member_id"] == "proxy-member"
    reply = (response_header_for(8, 8, info.correlation_id)
             + messages.encode_response(8, 8, offsets.commit_error(sent, 0)))
    out = decision.on_response(memoryview(reply))
    assert out is not None
    answer, _ = messages.decode_response(8, 9, out, body_offset(memoryview(out), 1))
    assert _errors(answer) == {0}  # the client's v9 answer


async def test_a_v9_commit_passed_to_a_broker_without_v9_is_relabelled_v8() -> None:
    service = make_service()
    coordinate(service, "g")
    info = request(8, 9, _commit("m", 3, [0], "theirs"))  # the broker's own group
    older = router(service)
    _learned(older, 8)
    decision = older.decide(info)
    assert isinstance(decision, Rewrite)
    assert bytes(decision.payload) == bytes(info.frame[:2]) + b"\x00\x08" + bytes(
        info.frame[4:])
    assert decision.on_response(memoryview(b"any answer")) is None  # passed on unchanged
    newer = router(service)
    assert _learned(newer, 9) == 9
    assert newer.decide(info) == FORWARD  # a broker with v9 gets it as it is
    assert router(service).decide(info) == FORWARD  # nothing known of the broker: as it is
