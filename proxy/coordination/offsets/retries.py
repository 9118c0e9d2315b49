"""The stale-retry guard, a stage of the client-facing list: a retried commit a newer one overtook
is acknowledged, not written (:mod:`proxy.coordination.commit_retries` says when).

It sees OffsetCommit after the fleet route. The engine first: where this sidecar's engine decides
the commit (its groups are decided here), a commit the engine refuses gets its error, never an
acknowledgement, so only a commit it validated is guarded; where another decides it (relayed,
refused here, or passed to the broker) only retries under the epoch of the newer commit count.
The partitions taken out are added to the answer, with the error of the rest when the
coordinator refused the member. Every answer the client gets to a commit on this connection
is noted on its way out (what it was told is what a retry may overtake), and the members that
committed here count as disrupted when the connection closes (their commits on their way are
retried by the client).

Bounded: :data:`MAX_COMMITTERS_PER_CONNECTION` members per connection.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from proxy import metrics
from proxy.codec.api_keys import ApiKey
from proxy.connection import Decision, Local
from proxy.coordination import commit_retries
from proxy.coordination.handler import GroupRequest, Value
from proxy.coordination.offsets.answers import topic_key
from proxy.coordination.offsets.handlers import OffsetCommitHandler
from proxy.coordination.peers import LOCAL
from proxy.coordination.stages.stage import Passage, Stage
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.coordination.commit_retries import CommitRetries

log = logging.getLogger("groupgate.coordination")

MAX_COMMITTERS_PER_CONNECTION = 64
"""Group members one connection's commits are remembered for (a client commits as one)."""
REFUSALS = frozenset(int(e) for e in (
    ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.STALE_MEMBER_EPOCH, ErrorCode.FENCED_MEMBER_EPOCH,
    ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID,
    ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.GROUP_AUTHORIZATION_FAILED))
"""Commit errors that refuse the member (or its epoch) rather than one partition."""


class StaleRetries(Stage):
    """One connection's guard against commit retries that newer commits overtook."""

    __slots__ = ("_acknowledged", "_committers", "_retries")

    apis = frozenset({ApiKey.OFFSET_COMMIT})

    def __init__(self, retries: CommitRetries) -> None:
        self._retries = retries
        self._committers: set[tuple[str, str]] = set()
        """Group members that committed on this connection: disrupted when it closes."""
        self._acknowledged: dict[int, list[Value]] = {}
        """By correlation id: partitions of a commit acknowledged as stale retries, added to
        its answer."""

    def request(self, passage: Passage) -> Decision | None:
        handler = passage.handler
        if not isinstance(handler, OffsetCommitHandler):
            return None
        route = passage.route
        verdict = (handler.verdict(passage.request)
                   if route is None or route.kind == LOCAL else None)
        if verdict in (None, ErrorCode.NONE):
            passage.request = self._without_stale_retries(passage.request, verdict is None)
        request = passage.request
        if not request.value["topics"]:
            return Local(passage.chain.encode(handler, request,
                                              {"throttle_time_ms": 0, "topics": []}))
        return None

    def _without_stale_retries(self, request: GroupRequest, unvalidated: bool) -> GroupRequest:
        """``request`` without the partitions that retry a commit a newer one of the same
        member overtook; they are acknowledged in its answer. ``unvalidated``: no engine here
        validated it (it is decided elsewhere): only retries under the epoch of that newer
        commit count, and they share the error of the rest."""
        value = request.value
        epoch = value.get("generation_id_or_member_epoch", -1) if unvalidated else None
        retries = self._retries
        group_id, member_id = value["group_id"], value.get("member_id") or ""
        if not member_id:
            return request
        if len(self._committers) < MAX_COMMITTERS_PER_CONNECTION:
            self._committers.add((group_id, member_id))
        kept: list[Value] = []
        acknowledged: list[Value] = []
        for topic in value["topics"]:
            key = commit_retries.topic_key(topic)
            fresh = [p for p in topic["partitions"] if not retries.stale(
                group_id, member_id, (key, p["partition_index"]), p["committed_offset"],
                epoch)]
            stale = [p for p in topic["partitions"] if p not in fresh]
            if fresh:
                kept.append(dict(topic, partitions=fresh))
            if stale:
                acknowledged.append(dict(topic_key(topic), partitions=[
                    {"partition_index": p["partition_index"], "error_code": 0} for p in stale]))
        if not acknowledged:
            return request
        count = sum(len(t["partitions"]) for t in acknowledged)
        retries.acknowledged += count
        metrics.STALE_COMMIT_RETRIES.inc(count)
        log.debug("group %s member %s: %d partition(s) of a retried commit acknowledged without "
                  "being written: a newer commit of the member stands", group_id, member_id,
                  count)
        self._acknowledged[request.correlation_id] = acknowledged
        return dataclasses.replace(request, value=dict(value, topics=kept))

    def answer(self, request: GroupRequest, value: Value) -> Value:
        """Note what the client is told of its commit; add the partitions acknowledged as
        stale retries."""
        try:
            self._retries.observe(request.value["group_id"], request.value.get("member_id") or "",
                                  request.value, value)
        except (KeyError, TypeError):  # an answer without per-partition errors
            log.debug("commit answer without partitions: %r", value)
        acknowledged = self._acknowledged.pop(request.correlation_id, None)
        if acknowledged:
            refused = refusal(value)
            if refused:  # the coordinator refused the member: so are its stale partitions
                acknowledged = [dict(t, partitions=[dict(p, error_code=refused)
                                                    for p in t["partitions"]])
                                for t in acknowledged]
            value = dict(value, topics=[*value.get("topics", ()), *acknowledged])
        return value

    def closed(self) -> None:
        """The client's connection closed: its commits still on their way are retried by the
        client."""
        for group_id, member_id in self._committers:
            self._retries.disrupted(group_id, member_id)
        self._committers.clear()


def refusal(value: Value) -> int:
    """The member-refusing error a commit answer carries (0: none)."""
    for topic in value.get("topics", ()):
        for partition in topic.get("partitions", ()):
            if partition.get("error_code") in REFUSALS:
                return int(partition["error_code"])
    return 0
