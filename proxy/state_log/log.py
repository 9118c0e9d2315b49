"""Durable group state: the coordinating sidecar's records in a compacted Kafka topic.

The group engine's state changes are records (opaque ``(key, value)`` pairs, None for a
tombstone, each key naming its group). The sidecar coordinating a group writes them through the
group's :class:`~proxy.state_log.writer.Writer`; a sidecar taking the group over opens
a new writer (which fences the old one) and loads the group's records before it answers::

    log = StateLog(bootstrap, StateLogSettings(...), group_of=engine_key_group)
    await log.start()                       # the topic: created or checked
    writer = await log.open_writer(group)   # fences every earlier writer of the group
    loaded = await log.load_group(group)    # the group's live records, read committed
    await writer.write([(key, value), (other_key, None)])   # atomic; returns once committed

The parts: :mod:`~proxy.state_log.topic` (topic settings, creation, checks),
:mod:`~proxy.state_log.ids` (group -> partition, group -> transactional id),
:mod:`~proxy.state_log.writer` (transactions and fencing),
:mod:`~proxy.state_log.loader` (reading a group back),
:mod:`~proxy.state_log.cluster` (connections, leaders, coordinators),
:mod:`~proxy.state_log.errors` (exceptions); record batches are
:mod:`proxy.records`. Design and measurements: ``docs/decisions/0013-group-state-log.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proxy.kafka_client.links import Address
from proxy.records import max_record_bytes
from proxy.state_log.cluster import StateCluster
from proxy.state_log.errors import (
    Fenced,
    LoadFailed,
    StateLogError,
    StateTopicError,
    Unavailable,
    WriteFailed,
)
from proxy.state_log.ids import check_prefix, partition_for
from proxy.state_log.loader import GroupOf, LoadConfig, LoadedGroup, load_group
from proxy.state_log.topic import (
    DEFAULT_PARTITIONS,
    DEFAULT_REPLICATION_FACTOR,
    DEFAULT_TOPIC,
    MAX_MESSAGE_BYTES,
    TopicSettings,
    TopicState,
    ensure_topic,
)
from proxy.state_log.writer import KeyValue, Writer, WriterConfig, open_writer

if TYPE_CHECKING:
    from proxy.security.policy import Security

__all__ = ["Fenced", "KeyValue", "LoadFailed", "LoadedGroup", "StateLog", "StateLogError",
           "StateLogSettings", "StateTopicError", "Unavailable", "WriteFailed", "Writer"]


@dataclass(frozen=True)
class StateLogSettings:
    """Everything the state log is configured by (the settings proposed for each are in
    decision record 0013)."""

    topic: str = DEFAULT_TOPIC
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = DEFAULT_REPLICATION_FACTOR
    topic_configs: Mapping[str, str] = field(default_factory=dict)
    """Overrides of :func:`~proxy.state_log.topic.default_configs`."""
    transactional_id_prefix: str = "groupgate-state"
    transaction_timeout_ms: int = 15_000
    """How long the transaction coordinator lets a writer's transaction stay open before it
    aborts it: bounds how long a writer that died mid-write holds back the loads of the other
    groups of its partition. Above ``write_timeout``."""
    write_timeout: float = 10.0
    open_timeout: float = 30.0
    load_timeout: float = 60.0
    topic_timeout: float = 60.0
    fetch_max_bytes: int = 4 * 1024 * 1024
    fetch_wait_ms: int = 100
    max_batch_bytes: int = MAX_MESSAGE_BYTES - 48 * 1024
    connections_per_broker: int = 4
    coalesce_writes: bool = True

    def __post_init__(self) -> None:
        check_prefix(self.transactional_id_prefix)
        if self.transaction_timeout_ms <= self.write_timeout * 1000:
            raise ValueError("transaction_timeout_ms must exceed write_timeout")
        if self.fetch_max_bytes < 1024 or self.max_batch_bytes < 1024:
            raise ValueError("fetch_max_bytes and max_batch_bytes are at least 1 KiB")


class StateLog:
    """The state log of one sidecar: its topic, its writers' and loaders' connections."""

    def __init__(self, bootstrap: Sequence[Address], settings: StateLogSettings, *,
                 group_of: GroupOf, connect_timeout: float = 10.0,
                 request_timeout: float = 30.0, max_frame_bytes: int = 100 * 1024 * 1024,
                 security: Security | None = None) -> None:
        """``security``: how the proxy's own connections reach the cluster (TLS, SASL); None:
        plaintext."""
        if settings.fetch_max_bytes + 64 * 1024 > max_frame_bytes:
            raise ValueError("fetch_max_bytes must leave 64 KiB below max_frame_bytes")
        self.settings = settings
        self.group_of = group_of
        self._auto_replication = settings.replication_factor <= 0
        self.topic = TopicSettings(settings.topic, settings.partitions,
                                   max(1, settings.replication_factor),
                                   dict(settings.topic_configs))
        self.cluster = StateCluster(bootstrap, connect_timeout=connect_timeout,
                                    request_timeout=request_timeout,
                                    max_frame_bytes=max_frame_bytes,
                                    connections_per_broker=settings.connections_per_broker,
                                    security=security)
        self._writer_config = self._writer_config_for(
            _max_message_bytes(self.topic.configs.get("max.message.bytes")))
        self._load_config = LoadConfig(settings.topic, settings.fetch_max_bytes,
                                       settings.fetch_wait_ms, settings.load_timeout)
        self.state: TopicState | None = None

    def _writer_config_for(self, max_message_bytes: int) -> WriterConfig:
        settings = self.settings
        return WriterConfig(
            settings.topic, settings.transactional_id_prefix, settings.transaction_timeout_ms,
            settings.write_timeout, settings.open_timeout,
            min(settings.max_batch_bytes, max_message_bytes), settings.coalesce_writes)

    @property
    def max_record_bytes(self) -> int:
        """The most key and value bytes one record may have: what a batch holding it alone
        leaves of the topic's ``max.message.bytes`` (the configured value until :meth:`start`
        has read the topic's own). A larger record could never be written."""
        if self.state is not None:
            return max_record_bytes(self.state.max_message_bytes)
        return max_record_bytes(_max_message_bytes(self.topic.configs.get("max.message.bytes")))

    @property
    def partitions(self) -> int:
        """The partition count groups are hashed over (the topic's; after :meth:`start`)."""
        if self.state is None:
            raise StateLogError("the state log is not started")
        return self.state.partitions

    async def start(self) -> TopicState:
        """Create or check the topic (StateTopicError, Unavailable). A replication factor of 0
        means "as many brokers as the cluster has, at most 3" (read from Metadata)."""
        if self._auto_replication:
            await self.cluster.topic(self.topic.name)  # learns the cluster's brokers
            rf = max(1, min(3, len(self.cluster.nodes)))
            self.topic = TopicSettings(self.topic.name, self.topic.partitions, rf,
                                       dict(self.topic.overrides))
        self.state = await ensure_topic(self.cluster, self.topic, self.settings.topic_timeout)
        # batches are cut below what the topic really takes
        self._writer_config = self._writer_config_for(self.state.max_message_bytes)
        return self.state

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.partitions)

    async def open_writer(self, group_id: str) -> Writer:
        """The group's writer; fences every earlier one and aborts its open transaction."""
        return await open_writer(self.cluster, self._writer_config, self.partitions, group_id)

    async def load_group(self, group_id: str) -> LoadedGroup:
        """The group's live records, read committed to the end of its partition (after
        :meth:`open_writer`, so that no earlier writer can still add any)."""
        return await load_group(self.cluster, self._load_config, self.partitions, group_id,
                                self.group_of)

    async def aclose(self) -> None:
        await self.cluster.aclose()


def _max_message_bytes(value: str | None) -> int:
    return int(value) if value is not None and value.strip().isdigit() else MAX_MESSAGE_BYTES
