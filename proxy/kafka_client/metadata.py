"""Metadata and FindCoordinator as the proxy asks them for itself.

Every lookup the proxy makes on its own behalf builds its request and reads the answer here:
the coordinator service's topic watcher (topic ids, names and partition counts), the state
log (its topic's partitions, leaders and replication factor; transaction coordinators), the
journal writer (its topic's leaders, the controller) and the readiness check
(:func:`fetch_brokers`). Metadata a client sends is forwarded and only its broker addresses
rewritten (:mod:`proxy.rewrite.brokers`); the authorization probes ask on the client's own
connection (:mod:`proxy.security.rights`).

Metadata v12 (topic ids; the engine names topics by them) for topic lookups; v4, which every
broker since Kafka 1.0 answers, for the broker list alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from proxy.codec.api_keys import ApiKey
from proxy.kafka_client.links import Address
from proxy.upstream import UpstreamClient, UpstreamError
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.security.policy import Security

METADATA_VERSION = 12
BROKERS_VERSION = 4
"""Metadata version of :func:`fetch_brokers`."""
FIND_COORDINATOR_VERSION = 3
FIND_COORDINATORS_VERSION = 4
"""FindCoordinator with an array of keys (KIP-699, Kafka 3.0): every broker that answers
Metadata v12 (Kafka 3.1) answers it."""
GROUP_KEY = 0
TRANSACTION_KEY = 1
"""FindCoordinator key types: a group id, a transactional id."""
ZERO_UUID = uuid.UUID(int=0)
"""The topic id of a topic asked for by name (and of one the broker has no id for)."""


def metadata_request(names: Iterable[str] | None) -> dict[str, Any]:
    """A Metadata request for the topics ``names`` (None: every topic; empty: none)."""
    topics = None if names is None else [{"topic_id": ZERO_UUID, "name": n} for n in names]
    return {"topics": topics, "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False}


def brokers(response: dict[str, Any]) -> dict[int, Address]:
    """node id -> address of every broker a Metadata response lists."""
    return {b["node_id"]: (b["host"], b["port"]) for b in response["brokers"]}


@dataclass(frozen=True, slots=True)
class TopicInfo:
    error_code: int
    partitions: int
    replication_factor: int
    leaders: dict[int, int]
    """partition -> leader node id (-1: none right now)."""


def topic_info(response: dict[str, Any], name: str) -> TopicInfo:
    """Topic ``name`` in a Metadata response (UNKNOWN_TOPIC_OR_PARTITION when missing)."""
    for t in response["topics"]:
        if t["name"] != name:
            continue
        leaders = {p["partition_index"]: (p["leader_id"] if p["error_code"] == 0 else -1)
                   for p in t["partitions"]}
        rf = max((len(p["replica_nodes"]) for p in t["partitions"]), default=0)
        return TopicInfo(t["error_code"], len(t["partitions"]), rf, leaders)
    return TopicInfo(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0, 0, {})


def find_coordinator_request(key: str, key_type: int) -> dict[str, Any]:
    """A FindCoordinator request (v3) for ``key`` (:data:`GROUP_KEY` or
    :data:`TRANSACTION_KEY`)."""
    return {"key": key, "key_type": key_type}


def find_coordinators_request(keys: Iterable[str], key_type: int) -> dict[str, Any]:
    """A FindCoordinator request (v4) for every key of ``keys`` at once."""
    return {"key_type": key_type, "coordinator_keys": list(keys)}


async def fetch_brokers(address: Address, *, timeout: float, max_frame_bytes: int,
                        security: Security | None = None) -> list[tuple[int, str, int]]:
    """(node_id, host, port) of every broker, from a Metadata request for no topics on a
    connection of its own."""
    client = await UpstreamClient.connect(address, timeout=timeout,
                                          max_frame_bytes=max_frame_bytes, security=security)
    try:
        with trio.fail_after(timeout):
            response = await client.request(ApiKey.METADATA, BROKERS_VERSION,
                                            metadata_request(()))
    except trio.TooSlowError as exc:
        raise UpstreamError(f"{address[0]}:{address[1]}: Metadata timed out") from exc
    finally:
        await client.aclose()
    return [(b["node_id"], b["host"], b["port"]) for b in response["brokers"]]
