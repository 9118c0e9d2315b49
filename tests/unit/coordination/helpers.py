"""Fakes for the coordination unit tests: a broker membership that never touches the network
and a link pool that records requests and answers from a script."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from proxy.config import ProxyConfig
from proxy.coordination.links import LinkPool
from proxy.coordination.membership import BrokerMembership
from proxy.coordination.service import CoordinatorService
from translation.topics import TopicMetadata, TopicsImage

TOPIC = "orders"
TOPIC_ID = uuid.UUID("0b6f9a4c-1d2e-4f3a-9b8c-7d6e5f4a3b2c")
COORDINATOR = ("10.0.0.1", 9092)

Answer = Callable[[int, int, dict[str, Any]], dict[str, Any]]


class FakeMembership(BrokerMembership):
    """Established at once (member ``proxy-member``, generation 7); records leaving."""

    def __init__(self, group_id: str, pool: LinkPool) -> None:
        super().__init__(group_id, pool, [("127.0.0.1", 1)], connect_timeout=1)
        self.member_id = "proxy-member"
        self.generation = 7
        self.coordinator = COORDINATOR
        self.coordinator_node = 1
        self.stable = True
        self.settled.set()
        self.leaves = 0

    async def run(self) -> None:
        return None

    async def leave(self) -> None:
        self.leaves += 1
        self.left = True


class FakeLink:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[tuple[int, int, dict[str, Any]]] = []

    async def request(self, api_key: int, version: int, value: dict[str, Any], *,
                      timeout: float | None = None) -> dict[str, Any]:
        self.requests.append((api_key, version, value))
        return self.answer(api_key, version, value)


class FakePool(LinkPool):
    def __init__(self, answer: Answer) -> None:
        super().__init__(connect_timeout=1, request_timeout=1, max_frame_bytes=1 << 20)
        self.fake = FakeLink(answer)
        self.addresses: list[tuple[str, int]] = []

    def link(self, address: tuple[str, int]) -> Any:
        self.addresses.append(address)
        return self.fake


def make_service(answer: Answer | None = None, **settings: Any) -> CoordinatorService:
    config = ProxyConfig(upstream=(("127.0.0.1", 1),), group_heartbeat_interval_ms=500,
                         group_session_timeout_ms=6000, **settings)
    service = CoordinatorService(config)
    service.pool = FakePool(answer or (lambda k, v, value: {}))
    service.engine.update_topics(TopicsImage.of([TopicMetadata(TOPIC_ID, TOPIC, 4)]), 0)
    return service


def coordinate(service: CoordinatorService, group_id: str) -> FakeMembership:
    membership = FakeMembership(group_id, service.pool)
    service.memberships[group_id] = membership
    return membership
