"""Loading a group's state: its partition of the state log, read committed, to its end.

:func:`load_group` is what a sidecar taking a group over runs after it opened the group's
writer (:func:`~proxy.state_log.writer.open_writer`), whose InitProducerId has
aborted the fenced writer's open transaction and written the abort markers:

1. ListOffsets (read_uncommitted) for the partition's log start and its high watermark
   *after* that InitProducerId: every record of the group is below it, committed or aborted,
   since no earlier writer can add one and the new writer has not written yet.
2. Fetch at ``read_committed`` from the log start, ``fetch_max_bytes`` at a time, until the
   position reaches that end: data batches of aborted transactions (the response's
   ``aborted_transactions``) and control batches are skipped
   (:func:`proxy.records.read_committed`); records of other groups
   (``group_of(key) != group_id``) are skipped; the latest value of each key wins, and a
   tombstone removes its key.

A read_committed Fetch stops at the last stable offset (LSO), the first offset of the oldest
transaction still open on the partition. The partition holds many groups, so another group's
writer may hold a transaction open below this group's last committed records; reading only to
the LSO seen at the start would miss them. So the load goes on to the high watermark and, when
the position meets the LSO before that, waits (Fetch's ``max_wait_ms``) until the other
transaction ends: it commits within a write, or its coordinator aborts it after its
``transaction_timeout_ms`` (plus up to the broker's
``transaction.abort.timed.out.transaction.cleanup.interval.ms``) if its writer died, or a new
writer of that group aborts it at once. ``LoadedGroup.waited`` tells when that happened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from proxy.codec.api_keys import ApiKey
from proxy.records import RecordsError, read_committed
from proxy.state_log.cluster import Backoff, StateCluster, error_name
from proxy.state_log.errors import LoadFailed
from proxy.state_log.ids import partition_for
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.state_log")

LIST_OFFSETS_VERSION = 6
FETCH_VERSION = 12
EARLIEST = -2
LATEST = -1
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
LEADER_MOVED = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE,
                          ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.FENCED_LEADER_EPOCH,
                          ErrorCode.UNKNOWN_LEADER_EPOCH, ErrorCode.KAFKA_STORAGE_ERROR,
                          ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NETWORK_EXCEPTION})

GroupOf = Callable[[bytes], str]
"""The group id a state record's key belongs to (ValueError: not a key it can read)."""


@dataclass(frozen=True, slots=True)
class LoadedGroup:
    group_id: str
    records: list[tuple[bytes, bytes]]
    """The latest value of every live key of the group, in the order of those last writes."""
    partition: int
    start_offset: int
    end_offset: int
    """The partition's high watermark when the load began: everything below it was read."""
    records_read: int
    """Committed records of the partition read (every group's)."""
    bytes_read: int
    fetches: int
    waited: bool
    """Another transaction held the last stable offset below the end for a while."""
    unreadable: int
    """Records whose key ``group_of`` could not read (skipped)."""
    offsets: dict[bytes, int] = field(default_factory=dict)
    """The offset of each live key's record (for log lines about a record)."""
    group_records: int = 0
    """Records of the group read, tombstones included (some but no live key: the group was
    written to this log and deleted)."""


@dataclass(frozen=True, slots=True)
class LoadConfig:
    topic: str
    fetch_max_bytes: int
    fetch_wait_ms: int
    load_timeout: float


async def _list_offset(cluster: StateCluster, config: LoadConfig, partition: int,
                       timestamp: int, isolation: int, deadline: float, key: str) -> int:
    backoff = Backoff(deadline, f"ListOffsets of {config.topic}-{partition}")
    while True:
        leader = await cluster.leader(config.topic, partition, deadline)
        try:
            response = await cluster.link(leader, key).request(
                ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, {
                    "replica_id": -1, "isolation_level": isolation,
                    "topics": [{"name": config.topic, "partitions": [{
                        "partition_index": partition, "current_leader_epoch": -1,
                        "timestamp": timestamp}]}]},
                timeout=max(0.001, deadline - trio.current_time()))
        except UpstreamError as exc:
            cluster.forget_leader(config.topic, partition)
            await backoff.wait(str(exc))
            continue
        (result,) = [p for t in response["topics"] for p in t["partitions"]]
        error = result["error_code"]
        if error == ErrorCode.NONE:
            return int(result["offset"])
        if error not in LEADER_MOVED:
            raise LoadFailed(f"ListOffsets of {config.topic}-{partition}: {error_name(error)}")
        cluster.forget_leader(config.topic, partition)
        await backoff.wait(error_name(error))


def _fetch_request(config: LoadConfig, partition: int, position: int) -> dict[str, Any]:
    return {
        "replica_id": -1, "max_wait_ms": config.fetch_wait_ms, "min_bytes": 1,
        "max_bytes": config.fetch_max_bytes, "isolation_level": READ_COMMITTED,
        "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": config.topic, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": position,
            "last_fetched_epoch": -1, "log_start_offset": -1,
            "partition_max_bytes": config.fetch_max_bytes}]}],
        "forgotten_topics_data": [], "rack_id": ""}


async def load_group(cluster: StateCluster, config: LoadConfig, partitions: int,
                     group_id: str, group_of: GroupOf) -> LoadedGroup:
    """The group's live records (see the module doc); LoadFailed or Unavailable if the
    partition cannot be read to its end within ``load_timeout``."""
    deadline = trio.current_time() + config.load_timeout
    partition = partition_for(group_id, partitions)
    topic = config.topic
    start = await _list_offset(cluster, config, partition, EARLIEST, READ_UNCOMMITTED,
                               deadline, group_id)
    end = await _list_offset(cluster, config, partition, LATEST, READ_UNCOMMITTED, deadline,
                             group_id)
    state: dict[bytes, bytes] = {}
    offsets: dict[bytes, int] = {}
    group_records = 0
    position = start
    read = nbytes = fetches = unreadable = 0
    waited = False
    behind = ""
    """Why the position stopped short of the end, once it did (for the timeout's message)."""
    backoff = Backoff(deadline, f"reading {topic}-{partition} to offset {end}")
    while position < end:
        leader = await cluster.leader(topic, partition, deadline)
        try:
            response = await cluster.link(leader, group_id).request(
                ApiKey.FETCH, FETCH_VERSION, _fetch_request(config, partition, position),
                timeout=max(0.001, deadline - trio.current_time()))
        except UpstreamError as exc:
            cluster.forget_leader(topic, partition)
            await backoff.wait(f"{exc}{behind}")
            continue
        fetches += 1
        error = response["error_code"]
        (data,) = ([p for t in response["responses"] for p in t["partitions"]]
                   if error == ErrorCode.NONE else [{"error_code": error}])
        error = data["error_code"]
        if error == ErrorCode.OFFSET_OUT_OF_RANGE and position < data.get("log_start_offset",
                                                                            -1):
            position = data["log_start_offset"]  # records were deleted below it
            continue
        if error in LEADER_MOVED:
            cluster.forget_leader(topic, partition)
            await backoff.wait(error_name(error))
            continue
        if error != ErrorCode.NONE:
            raise LoadFailed(f"Fetch of {topic}-{partition} at {position}: "
                             f"{error_name(error)}")
        blob = data["records"] or b""
        nbytes += len(blob)
        aborted = [(a["producer_id"], a["first_offset"])
                   for a in data["aborted_transactions"] or ()]
        try:
            result = read_committed(blob, aborted)
        except RecordsError as exc:
            raise LoadFailed(f"{topic}-{partition} at {position}: {exc}") from exc
        for offset, key, value in result.records:
            if offset < position or offset >= end or key is None:
                continue
            read += 1
            try:
                owner = group_of(key)
            except ValueError:
                unreadable += 1
                continue
            if owner != group_id:
                continue
            group_records += 1
            state.pop(key, None)
            offsets.pop(key, None)
            if value is not None:
                state[key] = value
                offsets[key] = offset
        if result.next_offset is not None and result.next_offset > position:
            position = result.next_offset
            continue
        if blob:
            raise LoadFailed(f"{topic}-{partition} at {position}: {len(blob)} bytes without "
                             "a complete batch")
        # an open transaction below the end holds the last stable offset back
        waited = True
        behind = (f"; last stable offset {data['last_stable_offset']} (a transaction still "
                  "open)")
        await backoff.wait(behind[2:])
    if unreadable:
        log.warning("group %s: %d record(s) of %s-%d with keys that are no state keys were "
                    "skipped", group_id, unreadable, topic, partition)
    return LoadedGroup(group_id, list(state.items()), partition, start, end, read, nbytes,
                       fetches, waited, unreadable, offsets, group_records)
