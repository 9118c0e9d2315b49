"""Appends journal events to the journal topic from one trio task; never in the caller's way.

:meth:`JournalWriter.record` is synchronous and O(1): it appends the event to a bounded
in-memory buffer (``journal-buffer-events``) and wakes the writer task, or, when the buffer is
full, drops the event and counts it (``groupgate_journal_events_dropped_total{reason=
"buffer-full"}``). :meth:`JournalWriter.run` does the I/O on dedicated broker links (its own
connections, so a slow Produce never holds up the coordination tasks' requests):

1. Metadata v12 for the topic from a bootstrap broker: partition leaders and broker
   addresses. A missing topic is created (CreateTopics v7 to the controller) with the
   settings of :mod:`proxy.journal.settings`; a topic that exists is used as it is.
2. Events are taken in order, encoded (:meth:`~proxy.journal.schema.Event.encode`), and
   routed by key like Kafka's default partitioner (murmur2 of the group id,
   :mod:`proxy.kafka_client.partitioner`), so a group's events stay in one partition, in
   order; one record batch per partition
   (:mod:`proxy.records`, gzip by default), one Produce v9 per leader, ``acks`` all by
   default. A batch is sent only after the previous one was acknowledged.
3. Retriable errors (leader moved, topic not yet known, not enough replicas, timeouts,
   connection failures) keep the events and retry after a backoff (0.1 s doubling to 5 s),
   with fresh metadata. A batch the broker refuses as too large is split; a single event it
   refuses, or any other permanent error, is dropped and counted
   (``reason="rejected"``).

Events may be written twice when an acknowledgement is lost; ``(source, seq)`` identifies an
event, and the report reads each once. :func:`run_snapshots` writes every group's snapshot
each ``journal-snapshot-interval-ms``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from proxy.codec.api_keys import ApiKey
from proxy.kafka_client.create_topic import (
    CREATE_TOPICS_VERSION,
    create_topic_error,
    create_topic_request,
)
from proxy.kafka_client.links import Address, BrokerLink, LinkPool
from proxy.kafka_client.metadata import METADATA_VERSION, brokers, metadata_request, topic_info
from proxy.kafka_client.partitioner import partition_for
from proxy.kafka_client.produce import (
    NOT_ANSWERED,
    PRODUCE_VERSION,
    partition_results,
    produce_request,
)
from proxy.metrics import (
    JOURNAL_BUFFERED,
    JOURNAL_DROPPED,
    JOURNAL_WRITE_ERRORS,
    JOURNAL_WRITTEN,
)
from proxy.records import Record, encode_batch
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

from .observer import JournalObserver
from .schema import Event
from .settings import JournalSettings

log = logging.getLogger("groupgate.journal")

LINGER_S = 0.05
"""How long the task waits after the first event of a batch for more to come."""
MAX_BATCH_BYTES = 900_000
"""Uncompressed keys and values per Produce (brokers accept 1 MiB batches by default)."""
BACKOFF_S = (0.1, 5.0)
REQUEST_TIMEOUT_S = 30.0

RETRIABLE = frozenset({
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.NOT_CONTROLLER,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.UNKNOWN_SERVER_ERROR,
})
"""Produce and Metadata errors worth another try; any other refusal drops the events."""
TOO_LARGE = frozenset({ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE})

_DROPPED_FULL = JOURNAL_DROPPED.labels("buffer-full")
_DROPPED_REJECTED = JOURNAL_DROPPED.labels("rejected")


def wall_ms() -> int:
    """The wall clock in ms since the epoch: event times."""
    return time.time_ns() // 1_000_000


class JournalError(Exception):
    """The journal topic cannot be written right now (retried)."""


@dataclass(slots=True)
class _Metadata:
    leaders: list[int]
    """Leader node id per partition (-1: none now)."""
    brokers: dict[int, Address]


@dataclass(slots=True)
class _Pending:
    """Events taken from the buffer, encoded, waiting for their acknowledgement."""

    key: bytes
    value: bytes
    ts: int


@dataclass(slots=True)
class _Stats:
    written: int = 0
    dropped_full: int = 0
    rejected: int = 0
    errors: int = 0
    topic_created: bool = False
    last_error: str = ""
    produce_requests: int = 0


class JournalWriter:
    """The journal's buffer and its writer task (see the module docstring)."""

    def __init__(self, settings: JournalSettings, links: LinkPool,
                 bootstrap: Sequence[Address], *, linger_s: float = LINGER_S,
                 max_batch_bytes: int = MAX_BATCH_BYTES,
                 backoff_s: tuple[float, float] = BACKOFF_S,
                 request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        if settings.topic is None:
            raise ValueError("the journal is off (no journal-topic)")
        self.settings = settings
        self.topic: str = settings.topic
        self._links = links
        self._own_links: dict[Address, BrokerLink] = {}
        self._bootstrap = tuple(bootstrap)
        self._linger_s = linger_s
        self._max_batch_bytes = max_batch_bytes
        self._backoff_s = backoff_s
        self._request_timeout_s = request_timeout_s
        self._buffer: deque[Event] = deque()
        self._pending: list[_Pending] = []
        self._wake = trio.Event()
        self._idle = trio.Event()
        self._idle.set()
        self._metadata: _Metadata | None = None
        self._batch_limit = math.inf
        """Events per partition per Produce; halved when a broker refuses a batch as too
        large, back to unlimited after a success."""
        self.stats = _Stats()
        self._last_refusal = ""

    # ------------------------------------------------------------------ the callers' side

    def record(self, event: Event) -> None:
        """Queue ``event``; drop and count it when the buffer is full. Never blocks."""
        if len(self._buffer) + len(self._pending) >= self.settings.buffer_events:
            self.stats.dropped_full += 1
            _DROPPED_FULL.inc()
            return
        self._buffer.append(event)
        if self._idle.is_set():
            self._idle = trio.Event()
        if not self._wake.is_set():
            self._wake.set()

    def record_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.record(event)

    @property
    def buffered(self) -> int:
        """Events not yet acknowledged (queued or in flight)."""
        return len(self._buffer) + len(self._pending)

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every queued event is written (True) or ``timeout_s`` passed (False)."""
        with trio.move_on_after(timeout_s):
            await self._idle.wait()
            return True
        return False

    # ------------------------------------------------------------------ the task

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        backoff = self._backoff_s[0]
        try:
            while True:
                if not self._buffer and not self._pending:
                    self._idle.set()
                    JOURNAL_BUFFERED.set(0)
                    await self._wake.wait()
                    self._wake = trio.Event()
                    await trio.sleep(self._linger_s)
                JOURNAL_BUFFERED.set(self.buffered)
                try:
                    await self._write_some()
                    backoff = self._backoff_s[0]
                    if self.stats.last_error:
                        log.info("journal %s: writing again", self.topic)
                        self.stats.last_error = ""
                except (JournalError, UpstreamError) as exc:
                    self.stats.errors += 1
                    JOURNAL_WRITE_ERRORS.inc()
                    self._metadata = None
                    message = str(exc)
                    if message != self.stats.last_error:
                        log.warning("journal %s: %s (retrying; %d events waiting)",
                                    self.topic, message, self.buffered)
                        self.stats.last_error = message
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, self._backoff_s[1])
        finally:
            with trio.CancelScope(shield=True):
                for link in self._own_links.values():
                    await link.aclose()
                self._own_links.clear()

    def _link(self, address: Address) -> BrokerLink:
        link = self._own_links.get(address)
        if link is None:
            link = self._own_links[address] = self._links.dedicated(
                address, self._request_timeout_s)
        return link

    async def _request(self, address: Address, api_key: int, version: int,
                       value: dict[str, Any]) -> dict[str, Any]:
        return await self._link(address).request(api_key, version, value,
                                                 timeout=self._request_timeout_s + 5)

    # ------------------------------------------------------------------ metadata and topic

    async def _metadata_now(self) -> _Metadata:
        if self._metadata is None:
            response, address = await self._ask_metadata()
            topic = topic_info(response, self.topic)
            if topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                await self._create_topic(brokers(response).get(response["controller_id"],
                                                               address))
                response, _ = await self._ask_metadata()
                topic = topic_info(response, self.topic)
            if topic.error_code != ErrorCode.NONE:
                raise JournalError(f"metadata: {_code_name(topic.error_code)}")
            leaders = [topic.leaders.get(p, -1) for p in range(topic.partitions)]
            if not leaders:
                raise JournalError("metadata: the topic has no partitions")
            self._metadata = _Metadata(leaders, brokers(response))
        return self._metadata

    async def _ask_metadata(self) -> tuple[dict[str, Any], Address]:
        request = metadata_request([self.topic])
        failures = []
        for address in self._bootstrap:
            try:
                return await self._request(address, ApiKey.METADATA, METADATA_VERSION,
                                           request), address
            except UpstreamError as exc:
                failures.append(str(exc))
        raise JournalError(f"metadata: no bootstrap broker answered ({'; '.join(failures)})")

    async def _create_topic(self, address: Address) -> None:
        """CreateTopics for the journal topic, at the controller (``address``)."""
        s = self.settings
        request = create_topic_request(
            self.topic, partitions=s.partitions, replication_factor=s.replication_factor,
            configs={"cleanup.policy": "delete", "retention.ms": str(s.retention_ms)},
            timeout_ms=int(self._request_timeout_s * 1000))
        response = await self._request(address, ApiKey.CREATE_TOPICS, CREATE_TOPICS_VERSION,
                                       request)
        code, detail = create_topic_error(response)
        if code == ErrorCode.NONE:
            self.stats.topic_created = True
            log.info("journal topic %s created (partitions %s, replication factor %s, "
                     "retention.ms %d)", self.topic, _or_default(s.partitions),
                     _or_default(s.replication_factor), s.retention_ms)
        elif code != ErrorCode.TOPIC_ALREADY_EXISTS:
            raise JournalError(f"creating the topic: {_code_name(code)} {detail}".rstrip())

    # ------------------------------------------------------------------ writing

    def _take(self) -> None:
        """Move events from the buffer to the pending list, encoded, up to the batch size."""
        size = sum(len(p.value) for p in self._pending)
        buffer = self._buffer
        while buffer and size < self._max_batch_bytes:
            event = buffer.popleft()
            value = event.encode()
            size += len(value)
            self._pending.append(_Pending(event.key, value, event.ts))

    async def _write_some(self) -> None:
        self._take()
        if not self._pending:
            return
        metadata = await self._metadata_now()
        n = len(metadata.leaders)
        by_partition: dict[int, list[int]] = {}
        for index, item in enumerate(self._pending):
            ids = by_partition.setdefault(partition_for(item.key, n), [])
            if len(ids) < self._batch_limit:
                ids.append(index)
        by_leader: dict[int, list[int]] = {}
        for partition in by_partition:
            by_leader.setdefault(metadata.leaders[partition], []).append(partition)
        done: set[int] = set()
        rejected: set[int] = set()
        retry: list[str] = []
        for leader, partitions in by_leader.items():
            address = metadata.brokers.get(leader)
            if leader < 0 or address is None:
                retry.append(f"no leader for partitions {sorted(partitions)}")
                continue
            await self._produce(address, partitions, by_partition, done, rejected, retry)
        if rejected:
            self.stats.rejected += len(rejected)
            _DROPPED_REJECTED.inc(len(rejected))
        if done or rejected:
            self.stats.written += len(done)
            JOURNAL_WRITTEN.inc(len(done))
            self._pending = [p for i, p in enumerate(self._pending)
                             if i not in done and i not in rejected]
            JOURNAL_BUFFERED.set(self.buffered)
        if retry:
            raise JournalError("; ".join(retry))
        self._batch_limit = math.inf

    async def _produce(self, address: Address, partitions: list[int],
                       by_partition: dict[int, list[int]], done: set[int], rejected: set[int],
                       retry: list[str]) -> None:
        pending = self._pending
        batches = {p: encode_batch(
            [Record(pending[i].key, pending[i].value, pending[i].ts) for i in by_partition[p]],
            compression=self.settings.compression) for p in partitions}
        request = produce_request(self.topic, batches, acks=self.settings.acks,
                                  timeout_ms=int(self._request_timeout_s * 1000))
        self.stats.produce_requests += 1
        response = await self._request(address, ApiKey.PRODUCE, PRODUCE_VERSION, request)
        answered = partition_results(response, self.topic)
        for partition in partitions:
            ids = by_partition[partition]
            result = answered.get(partition, NOT_ANSWERED)
            code = result["error_code"]
            if code == ErrorCode.NONE:
                done.update(ids)
            elif code in TOO_LARGE and len(ids) > 1:
                self._batch_limit = max(1, len(ids) // 2)
                retry.append(f"partition {partition}: {_code_name(code)}, splitting the batch")
            elif code in RETRIABLE:
                retry.append(f"partition {partition}: {_code_name(code)}")
            else:
                rejected.update(ids)
                message = f"{_code_name(code)} {result.get('error_message') or ''}"
                if message != self._last_refusal:
                    self._last_refusal = message
                    log.warning("journal %s partition %d refused %d events: %s", self.topic,
                                partition, len(ids), message.rstrip())


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"


def _or_default(value: int) -> str:
    return "the cluster's default" if value == -1 else str(value)


async def run_snapshots(observer: JournalObserver, journal: JournalWriter, interval_s: float,
                        *, clock: Callable[[], int] = wall_ms, per_step: int = 50) -> None:
    """Every ``interval_s``: a snapshot of every group the engine has, ``per_step`` groups at a
    time between checkpoints, so a large engine does not hold up other tasks."""
    while True:
        await trio.sleep(interval_s)
        for n, group_id in enumerate(observer.group_ids(), start=1):
            journal.record_all(observer.snapshot(group_id, clock()))
            if n % per_step == 0:
                await trio.sleep(0)
