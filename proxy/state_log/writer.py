"""One writer per group: a transactional producer of the group's records, fenced by its id.

:func:`open_writer` finds the transaction coordinator of the group's transactional id
(:func:`~proxy.state_log.ids.transactional_id`) and sends InitProducerId without a
producer id. The coordinator bumps the id's epoch, which fences every earlier writer of the
group: a transaction it had open is aborted (the coordinator answers CONCURRENT_TRANSACTIONS
until the abort markers are written, and this retries), and every later request of the old
writer is refused with PRODUCER_FENCED or INVALID_PRODUCER_EPOCH.

:meth:`Writer.write` appends records as one transaction: AddPartitionsToTxn (the group's
partition), Produce (acks=all, one transactional batch per ``max_batch_bytes``, sequence
numbers counted from 0 per epoch), EndTxn(commit). It returns once the commit is answered;
the records then are in the log, replicated to ``min.insync.replicas``, and every
read_committed reader (:mod:`~proxy.state_log.loader`) sees all or none of them.
Requests use Kafka's transaction protocol as of 2.5 (Produce v9, AddPartitionsToTxn v3,
EndTxn v3), which 3.x and 4.x brokers both serve with one epoch per producer session.

Errors, by what they mean for the writer:

* fenced (:class:`~proxy.state_log.errors.Fenced`, the writer is dead for good):
  PRODUCER_FENCED, INVALID_PRODUCER_EPOCH (an older epoch: a newer writer exists), and
  INVALID_PRODUCER_ID_MAPPING (the id now maps to another producer: it expired and was opened
  again, or was taken over). A writer never calls InitProducerId without its own producer id
  and epoch again, which would fence a newer writer: only the caller, holding the group's
  lease, opens a new one.
* retried within ``write_timeout``: CONCURRENT_TRANSACTIONS and COORDINATOR_LOAD_IN_PROGRESS
  (same request after a backoff; for AddPartitionsToTxn and EndTxn also the metadata errors
  below, which a coordinator answers while its metadata lags a leader change),
  NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, TRANSACTION_COORDINATOR_FENCED (find the
  coordinator again), NOT_LEADER_OR_FOLLOWER,
  LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION, FENCED/UNKNOWN_LEADER_EPOCH,
  KAFKA_STORAGE_ERROR (find the leader again), NOT_ENOUGH_REPLICAS(_AFTER_APPEND),
  REQUEST_TIMED_OUT, NETWORK_EXCEPTION and lost connections (the same batch with the same
  sequence: the broker drops a duplicate, DUPLICATE_SEQUENCE_NUMBER counts as written).
* anything else (OUT_OF_ORDER_SEQUENCE_NUMBER, UNKNOWN_PRODUCER_ID, INVALID_TXN_STATE, a
  record too large, authorization errors) or a deadline passed: the transaction is aborted by
  InitProducerId with the writer's own producer id and epoch (KIP-360: the coordinator aborts
  the open transaction and bumps the epoch, or answers PRODUCER_FENCED if a newer writer
  exists), and :class:`~proxy.state_log.errors.WriteFailed` is raised with
  ``committed=False``, or ``committed=None`` when EndTxn(commit) was sent without an answer
  (the commit may have happened). Authorization errors are ``retriable=False``. If the abort
  itself fails, the next write does it first.

Writes of one writer are serialized in call order. With ``coalesce`` on, writes that arrive
while a transaction is in flight wait together and go into the next transaction as one (group
commit), in call order; each of them returns or fails with that transaction. A transaction
runs shielded from its callers' cancellation, bounded by ``write_timeout``; a write cancelled
while it waits may still be committed with the next transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from proxy.codec.api_keys import ApiKey
from proxy.kafka_client.links import Address
from proxy.kafka_client.produce import (
    NOT_ANSWERED,
    PRODUCE_VERSION,
    partition_results,
    produce_request,
)
from proxy.metrics import STATE_LOG_WRITES
from proxy.records import Record, encode_batch, split
from proxy.state_log.cluster import Backoff, StateCluster, error_name
from proxy.state_log.errors import (
    Fenced,
    StateLogError,
    Unavailable,
    WriteFailed,
)
from proxy.state_log.ids import partition_for, transactional_id
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.state_log")

INIT_PRODUCER_ID_VERSION = 4
ADD_PARTITIONS_VERSION = 3
END_TXN_VERSION = 3
NO_PRODUCER = -1
SEQUENCE_MODULUS = 1 << 31

KeyValue = tuple[bytes, bytes | None]
"""A state record as the engine gives it: (key, value), a None value being a tombstone."""

FENCING = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH,
                     ErrorCode.INVALID_PRODUCER_ID_MAPPING})
NOT_AUTHORIZED = frozenset({ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                            ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            ErrorCode.CLUSTER_AUTHORIZATION_FAILED})
COORDINATOR_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                               ErrorCode.TRANSACTION_COORDINATOR_FENCED})
COORDINATOR_BUSY = frozenset({ErrorCode.CONCURRENT_TRANSACTIONS,
                              ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                              ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NETWORK_EXCEPTION})
LEADER_MOVED = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
                          ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.FENCED_LEADER_EPOCH,
                          ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.KAFKA_STORAGE_ERROR})
COORDINATOR_RETRY = COORDINATOR_BUSY | LEADER_MOVED
"""Errors a transaction coordinator answers that the same request retried fixes: besides a busy
coordinator, AddPartitionsToTxn answers UNKNOWN_TOPIC_OR_PARTITION (and other metadata errors)
while the coordinator's metadata lags a leader change, as when a broker stops."""
PRODUCE_RETRY = frozenset({ErrorCode.NOT_ENOUGH_REPLICAS,
                           ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                           ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NETWORK_EXCEPTION})


class Refused(StateLogError):
    """A broker answered an error that no retry of the same request fixes."""

    def __init__(self, what: str, code: int, message: str | None = None) -> None:
        super().__init__(f"{what}: {error_name(code)}" + (f" ({message})" if message else ""))
        self.code = code


@dataclass(frozen=True, slots=True)
class WriterConfig:
    topic: str
    transactional_id_prefix: str
    transaction_timeout_ms: int
    write_timeout: float
    open_timeout: float
    max_batch_bytes: int
    coalesce: bool


def _remaining(deadline: float) -> float:
    return max(0.001, deadline - trio.current_time())


async def init_producer_id(cluster: StateCluster, txn_id: str, *, transaction_timeout_ms: int,
                           deadline: float, key: str, producer_id: int = NO_PRODUCER,
                           producer_epoch: int = NO_PRODUCER) -> tuple[int, int, Address]:
    """(producer id, epoch, coordinator) from InitProducerId, retried until ``deadline``."""
    backoff = Backoff(deadline, f"InitProducerId for {txn_id}")
    coordinator: Address | None = None
    while True:
        if coordinator is None:
            coordinator = await cluster.transaction_coordinator(txn_id, deadline)
        try:
            response = await cluster.link(coordinator, key).request(
                ApiKey.INIT_PRODUCER_ID, INIT_PRODUCER_ID_VERSION, {
                    "transactional_id": txn_id, "transaction_timeout_ms": transaction_timeout_ms,
                    "producer_id": producer_id, "producer_epoch": producer_epoch},
                timeout=_remaining(deadline))
        except UpstreamError as exc:
            coordinator = None
            await backoff.wait(str(exc))
            continue
        error = response["error_code"]
        if error == ErrorCode.NONE:
            return response["producer_id"], response["producer_epoch"], coordinator
        if error in FENCING:
            raise Fenced(f"{txn_id}: {error_name(error)}: a newer writer holds it")
        if error in COORDINATOR_MOVED:
            coordinator = None
        elif error not in COORDINATOR_BUSY:
            raise Refused(f"InitProducerId for {txn_id}", error)
        await backoff.wait(error_name(error))


@dataclass(slots=True)
class _Slot:
    """Records of the writes that go into one transaction."""

    records: list[KeyValue] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)
    error: StateLogError | None = None


class Writer:
    """The group's only writer while nobody opens another (see the module doc)."""

    def __init__(self, cluster: StateCluster, config: WriterConfig, group_id: str,
                 txn_id: str, partition: int, producer_id: int, producer_epoch: int,
                 coordinator: Address) -> None:
        self.group_id = group_id
        self.transactional_id = txn_id
        self.partition = partition
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.transactions = 0
        """Transactions committed (with ``coalesce``, fewer than successful writes)."""
        self._cluster = cluster
        self._config = config
        self._coordinator: Address | None = coordinator
        self._sequence = 0
        self._fenced: Fenced | None = None
        self._recover_first = False
        self._closed = False
        self._lock = trio.Lock()
        self._gathering = _Slot()

    @property
    def fenced(self) -> bool:
        return self._fenced is not None

    async def write(self, records: Sequence[KeyValue]) -> None:
        """Append ``records`` atomically; return once committed (see the module doc)."""
        if self._fenced is not None:
            raise Fenced(str(self._fenced))
        if self._closed:
            raise StateLogError(f"the writer of group {self.group_id} is closed")
        if not records:
            return
        slot = self._gathering if self._config.coalesce else _Slot()
        slot.records.extend(records)
        async with self._lock:
            if not slot.done.is_set():
                if slot is self._gathering:
                    self._gathering = _Slot()
                with trio.CancelScope(shield=True):
                    await self._commit(slot)
        if slot.error is not None:
            raise _again(slot.error)

    async def aclose(self) -> None:
        """Stop writing (nothing is open between writes; the links belong to the log)."""
        self._closed = True

    async def _commit(self, slot: _Slot) -> None:
        began: float | None = None
        try:
            if self._fenced is not None:
                raise Fenced(str(self._fenced))
            began = trio.current_time()
            await self._transaction(slot.records)
            self.transactions += 1
            STATE_LOG_WRITES.labels("committed").observe(trio.current_time() - began)
        except StateLogError as exc:
            if began is not None:
                STATE_LOG_WRITES.labels("failed").observe(trio.current_time() - began)
            slot.error = exc
        except BaseException as exc:
            slot.error = WriteFailed(f"group {self.group_id}: {exc!r}", committed=None)
            raise
        finally:
            slot.done.set()

    async def _transaction(self, records: Sequence[KeyValue]) -> None:
        deadline = trio.current_time() + self._config.write_timeout
        commit_sent = False
        try:
            if self._recover_first:
                await self._recover(deadline, "an earlier write's transaction")
            await self._begin(records, deadline)
            commit_sent = True
            await self._end(True, deadline)
        except Fenced as exc:
            self._fenced = exc
            raise
        except (Refused, Unavailable) as exc:
            committed: bool | None = None if commit_sent else False
            retriable = not (isinstance(exc, Refused) and exc.code in NOT_AUTHORIZED)
            log.warning("group %s: state write failed (%s); aborting it", self.group_id, exc)
            try:
                await self._recover(trio.current_time() + self._config.write_timeout,
                                    "a failed write")
            except Fenced:
                raise
            except StateLogError as again:
                log.warning("group %s: aborting the failed state write failed too (%s); the "
                            "next write aborts it first", self.group_id, again)
            raise WriteFailed(f"group {self.group_id}: {exc}", committed=committed,
                              retriable=retriable) from exc

    async def _begin(self, records: Sequence[KeyValue], deadline: float) -> None:
        """AddPartitionsToTxn and Produce: the transaction is open and holds ``records``
        (stamped with the time it began, no headers)."""
        await self._add_partition(deadline)
        now_ms = int(time.time() * 1000)
        stamped = [Record(key, value, now_ms) for key, value in records]
        for run in split(stamped, self._config.max_batch_bytes):
            await self._produce(run, deadline)

    async def _recover(self, deadline: float, what: str) -> None:
        """Abort whatever transaction is open and start a new epoch (KIP-360)."""
        self._recover_first = True
        try:
            producer_id, epoch, coordinator = await init_producer_id(
                self._cluster, self.transactional_id,
                transaction_timeout_ms=self._config.transaction_timeout_ms, deadline=deadline,
                key=self.group_id, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch)
        except Fenced as exc:
            self._fenced = exc
            raise
        log.info("group %s: aborted %s; producer %d epoch %d", self.group_id, what,
                 producer_id, epoch)
        self.producer_id, self.producer_epoch = producer_id, epoch
        self._coordinator = coordinator
        self._sequence = 0
        self._recover_first = False

    async def _coordinator_request(self, api_key: int, version: int, value: dict[str, Any],
                                   deadline: float, what: str,
                                   error_of: Callable[[dict[str, Any]], int]) -> None:
        backoff = Backoff(deadline, f"{what} for {self.transactional_id}")
        while True:
            if self._coordinator is None:
                self._coordinator = await self._cluster.transaction_coordinator(
                    self.transactional_id, deadline)
            try:
                response = await self._cluster.link(self._coordinator, self.group_id).request(
                    api_key, version, value, timeout=_remaining(deadline))
            except UpstreamError as exc:
                self._coordinator = None
                await backoff.wait(str(exc))
                continue
            error = error_of(response)
            if error == ErrorCode.NONE:
                return
            if error in FENCING:
                raise Fenced(f"{self.transactional_id}: {what}: {error_name(error)}")
            if error in COORDINATOR_MOVED:
                self._coordinator = None
            elif error not in COORDINATOR_RETRY:
                raise Refused(what, error)
            await backoff.wait(error_name(error))

    async def _add_partition(self, deadline: float) -> None:
        await self._coordinator_request(
            ApiKey.ADD_PARTITIONS_TO_TXN, ADD_PARTITIONS_VERSION, {
                "v3_and_below_transactional_id": self.transactional_id,
                "v3_and_below_producer_id": self.producer_id,
                "v3_and_below_producer_epoch": self.producer_epoch,
                "v3_and_below_topics": [{"name": self._config.topic,
                                         "partitions": [self.partition]}]},
            deadline, "AddPartitionsToTxn", _partition_error)

    async def _end(self, commit: bool, deadline: float) -> None:
        await self._coordinator_request(
            ApiKey.END_TXN, END_TXN_VERSION, {
                "transactional_id": self.transactional_id, "producer_id": self.producer_id,
                "producer_epoch": self.producer_epoch, "committed": commit},
            deadline, "EndTxn(commit)" if commit else "EndTxn(abort)",
            lambda r: r["error_code"])

    async def _produce(self, records: Sequence[Record], deadline: float) -> None:
        topic = self._config.topic
        batch = encode_batch(records, transactional=True, producer_id=self.producer_id,
                             producer_epoch=self.producer_epoch, base_sequence=self._sequence)
        backoff = Backoff(deadline, f"Produce to {topic}-{self.partition}")
        while True:
            leader = await self._cluster.leader(topic, self.partition, deadline)
            remaining = _remaining(deadline)
            try:
                response = await self._cluster.link(leader, self.group_id).request(
                    ApiKey.PRODUCE, PRODUCE_VERSION, produce_request(
                        topic, {self.partition: batch}, acks=-1,
                        timeout_ms=int(remaining * 1000),
                        transactional_id=self.transactional_id),
                    timeout=remaining)
            except UpstreamError as exc:
                self._cluster.forget_leader(topic, self.partition)
                await backoff.wait(str(exc))
                continue
            result = partition_results(response, topic).get(self.partition, NOT_ANSWERED)
            error = result["error_code"]
            if error in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                self._sequence = (self._sequence + len(records)) % SEQUENCE_MODULUS
                return
            if error in FENCING:
                raise Fenced(f"{self.transactional_id}: Produce: {error_name(error)}")
            if error in LEADER_MOVED:
                self._cluster.forget_leader(topic, self.partition)
            elif error not in PRODUCE_RETRY:
                raise Refused("Produce", error, result.get("error_message"))
            await backoff.wait(error_name(error))


def _partition_error(response: dict[str, Any]) -> int:
    """The first error of an AddPartitionsToTxn response (v3 and below), else NONE."""
    for topic in response["results_by_topic_v3_and_below"]:
        for partition in topic["results_by_partition"]:
            if partition["partition_error_code"] != ErrorCode.NONE:
                return int(partition["partition_error_code"])
    return ErrorCode.NONE


def _again(error: StateLogError) -> StateLogError:
    """A fresh exception like ``error`` for each waiter of a shared transaction."""
    if isinstance(error, WriteFailed):
        return WriteFailed(str(error), committed=error.committed, retriable=error.retriable)
    return type(error)(str(error)) if type(error) in (Fenced, StateLogError,
                                                       Unavailable) else error


async def open_writer(cluster: StateCluster, config: WriterConfig, partitions: int,
                      group_id: str) -> Writer:
    """The group's writer, fencing every earlier one (see the module doc)."""
    txn_id = transactional_id(config.transactional_id_prefix, group_id)
    deadline = trio.current_time() + config.open_timeout
    producer_id, epoch, coordinator = await init_producer_id(
        cluster, txn_id, transaction_timeout_ms=config.transaction_timeout_ms,
        deadline=deadline, key=group_id)
    log.info("group %s: state writer %s open: producer %d epoch %d", group_id, txn_id,
             producer_id, epoch)
    return Writer(cluster, config, group_id, txn_id, partition_for(group_id, partitions),
                  producer_id, epoch, coordinator)
