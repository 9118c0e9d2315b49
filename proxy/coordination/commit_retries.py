"""Stale commit retries: a commit a client re-sends after a failure must not land after a newer
commit of the same member.

librdkafka re-sends an OffsetCommit as the same request when it was answered with an error it
retries (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
REQUEST_TIMED_OUT and a few more) or when its connection broke before the answer came (it closes
a connection itself when a request on it times out). The retry goes out after a backoff, or after
it reconnected, behind the commits the application made since: with asynchronous commits after
every record, the retry of offset 34 reaches the coordinator after the commit of 78 succeeded, and
the group's committed offset moves back to 34; the next owner of the partition reads 44 records
again. Kafka's own coordinator meets the same retries around a failover; a proxy causes more of
them (a sidecar taking a group over, its broker membership rejoining, the broker's coordinator
moving, commits relayed one at a time), so it closes the hazard.

:class:`CommitRetries` is kept by the sidecar the application is connected to, which sees every
answer its client gets and every connection of it that closes. A member is *disrupted* when one
of its commits is answered with an error clients retry, when a connection it committed on
closes, and when this sidecar first sees it (a restarted sidecar knows nothing of what its
clients were sending). For :data:`RETRY_WINDOW_SECONDS` after a disruption, a commit of a
partition at an offset lower than one the member has committed successfully through this sidecar
since the disruption is taken for a retry that lost the race: it is acknowledged without being
written, and the member's newer commit stands. Outside that window, and for any other member's
commits, nothing changes. The one case it misreads: an application that seeks back and commits a
lower offset on purpose within the window after a disruption keeps its higher committed offset.

The guard applies only to a commit the group's coordinator would accept: a commit the engine
refuses (a fenced member, a wrong epoch) gets the engine's error, never an acknowledgement. Where
this sidecar's engine decides the commit, the router asks it first and guards only a commit it
validated. Where another decides it (relayed to the sidecar holding the group, or passed to the
broker's own coordinator), the partitions taken out are never seen there: a retry is then
acknowledged only if it carries the member epoch (or generation) under which the newer commit
was accepted, and a partition's stale retry in a commit whose other partitions are refused gets
their error (a member fenced after that newer commit, retrying only stale partitions, is still
acknowledged; its next heartbeat tells it).

Memory is bounded: at most :data:`MAX_MEMBERS` members, each forgotten :data:`KEEP_SECONDS` after
its last commit (it counts as first seen again afterwards), one offset per partition it commits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from cachetools import TTLCache

from translation.errors import ErrorCode

RETRIED_BY_CLIENTS = frozenset(int(e) for e in (
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR, ErrorCode.REQUEST_TIMED_OUT, ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
"""OffsetCommit errors librdkafka answers by sending the same request again."""

RETRY_WINDOW_SECONDS = 60.0
"""How long after a disruption a client may still send retries: librdkafka's backoffs are a
second at most, and commits waiting for a coordinator wait up to a session timeout."""
KEEP_SECONDS = 600.0
MAX_MEMBERS = 10_000

Partition = tuple[Any, int]
"""A request's topic (its name, or its topic id from v10 on) and partition index."""


def topic_key(topic: dict[str, Any]) -> Any:
    name = topic.get("name")
    return name if name else topic.get("topic_id")


def offsets_of(value: dict[str, Any]) -> Iterable[tuple[Partition, int]]:
    """``((topic, partition), committed offset)`` of an OffsetCommit request's value."""
    for t in value.get("topics", ()):
        key = topic_key(t)
        for p in t.get("partitions", ()):
            yield (key, p["partition_index"]), p["committed_offset"]


class _Member:
    __slots__ = ("committed", "disrupted_at", "epochs")

    def __init__(self, now: float) -> None:
        self.disrupted_at = now
        self.committed: dict[Partition, int] = {}
        """The highest offset committed since the window of the last disruption opened."""
        self.epochs: dict[Partition, int] = {}
        """The member epoch (or generation) that highest commit carried."""


class CommitRetries:
    """What one sidecar's clients were told about their commits (see the module docstring)."""

    def __init__(self, timer: Callable[[], float], *,
                 window_seconds: float = RETRY_WINDOW_SECONDS,
                 keep_seconds: float = KEEP_SECONDS, max_members: int = MAX_MEMBERS) -> None:
        self._timer = timer
        self._window = window_seconds
        self._members: TTLCache[tuple[str, str], _Member] = TTLCache(
            maxsize=max_members, ttl=keep_seconds, timer=timer)
        self.acknowledged = 0
        """Partitions of stale retries acknowledged without being written."""

    def _member(self, group_id: str, member_id: str) -> _Member:
        key = (group_id, member_id)
        member = self._members.get(key)
        if member is None:
            member = _Member(self._timer())  # first seen: disrupted as far as this sidecar knows
        self._members[key] = member  # (re)starts its time to live
        return member

    def knows(self, group_id: str, member_id: str) -> bool:
        """Whether a commit of this member may be acknowledged as a stale retry (it committed
        through this sidecar lately): such a commit is authorized by the proxy first."""
        return bool(member_id) and (group_id, member_id) in self._members

    def stale(self, group_id: str, member_id: str, partition: Partition, offset: int,
              epoch: int | None = None) -> bool:
        """Whether a commit of ``offset`` is a retry that a newer commit has overtaken;
        ``epoch`` (for a commit no engine here validated): only if it carries the epoch that
        newer commit carried."""
        if not member_id:
            return False
        member = self._member(group_id, member_id)
        if self._timer() - member.disrupted_at > self._window:
            return False
        if epoch is not None and member.epochs.get(partition) != epoch:
            return False
        return member.committed.get(partition, -1) > offset

    def disrupted(self, group_id: str, member_id: str) -> None:
        """The member may retry commits from now on (an error it retries, a broken
        connection)."""
        if not member_id:
            return
        member = self._member(group_id, member_id)
        now = self._timer()
        if now - member.disrupted_at > self._window:
            member.committed.clear()  # a new window: only what is committed from now counts
            member.epochs.clear()
        member.disrupted_at = now

    def observe(self, group_id: str, member_id: str, request: dict[str, Any],
                response: dict[str, Any]) -> None:
        """Note what the client is told about the partitions of its commit ``request``."""
        if not member_id:
            return
        asked = dict(offsets_of(request))
        for t in response.get("topics", ()):
            topic = topic_key(t)
            for p in t.get("partitions", ()):
                partition = (topic, p["partition_index"])
                offset = asked.get(partition)
                if offset is None:
                    continue
                error = p["error_code"]
                if error in RETRIED_BY_CLIENTS:
                    self.disrupted(group_id, member_id)
                elif error == 0:
                    member = self._member(group_id, member_id)
                    if (self._timer() - member.disrupted_at <= self._window
                            and offset >= member.committed.get(partition, -1)):
                        member.committed[partition] = offset
                        member.epochs[partition] = request.get(
                            "generation_id_or_member_epoch", -1)
