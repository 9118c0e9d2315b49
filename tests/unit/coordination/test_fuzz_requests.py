"""Hostile but decodable group requests through the whole request path: the router, every
API's handler, the coordinator service, the engine and the proxy's real broker memberships
(against a stub broker that answers like a healthy one). Whatever arrives, each request is
answered, forwarded or refused (its connection closed), the service keeps running, and no
broker group is held for a group the engine does not have.

Hypothesis draws sequences of requests from the vendored schemas, with group ids steered to a
few shared ones (so that requests meet coordinated groups), and hostile strings: group ids
too long for the proxy's own requests, topic names over Kafka's limit or with illegal
characters, invalid regexes, negative timeouts. A fixed budget (``GROUPGATE_FUZZ_SCALE``
multiplies it), derandomized, so a failure replays.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.codec.errors import CodecError
from proxy.connection import RejectRequest
from proxy.coordination import offsets
from proxy.coordination.routing import handler_table
from tests.unit.codec.strategies import examples, message_values, versions

from .helpers import TOPIC, coordinator_found, exchange, make_service, request, router

EXAMINED = sorted(k for k in handler_table(make_service()) if k not in (28,))
"""The group APIs the proxy examines (TxnOffsetCommit needs a transaction: left out)."""
GROUP_IDS = st.sampled_from(["g1", "g2", "g" * 40_000, "", " "])
TOPICS = st.sampled_from([TOPIC, "t" * 250, "bad name", "ok-topic"])
HOSTILE = {
    "group_id": GROUP_IDS,
    "rebalance_timeout_ms": st.sampled_from([-1, 0, 10_000, 2**31 - 1]),
    "session_timeout_ms": st.sampled_from([-1, 1, 10_000]),
    "subscribed_topic_regex": st.sampled_from([None, "(", "t.*", "a" * 5000]),
    "subscribed_topic_names": st.one_of(st.none(), st.lists(TOPICS, max_size=3)),
    "member_epoch": st.sampled_from([-2, -1, 0, 1, 5]),
    "instance_id": st.sampled_from([None, "i", "i" * 250]),
}


def stub_broker(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    """A healthy single broker, for the proxy's own requests (its broker memberships)."""
    if key == 10:  # FindCoordinator
        return coordinator_found(version, value, "127.0.0.1", 9092)
    if key == 11:  # JoinGroup
        member = value.get("member_id") or "proxy-member-1"
        protocol = value["protocols"][0]
        return {"throttle_time_ms": 0, "error_code": 0, "generation_id": 1,
                "protocol_type": "consumer", "protocol_name": protocol["name"],
                "leader": member, "skip_assignment": False, "member_id": member,
                "members": [{"member_id": member, "group_instance_id": None,
                             "metadata": protocol["metadata"]}]}
    if key == 14:  # SyncGroup
        return {"throttle_time_ms": 0, "error_code": 0, "protocol_type": "consumer",
                "protocol_name": value.get("protocol_name"), "assignment": b""}
    if key == 13:  # LeaveGroup
        return {"throttle_time_ms": 0, "error_code": 0, "members": []}
    return {"throttle_time_ms": 0, "error_code": 0}


@st.composite
def hostile_request(draw: st.DrawFn) -> tuple[int, int, dict[str, Any]]:
    key = draw(st.sampled_from(EXAMINED))
    version = draw(versions(key))
    value = dict(draw(message_values(key, version, False)))
    for field, strategy in HOSTILE.items():
        if field in value and draw(st.booleans()):
            value[field] = draw(strategy)
    if isinstance(value.get("groups"), list) and value["groups"]:  # DescribeGroups, OffsetFetch
        first = value["groups"][0]
        if isinstance(first, str):
            value["groups"] = [draw(GROUP_IDS) for _ in value["groups"]]
        elif isinstance(first, dict) and "group_id" in first:
            value["groups"] = [dict(g, group_id=draw(GROUP_IDS)) for g in value["groups"]]
    if isinstance(value.get("groups_names"), list):  # DeleteGroups
        value["groups_names"] = [draw(GROUP_IDS) for _ in value["groups_names"]]
    return key, version, value


def run_requests(requests: list[tuple[int, int, dict[str, Any]]]) -> None:
    service = make_service(stub_broker)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                                task_status=task_status))
            r = router(service)
            # a well-behaved member first, so that what follows meets a coordinated group
            await exchange(r, request(68, 0, VALID_JOIN, 0))
            assert service.engine.group("g1") is not None
            for correlation, (key, version, value) in enumerate(requests, 1):
                try:
                    info = request(key, version, value, correlation)
                except (CodecError, ValueError, OverflowError):
                    OUTCOMES["unsendable"] = OUTCOMES.get("unsendable", 0) + 1
                    continue  # not sendable at this version: no client could send it
                with trio.fail_after(3600):
                    try:
                        result = await exchange(r, info, _commit_answer if key == 8 else None)
                        action = result.action
                    except RejectRequest:
                        action = "refused"  # the connection is closed with a log line
                OUTCOMES[action] = OUTCOMES.get(action, 0) + 1
            issued = {group for group, _member in service._issued_ids}
            stray = set(service.memberships) - set(service.engine.groups) - issued
            assert not stray, f"broker groups held for groups the engine does not have: {stray}"
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def _commit_answer(key: int, version: int, value: dict[str, Any]) -> dict[str, Any]:
    """The broker's answer to a commit the proxy sent on under its membership."""
    return offsets.commit_error(value, 0)


VALID_JOIN = {"group_id": "g1", "member_id": "", "member_epoch": 0, "instance_id": None,
              "rack_id": None, "rebalance_timeout_ms": 10_000,
              "subscribed_topic_names": [TOPIC], "subscribed_topic_regex": None,
              "server_assignor": None, "topic_partitions": []}

OUTCOMES: dict[str, int] = {}
"""What the requests came to, over all examples (forward, local, rewrite)."""


@settings(max_examples=examples(300), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much])
@given(st.lists(hostile_request(), min_size=1, max_size=6))
def test_hostile_group_requests_never_break_the_service(
        requests: list[tuple[int, int, dict[str, Any]]]) -> None:
    run_requests(requests)


def test_the_fuzzer_reached_the_engine() -> None:
    """Runs after the fuzzer (same module, in order): many requests were answered by the
    proxy itself, so the engine and the memberships were exercised, not only refusals."""
    if not OUTCOMES:
        test_hostile_group_requests_never_break_the_service()
    assert OUTCOMES.get("local", 0) >= 100 and OUTCOMES.get("rewrite", 0) >= 1, OUTCOMES
