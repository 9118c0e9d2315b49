"""A commit a client re-sends after a failure never lands after a newer commit of the same member:
librdkafka re-sends a failed request after a backoff or a reconnection, when the member's newer
commits may already have succeeded (seen in the three-broker fleet test: partition 3's committed
offset went from 621 back to 431)."""

from __future__ import annotations

from typing import Any

from proxy.coordination import offsets
from proxy.coordination.commit_retries import CommitRetries
from translation.errors import ErrorCode

from .helpers import TOPIC, consumer_heartbeat, coordinate, exchange, make_service, request, router

LOAD = int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
NOT_COORDINATOR = int(ErrorCode.NOT_COORDINATOR)


def commit(member: str, epoch: int, offset: int, partition: int = 0,
           group: str = "g") -> dict[str, Any]:
    return {"group_id": group, "generation_id_or_member_epoch": epoch, "member_id": member,
            "group_instance_id": None, "topics": [{"name": TOPIC, "partitions": [
                {"partition_index": partition, "committed_offset": offset,
                 "committed_leader_epoch": -1, "committed_metadata": ""}]}]}


def answer(value: dict[str, Any], error: int) -> dict[str, Any]:
    return offsets.commit_error(value, error)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_after_a_failure_a_lower_offset_than_one_committed_since_is_stale() -> None:
    clock = Clock()
    retries = CommitRetries(clock, window_seconds=60)
    p = (TOPIC, 0)
    clock.now = 100.0  # long after the member was first seen
    retries.observe("g", "m", commit("m", 1, 400), answer(commit("m", 1, 400), 0))
    clock.now = 200.0
    assert not retries.stale("g", "m", p, 300)  # no disruption lately: a seek back is allowed
    retries.observe("g", "m", commit("m", 1, 431), answer(commit("m", 1, 431), LOAD))
    assert not retries.stale("g", "m", p, 431)  # nothing newer has succeeded yet
    retries.observe("g", "m", commit("m", 1, 621), answer(commit("m", 1, 621), 0))
    assert retries.stale("g", "m", p, 431) and retries.stale("g", "m", p, 500)
    # not: another member, another partition, the newest offset or a newer one
    assert not retries.stale("g", "other", p, 431)
    assert not retries.stale("g", "m", (TOPIC, 1), 431)
    assert not retries.stale("g", "m", p, 621) and not retries.stale("g", "m", p, 700)
    clock.now = 261.0  # the window has closed: retries are long done
    assert not retries.stale("g", "m", p, 431)


def test_a_broken_connection_and_a_first_sight_open_the_window() -> None:
    clock = Clock()
    retries = CommitRetries(clock, window_seconds=60)
    p = (TOPIC, 0)
    # first seen (a restarted sidecar): the client may be retrying commits it sent before
    retries.observe("g", "m", commit("m", 1, 78), answer(commit("m", 1, 78), 0))
    assert retries.stale("g", "m", p, 34)
    clock.now = 100.0
    retries.observe("g", "m", commit("m", 1, 80), answer(commit("m", 1, 80), 0))
    assert not retries.stale("g", "m", p, 40)
    retries.disrupted("g", "m")  # the connection the member committed on closed
    retries.observe("g", "m", commit("m", 1, 90), answer(commit("m", 1, 90), 0))
    assert retries.stale("g", "m", p, 81)


def test_errors_clients_do_not_retry_are_no_disruption() -> None:
    clock = Clock()
    retries = CommitRetries(clock, window_seconds=60)
    retries.observe("g", "m", commit("m", 1, 1), answer(commit("m", 1, 1), 0))  # first seen
    clock.now = 100.0
    stale_epoch = int(ErrorCode.STALE_MEMBER_EPOCH)
    retries.observe("g", "m", commit("m", 1, 5), answer(commit("m", 1, 5), stale_epoch))
    retries.observe("g", "m", commit("m", 2, 9), answer(commit("m", 2, 9), 0))
    assert not retries.stale("g", "m", (TOPIC, 0), 5)


def _join(service: Any, member: str) -> int:
    response, _ = service.engine.heartbeat(consumer_heartbeat(
        {"group_id": "g", "member_id": member, "member_epoch": 0, "rebalance_timeout_ms": 1000,
         "subscribed_topic_names": [TOPIC], "topic_partitions": []},
        client_id="c", client_host="/h", api_version=1), 0)
    return int(response.member_epoch)


async def test_through_the_router_the_overtaken_retry_is_acknowledged_not_written() -> None:
    service = make_service()
    coordinate(service, "g")
    epoch = _join(service, "m1")
    client = router(service)
    broker_error = {"error": int(ErrorCode.REQUEST_TIMED_OUT)}

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        return answer(value, broker_error["error"])

    failed = await exchange(client, request(8, 9, commit("m1", epoch, 431), 1), broker)
    assert failed.response is not None
    assert failed.response["topics"][0]["partitions"][0]["error_code"] == broker_error["error"]
    broker_error["error"] = 0
    newer = await exchange(client, request(8, 9, commit("m1", epoch, 621), 2), broker)
    assert newer.action == "rewrite" and newer.sent is not None
    # the client's retry of 431 arrives: acknowledged here, nothing sent to the broker
    retry = await exchange(client, request(8, 9, commit("m1", epoch, 431), 3), broker)
    assert retry.action == "local" and retry.response is not None
    assert [(t["name"], t["partitions"]) for t in retry.response["topics"]] == [
        (TOPIC, [{"partition_index": 0, "error_code": 0}])]
    assert service.commit_retries.acknowledged == 1
    # a commit with a stale partition and a fresh one: only the fresh one is written
    both = commit("m1", epoch, 431)
    both["topics"][0]["partitions"].append(dict(both["topics"][0]["partitions"][0],
                                                partition_index=1))
    mixed = await exchange(client, request(8, 9, both, 4), broker)
    assert mixed.sent is not None and mixed.response is not None
    assert [p["partition_index"] for t in mixed.sent["topics"] for p in t["partitions"]] == [1]
    assert sorted((p["partition_index"], p["error_code"]) for t in mixed.response["topics"]
                  for p in t["partitions"]) == [(0, 0), (1, 0)]


async def test_a_stale_retry_waiting_for_a_lookup_is_acknowledged_once() -> None:
    """A follower that must first ask the broker where the group is coordinated decides the
    request again afterwards; the stale partition is taken out (and counted) only then, and the
    fresh one is relayed."""
    from proxy.codec.api_keys import ApiKey
    from proxy.coordination.fleet import Card, subscription_metadata

    from .test_fleet import PEER, described, member
    from .test_fuzz_requests import stub_broker

    card = subscription_metadata([TOPIC], Card(PEER, "0.2.0"))
    relayed: list[dict[str, Any]] = []

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == ApiKey.DESCRIBE_GROUPS:
            return {"throttle_time_ms": 0, "groups": [described(member("holder", card))]}
        if key == ApiKey.OFFSET_COMMIT:
            relayed.append(value)
            return answer(value, 0)
        return stub_broker(key, version, value)

    service = make_service(broker)
    retries = service.commit_retries
    retries.disrupted("g", "m1")
    retries.observe("g", "m1", commit("m1", 5, 621), answer(commit("m1", 5, 621), 0))
    both = commit("m1", 5, 431)
    both["topics"][0]["partitions"].append(dict(both["topics"][0]["partitions"][0],
                                                partition_index=1))
    result = await exchange(router(service, fleet=True), request(8, 9, both))
    assert result.action == "local" and result.response is not None
    assert sorted((p["partition_index"], p["error_code"]) for t in result.response["topics"]
                  for p in t["partitions"]) == [(0, 0), (1, 0)]
    assert [p["partition_index"] for v in relayed for t in v["topics"]
            for p in t["partitions"]] == [1]
    assert retries.acknowledged == 1


async def test_a_stale_retry_the_engine_refuses_gets_the_engine_s_error() -> None:
    """The guard comes after the engine's validation: a retry from a member the group fenced
    meanwhile, or with a wrong epoch, is refused as the engine refuses it, never
    acknowledged."""
    service = make_service()
    coordinate(service, "g")
    epoch = _join(service, "m1")
    client = router(service)

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        return answer(value, 0)

    service.commit_retries.disrupted("g", "m1")
    newer = await exchange(client, request(8, 9, commit("m1", epoch, 621), 1), broker)
    assert newer.action == "rewrite"
    # a wrong epoch: the engine's error (before: acknowledged as a stale retry)
    wrong = await exchange(client, request(8, 9, commit("m1", epoch + 7, 431), 2), broker)
    assert wrong.response is not None
    assert wrong.response["topics"][0]["partitions"][0]["error_code"] == int(
        ErrorCode.STALE_MEMBER_EPOCH)
    # progress: the same retry under the member's epoch is still acknowledged, not written
    retry = await exchange(client, request(8, 9, commit("m1", epoch, 431), 3), broker)
    assert retry.action == "local" and retry.response is not None
    assert retry.response["topics"][0]["partitions"][0]["error_code"] == 0
    # the member is fenced (it left): its retry gets the engine's error
    service.engine.heartbeat(consumer_heartbeat(
        {"group_id": "g", "member_id": "m1", "member_epoch": -1, "rebalance_timeout_ms": -1,
         "subscribed_topic_names": None, "topic_partitions": None},
        client_id="c", client_host="/h", api_version=1), 0)
    fenced = await exchange(client, request(8, 9, commit("m1", epoch, 431), 4), broker)
    assert fenced.response is not None
    assert fenced.response["topics"][0]["partitions"][0]["error_code"] == int(
        ErrorCode.UNKNOWN_MEMBER_ID)


async def test_a_retry_decided_elsewhere_is_guarded_only_under_the_epoch_of_the_newer_commit(
        ) -> None:
    """Relayed commits are validated by the coordinating sidecar: a retry under another epoch
    than the newer commit's goes there; a stale partition in a commit the coordinator refuses
    shares its error."""
    from proxy.codec.api_keys import ApiKey
    from proxy.coordination.fleet import Card, subscription_metadata

    from .test_fleet import PEER, described, member
    from .test_fuzz_requests import stub_broker

    card = subscription_metadata([TOPIC], Card(PEER, "0.3.0"))
    relayed: list[dict[str, Any]] = []
    verdict = {"error": 0}

    def broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
        if key == ApiKey.DESCRIBE_GROUPS:
            return {"throttle_time_ms": 0, "groups": [described(member("holder", card))]}
        if key == ApiKey.OFFSET_COMMIT:
            relayed.append(value)
            return answer(value, verdict["error"])
        return stub_broker(key, version, value)

    service = make_service(broker)
    retries = service.commit_retries
    retries.disrupted("g", "m1")
    retries.observe("g", "m1", commit("m1", 5, 621), answer(commit("m1", 5, 621), 0))
    # another epoch: not taken for a retry of that commit; the coordinator decides it
    verdict["error"] = int(ErrorCode.STALE_MEMBER_EPOCH)
    other = await exchange(router(service, fleet=True), request(8, 9, commit("m1", 9, 431)))
    assert other.response is not None and len(relayed) == 1
    assert other.response["topics"][0]["partitions"][0]["error_code"] == int(
        ErrorCode.STALE_MEMBER_EPOCH)
    # a stale partition next to a fresh one the coordinator refuses: the same error
    both = commit("m1", 5, 431)
    both["topics"][0]["partitions"].append(dict(both["topics"][0]["partitions"][0],
                                                partition_index=1))
    verdict["error"] = int(ErrorCode.UNKNOWN_MEMBER_ID)
    mixed = await exchange(router(service, fleet=True), request(8, 9, both, 8))
    assert mixed.response is not None
    assert sorted((p["partition_index"], p["error_code"]) for t in mixed.response["topics"]
                  for p in t["partitions"]) == [(0, 25), (1, 25)]
