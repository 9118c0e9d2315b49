"""Requests with member ids nobody issued, for group ids the broker never saw, through a
sidecar in the pod test bed (two pods, a sidecar each, state log and fleet listeners): they are
answered as the broker would answer them, and no sidecar holds any of those broker groups
afterwards (before, each one took the broker's group over to load a state the log never had,
and kept it: clients straight at the broker were refused, and ``max-groups`` filled up). As
many as ``max-groups`` (1,000) of them leave room: a new KIP-848 group through a sidecar is
served at once."""

from __future__ import annotations

import re
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio

from proxy.codec.api_keys import ApiKey
from proxy.process import ProxyProcess
from proxy.upstream import UpstreamClient
from tests.benchmarks.soak.run import FLEET_PORT
from tests.testbed import pods
from tests.testbed.broker import KafkaBroker

pytestmark = pytest.mark.broker

UNKNOWN_MEMBER_ID, MEMBER_ID_REQUIRED = 25, 79
REQUESTS = 1000
"""As many as ``max-groups`` (its default)."""
FIRST_HEARTBEATS = 5
"""Heartbeats (at the interval the sidecar asks for) within which a new member of a new group
must be assigned its partitions."""


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(
        rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


COORDINATOR_NOT_AVAILABLE = 15


async def _heartbeats(address: tuple[str, int], group_ids: list[str]) -> list[int]:
    client = await UpstreamClient.connect(address, timeout=10, max_frame_bytes=1 << 20)
    try:
        errors = []
        for group_id in group_ids:
            for _ in range(10):  # a retriable answer is sent again, as clients do
                answer = await client.request(ApiKey.HEARTBEAT, 4, {
                    "group_id": group_id, "generation_id": 1, "member_id": "x",
                    "group_instance_id": None})
                if answer["error_code"] != COORDINATOR_NOT_AVAILABLE:
                    break
                # the sidecar's lookup of who holds the group outlasted the request's wait
                # (half a heartbeat interval, the bounded lookup wait): retried after a
                # backoff, as librdkafka does (retry.backoff.ms)
                await trio.sleep(0.2)
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


async def _new_kip848_member(address: tuple[str, int], group_id: str, topic: str
                             ) -> list[dict[str, Any]]:
    """A new KIP-848 member's first heartbeats, at the interval it is told, until it is
    assigned partitions (at most :data:`FIRST_HEARTBEATS`); then it leaves. The answers."""
    client = await UpstreamClient.connect(address, timeout=10, max_frame_bytes=1 << 20)
    member_id, epoch, answers = uuid.uuid4().hex[:22], 0, []
    try:
        for _ in range(FIRST_HEARTBEATS):
            answer = await client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, {
                "group_id": group_id, "member_id": member_id, "member_epoch": epoch,
                "instance_id": None, "rack_id": None, "rebalance_timeout_ms": 30_000,
                "subscribed_topic_names": [topic], "subscribed_topic_regex": None,
                "server_assignor": None, "topic_partitions": []})
            answers.append(answer)
            if answer["error_code"] == 0:
                epoch = answer["member_epoch"]
                if (answer["assignment"] or {}).get("topic_partitions"):
                    break
            await trio.sleep(answer["heartbeat_interval_ms"] / 1000 or 1)
        if epoch > 0:
            await client.request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 1, {
                "group_id": group_id, "member_id": member_id, "member_epoch": -1,
                "instance_id": None, "rack_id": None, "rebalance_timeout_ms": -1,
                "subscribed_topic_names": None, "subscribed_topic_regex": None,
                "server_assignor": None, "topic_partitions": None})
        return answers
    finally:
        await client.aclose()


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def test_made_up_heartbeats_hold_no_broker_group(tmp_path: Path) -> None:
    """Two pods with a sidecar each (fleet listeners, state log on): 1,000 made-up classic
    heartbeats reach pod a's sidecar; then neither sidecar holds or joined a broker group, the
    ids are joinable straight at the broker, and a new KIP-848 group through pod b's sidecar
    gets its partitions at once. (Each sidecar listens on every address of its pod, so the
    test reaches it over the pod network as well as its pod's own clients on 127.0.0.1.)"""
    ok, why = pods.available()
    if not ok:
        pytest.skip(why)
    with pods.PodNetwork() as network, KafkaBroker.start(
            "3.9", tmp_path / "kafka", host=network.host_ip) as broker:
        sidecars = {}
        try:
            for name in ("a", "b"):
                pod = network.pod(name)
                sidecars[name] = (pod, ProxyProcess.start(
                    broker.bootstrap, tmp_path / f"groupgate-{name}.log", listen="0.0.0.0:9092",
                    wrapper=pod.command([]), args=[
                        "--fleet-listen", f"{pod.ip}:{FLEET_PORT}",
                        "--metrics-listen", "0.0.0.0:0", "--group-heartbeat-interval-ms",
                        "1000"]))
            urls = {}
            for name, (pod, sidecar) in sidecars.items():
                found = re.search(r"metrics and health on http://\S+?:(\d+)/metrics",
                                  sidecar.log())
                assert found, sidecar.log()
                urls[name] = f"http://{pod.ip}:{found.group(1)}/metrics"
            pod_a, pod_b = sidecars["a"][0], sidecars["b"][0]
            group_ids = [f"made-up-{uuid.uuid4().hex}" for _ in range(REQUESTS)]
            errors = trio.run(_heartbeats, (pod_a.ip, 9092), group_ids)
            assert errors == [UNKNOWN_MEMBER_ID] * REQUESTS  # answered as the broker would
            for name, url in urls.items():
                metrics = _metrics(url)
                assert _metric(metrics, "groupgate_broker_group_joins_total") == 0, \
                    (name, metrics)
                assert _metric(metrics, "groupgate_groups_held") == 0, (name, metrics)
            host, _, port = broker.bootstrap.partition(":")
            # a classic consumer straight at the broker is not refused
            # (INCONSISTENT_GROUP_PROTOCOL: a sidecar holding the broker's group)
            for group_id in (group_ids[0], group_ids[-1]):
                assert trio.run(_join_straight, (host, int(port)), group_id) == 0
            for _pod, sidecar in sidecars.values():
                assert "holding the broker's group" not in sidecar.log()
            # and a new KIP-848 group through the other pod's sidecar is served at once
            name = f"made-up-topic-{uuid.uuid4().hex[:8]}"
            broker.create_topic(name, 3)
            group_id = f"served-{uuid.uuid4().hex}"
            answers = trio.run(_new_kip848_member, (pod_b.ip, 9092), group_id, name)
            assigned = (answers[-1]["assignment"] or {}).get("topic_partitions") or []
            assert answers[-1]["error_code"] == 0 and sorted(
                p for t in assigned for p in t["partitions"]) == [0, 1, 2], answers
            print(f"a new KIP-848 group assigned its 3 partitions in heartbeat {len(answers)}")
            assert re.search(rf"group {group_id}: holding the broker's group",
                             sidecars["b"][1].log())
        finally:
            for _pod, sidecar in sidecars.values():
                sidecar.stop()
