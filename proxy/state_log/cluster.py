"""The state log's own connections to the cluster and what it knows of it.

:class:`StateCluster` keeps, apart from the proxy's other broker links, up to
``connections_per_broker`` :class:`~proxy.kafka_client.links.BrokerLink` per broker address
(a link carries one request at a time and a broker handles one connection's requests in
order, so writers of different groups spread over several), the broker addresses and
partition leaders from Metadata, and finds transaction coordinators (FindCoordinator,
key type 1). Links are opened as the proxy's own identity (TLS and SASL as the cluster wants,
:class:`~proxy.security.policy.Security`). Every lookup retries what Kafka calls retriable
until a deadline; what is known is dropped when a broker says it moved
(:meth:`forget_leader`).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from proxy.codec.api_keys import ApiKey
from proxy.kafka_client.links import Address, BrokerLink
from proxy.kafka_client.metadata import (
    FIND_COORDINATOR_VERSION,
    METADATA_VERSION,
    TRANSACTION_KEY,
    TopicInfo,
    brokers,
    find_coordinator_request,
    metadata_request,
    topic_info,
)
from proxy.state_log.errors import Unavailable
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.security.policy import Security

log = logging.getLogger("groupgate.state_log")

RETRY_FIRST = 0.005
RETRY_MAX = 0.25
COORDINATOR_RETRIABLE = frozenset({ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                   ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                   ErrorCode.NOT_COORDINATOR})


class Backoff:
    """Sleeps that double from RETRY_FIRST to RETRY_MAX, never past ``deadline``."""

    def __init__(self, deadline: float, what: str) -> None:
        self.deadline = deadline
        self.what = what
        self._next = RETRY_FIRST
        self.last = ""

    async def wait(self, reason: str) -> None:
        """Sleep before the next try, or raise :class:`Unavailable` if there is no time."""
        self.last = reason
        now = trio.current_time()
        if now + self._next > self.deadline:
            raise Unavailable(f"{self.what}: {reason}")
        await trio.sleep(self._next)
        self._next = min(self._next * 2, RETRY_MAX)


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


class StateCluster:
    def __init__(self, bootstrap: Sequence[Address], *, connect_timeout: float,
                 request_timeout: float, max_frame_bytes: int,
                 connections_per_broker: int, security: Security | None = None) -> None:
        if not bootstrap:
            raise ValueError("no bootstrap server")
        self.bootstrap = tuple(bootstrap)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.max_frame_bytes = max_frame_bytes
        self.connections_per_broker = max(1, connections_per_broker)
        self.security = security
        self._links: dict[tuple[Address, int], BrokerLink] = {}
        self.nodes: dict[int, Address] = {}
        self._leaders: dict[tuple[str, int], int] = {}

    def link(self, address: Address, key: str = "") -> BrokerLink:
        """The link to ``address`` that ``key`` (a group id) uses: the same one every time."""
        slot = zlib.crc32(key.encode("utf-8", "surrogatepass")) % self.connections_per_broker
        link = self._links.get((address, slot))
        if link is None:
            link = self._links[(address, slot)] = BrokerLink(
                address, connect_timeout=self.connect_timeout,
                request_timeout=self.request_timeout, max_frame_bytes=self.max_frame_bytes,
                security=self.security)
        return link

    async def aclose(self) -> None:
        links, self._links = list(self._links.values()), {}
        for link in links:
            await link.aclose()

    async def any_broker(self, api_key: int, version: int, value: dict[str, Any], *,
                         timeout: float | None = None) -> dict[str, Any]:
        """Send to the first bootstrap server (or known broker) that answers."""
        last = "no broker answered"
        for address in (*self.bootstrap, *(a for a in self.nodes.values()
                                           if a not in self.bootstrap)):
            try:
                return await self.link(address).request(api_key, version, value,
                                                        timeout=timeout)
            except UpstreamError as exc:
                last = str(exc)
        raise UpstreamError(last)

    async def topic(self, name: str) -> TopicInfo:
        """Metadata of topic ``name`` (error_code UNKNOWN_TOPIC_OR_PARTITION when missing);
        remembers broker addresses and partition leaders."""
        response = await self.any_broker(ApiKey.METADATA, METADATA_VERSION,
                                         metadata_request([name]))
        self.nodes.update(brokers(response))
        info = topic_info(response, name)
        for partition, leader in info.leaders.items():
            self._leaders[(name, partition)] = leader
        return info

    def forget_leader(self, topic: str, partition: int) -> None:
        self._leaders.pop((topic, partition), None)

    async def leader(self, topic: str, partition: int, deadline: float) -> Address:
        """The address of the partition's leader, asking Metadata until it has one."""
        backoff = Backoff(deadline, f"leader of {topic}-{partition}")
        while True:
            node = self._leaders.get((topic, partition), -1)
            if node >= 0 and node in self.nodes:
                return self.nodes[node]
            try:
                info = await self.topic(topic)
                reason = (f"{error_name(info.error_code)}" if info.error_code
                          else "no leader")
            except UpstreamError as exc:
                reason = str(exc)
            node = self._leaders.get((topic, partition), -1)
            if node >= 0 and node in self.nodes:
                return self.nodes[node]
            await backoff.wait(reason)

    async def transaction_coordinator(self, transactional_id: str, deadline: float) -> Address:
        """The broker coordinating ``transactional_id`` (FindCoordinator, key type 1)."""
        backoff = Backoff(deadline, f"transaction coordinator of {transactional_id}")
        while True:
            try:
                response = await self.any_broker(
                    ApiKey.FIND_COORDINATOR, FIND_COORDINATOR_VERSION,
                    find_coordinator_request(transactional_id, TRANSACTION_KEY))
            except UpstreamError as exc:
                await backoff.wait(str(exc))
                continue
            error = response["error_code"]
            if error == ErrorCode.NONE:
                address = (response["host"], response["port"])
                self.nodes.setdefault(response["node_id"], address)
                return address
            if error not in COORDINATOR_RETRIABLE:
                raise Unavailable(f"FindCoordinator for {transactional_id}: "
                                  f"{error_name(error)} {response.get('error_message') or ''}")
            await backoff.wait(error_name(error))
