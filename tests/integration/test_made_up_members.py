"""Requests with member ids nobody issued, for group ids the broker never saw, through a
sidecar with the state log and a fleet listener: they are answered as the broker would answer
them, and the sidecar holds none of those broker groups afterwards (before, each one took the
broker's group over to load a state the log never had, and kept it: clients straight at the
broker were refused, and ``max-groups`` filled up)."""

from __future__ import annotations

import re
import urllib.request
import uuid

import pytest
import trio

from proxy.codec.api_keys import ApiKey
from proxy.upstream import UpstreamClient
from tests.integration.conftest import StartProxy
from tests.testbed.broker import KafkaBroker

pytestmark = pytest.mark.broker

UNKNOWN_MEMBER_ID, MEMBER_ID_REQUIRED = 25, 79
REQUESTS = 100


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


async def _heartbeats(address: tuple[str, int], group_ids: list[str]) -> list[int]:
    client = await UpstreamClient.connect(address, timeout=10, max_frame_bytes=1 << 20)
    try:
        errors = []
        for group_id in group_ids:
            answer = await client.request(ApiKey.HEARTBEAT, 4, {
                "group_id": group_id, "generation_id": 1, "member_id": "x",
                "group_instance_id": None})
            errors.append(answer["error_code"])
        return errors
    finally:
        await client.aclose()


async def _join_straight(address: tuple[str, int], group_id: str) -> int:
    """A classic consumer's JoinGroup at the broker itself (v5: asks for a member id first)."""
    client = await UpstreamClient.connect(address, timeout=10, max_frame_bytes=1 << 20)
    try:
        member_id = ""
        for _ in range(3):
            join = await client.request(ApiKey.JOIN_GROUP, 5, {
                "group_id": group_id, "session_timeout_ms": 10_000,
                "rebalance_timeout_ms": 10_000, "member_id": member_id,
                "group_instance_id": None, "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b"\x00\x00\x00\x00\x00\x00"}]})
            if join["error_code"] != MEMBER_ID_REQUIRED:
                await client.request(ApiKey.LEAVE_GROUP, 3, {
                    "group_id": group_id,
                    "members": [{"member_id": join["member_id"], "group_instance_id": None}]})
                return int(join["error_code"])
            member_id = join["member_id"]
        raise AssertionError("the broker kept asking for a member id")
    finally:
        await client.aclose()


def test_made_up_heartbeats_hold_no_broker_group(broker: KafkaBroker,
                                                 start_proxy: StartProxy) -> None:
    sidecar = start_proxy(broker, "--fleet-listen", "127.0.0.1:0",
                          "--fleet-address", "127.0.0.1:1", "--metrics-listen", "127.0.0.1:0")
    found = re.search(r"metrics and health on (http://\S+)/metrics", sidecar.log())
    assert found, sidecar.log()
    group_ids = [f"made-up-{uuid.uuid4().hex}" for _ in range(REQUESTS)]
    errors = trio.run(_heartbeats, (sidecar.host, sidecar.port), group_ids)
    assert errors == [UNKNOWN_MEMBER_ID] * REQUESTS  # answered, as the broker answers them
    with urllib.request.urlopen(f"{found.group(1)}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    assert _metric(metrics, "groupgate_broker_group_joins_total") == 0, metrics
    assert _metric(metrics, "groupgate_groups_held") == 0, metrics
    host, _, port = broker.bootstrap.partition(":")
    # a classic consumer straight at the broker is not refused as INCONSISTENT_GROUP_PROTOCOL
    assert trio.run(_join_straight, (host, int(port)), group_ids[0]) == 0
    assert "holding the broker's group" not in sidecar.log()
