"""Topic identity and the topic metadata the engine sees.

Inside the engine a topic is its Kafka topic id (a UUID), never its name: a topic deleted and
recreated under the same name is a different topic. The proxy feeds the broker's Metadata into
a :class:`TopicsImage`; assignors read it through :class:`SubscribedTopicDescriber`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

TopicId = uuid.UUID
"""A Kafka topic id. ``uuid.UUID`` so it hashes and compares cheaply and prints like Kafka's."""


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """One topic as the broker describes it: id, name and partition count."""

    topic_id: TopicId
    name: str
    partitions: int


@dataclass(frozen=True, slots=True)
class TopicsImage:
    """An immutable snapshot of the cluster's topics, indexed both ways."""

    by_id: Mapping[TopicId, TopicMetadata] = field(default_factory=dict)
    by_name: Mapping[str, TopicMetadata] = field(default_factory=dict)

    @staticmethod
    def of(topics: list[TopicMetadata] | tuple[TopicMetadata, ...]) -> TopicsImage:
        return TopicsImage(
            by_id={t.topic_id: t for t in topics}, by_name={t.name: t for t in topics}
        )


class SubscribedTopicDescriber(Protocol):
    """What an assignor may ask about topics (Kafka's ``SubscribedTopicDescriber``)."""

    def partition_count(self, topic_id: TopicId) -> int:
        """Number of partitions of ``topic_id``, or -1 when the topic is unknown."""
        ...
