"""The state log's topic: its settings, created with exactly those if missing, checked if not.

:class:`TopicSettings` holds the name, partition count, replication factor and topic configs
(:func:`default_configs` plus overrides). :func:`ensure_topic` creates the topic with
CreateTopics when Metadata does not know it and checks that the broker created it with those
settings (the CreateTopics response lists the topic's configs); when the topic exists already
it compares its partition count, replication factor and configs (DescribeConfigs) with the
settings and logs one line naming every difference. A topic that is not compacted is an error
(:class:`StateTopicError`): time-based deletion would drop the state of quiet groups.

Defaults, for a small keyed log that is read whole on every takeover:

* ``cleanup.policy=compact``: one live record per key; tombstones remove keys.
* ``min.insync.replicas``: replication factor - 1, at least 1, at most 2 (3 replicas: a write
  survives one broker down and one more failing), as Kafka's own ``__transaction_state``.
* ``unclean.leader.election.enable=false``: never lose acknowledged writes to an out-of-sync
  leader, whatever the broker's default.
* ``segment.bytes`` 8 MiB and ``segment.ms`` 1 h: only closed segments are compacted, and a
  loader reads the active segment whole, so it is kept small (a full 8 MiB segment of 200-byte
  records loads in well under a second, see decision record 0013); the default 1 GiB would
  never close on a state log.
* ``min.cleanable.dirty.ratio=0.25``: the log is compacted once a quarter of it is overwritten
  records (Kafka's 0.5 lets it double), so a load reads at most about 1.33 times the live
  records plus one segment.
* ``delete.retention.ms`` 1 h: a tombstone is needed only until every loader that started
  before the compaction has finished (seconds); an hour keeps deleted groups' tombstones from
  lingering for Kafka's default day.
* ``compression.type=producer``: batches stay as written (uncompressed), whatever the
  broker's default.
* ``max.message.bytes`` 1048588 (Kafka's default, made explicit): the writer cuts its batches
  below it, and a member whose record would not fit a batch of its own is refused before it
  joins (:attr:`TopicState.max_message_bytes` is what the topic really has, which decides;
  :func:`translation.limits.check_member_record`).
* ``message.timestamp.type=CreateTime``: record times are the writer's wall clock.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import trio

from proxy.codec.api_keys import ApiKey
from proxy.kafka_client.create_topic import (
    CREATE_TOPICS_VERSION,
    create_topic_error,
    create_topic_request,
)
from proxy.state_log.cluster import Backoff, StateCluster, error_name
from proxy.state_log.errors import StateTopicError
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

log = logging.getLogger("groupgate.state_log")

DESCRIBE_CONFIGS_VERSION = 4
TOPIC_RESOURCE = 2

DEFAULT_TOPIC = "_groupgate-group-state"
DEFAULT_PARTITIONS = 16
DEFAULT_REPLICATION_FACTOR = 3
MAX_MESSAGE_BYTES = 1048588

CREATE_RETRIABLE = frozenset({ErrorCode.NOT_CONTROLLER, ErrorCode.REQUEST_TIMED_OUT,
                              ErrorCode.THROTTLING_QUOTA_EXCEEDED})


def min_insync_replicas(replication_factor: int) -> int:
    return max(1, min(replication_factor - 1, 2))


def default_configs(replication_factor: int) -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "min.insync.replicas": str(min_insync_replicas(replication_factor)),
        "unclean.leader.election.enable": "false",
        "segment.bytes": str(8 * 1024 * 1024),
        "segment.ms": str(3_600_000),
        "min.cleanable.dirty.ratio": "0.25",
        "delete.retention.ms": str(3_600_000),
        "compression.type": "producer",
        "max.message.bytes": str(MAX_MESSAGE_BYTES),
        "message.timestamp.type": "CreateTime",
    }


@dataclass(frozen=True)
class TopicSettings:
    name: str = DEFAULT_TOPIC
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = DEFAULT_REPLICATION_FACTOR
    overrides: Mapping[str, str] = field(default_factory=dict)
    """Topic configs that replace or add to :func:`default_configs`."""

    def __post_init__(self) -> None:
        if self.partitions < 1 or self.replication_factor < 1:
            raise ValueError("the state log needs at least one partition and one replica")

    @property
    def configs(self) -> dict[str, str]:
        return {**default_configs(self.replication_factor), **self.overrides}


@dataclass(frozen=True, slots=True)
class TopicState:
    partitions: int
    """The partition count groups are hashed over: the topic's, as the cluster reports it."""
    created: bool
    differences: tuple[str, ...]
    """``name=actual (configured value)`` for every setting the topic does not have."""
    max_message_bytes: int
    """The topic's ``max.message.bytes`` as the broker reports it (its own default when the
    topic sets none): the largest record batch it takes."""


def _check_policy(name: str, policy: str | None) -> None:
    policies = {p.strip() for p in (policy or "").split(",")}
    if "compact" not in policies:
        raise StateTopicError(
            f"state log topic {name} has cleanup.policy={policy}: it must be compacted "
            "(cleanup.policy=compact), or the state of quiet groups is deleted")
    if "delete" in policies:
        log.warning("state log topic %s has cleanup.policy=%s: records older than its "
                    "retention.ms are deleted, state included", name, policy)


async def ensure_topic(cluster: StateCluster, settings: TopicSettings, timeout: float
                       ) -> TopicState:
    """Create the topic if missing, else check it; return what groups are hashed over."""
    deadline = trio.current_time() + timeout
    backoff = Backoff(deadline, f"state log topic {settings.name}")
    created = asked = False
    while True:
        try:
            info = await cluster.topic(settings.name)
        except UpstreamError as exc:
            await backoff.wait(str(exc))
            continue
        if info.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and not asked:
            created = await _create(cluster, settings, deadline)
            asked = True
            continue
        if info.error_code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                               ErrorCode.LEADER_NOT_AVAILABLE) or (
                info.error_code == ErrorCode.NONE and min(info.leaders.values(),
                                                          default=-1) < 0):
            await backoff.wait(f"{error_name(info.error_code)} (partitions without leaders)")
            continue
        if info.error_code != ErrorCode.NONE:
            raise StateTopicError(f"state log topic {settings.name}: "
                                  f"{error_name(info.error_code)}")
        break
    differences: list[str] = []
    if info.partitions != settings.partitions:
        differences.append(f"partitions={info.partitions} ({settings.partitions})")
    if info.replication_factor != settings.replication_factor:
        differences.append(f"replication.factor={info.replication_factor} "
                           f"({settings.replication_factor})")
    actual = await _describe(cluster, settings, deadline)
    _check_policy(settings.name, actual.get("cleanup.policy"))
    for key, wanted in settings.configs.items():
        if actual.get(key) != wanted:
            differences.append(f"{key}={actual.get(key)} ({wanted})")
    if differences:
        if created:
            raise StateTopicError(f"state log topic {settings.name} was created with other "
                                  f"settings than asked for: {', '.join(differences)}")
        log.warning("state log topic %s exists with settings other than configured "
                    "(configured in parentheses): %s; groups are hashed over its %d "
                    "partitions", settings.name, ", ".join(differences), info.partitions)
    elif created:
        log.info("state log topic %s created: %d partitions, replication factor %d, %s",
                 settings.name, info.partitions, info.replication_factor,
                 ", ".join(f"{k}={v}" for k, v in sorted(settings.configs.items())))
    return TopicState(info.partitions, created, tuple(differences),
                      _max_message_bytes(settings, actual.get("max.message.bytes")))


def _max_message_bytes(settings: TopicSettings, actual: str | None) -> int:
    """The topic's ``max.message.bytes`` (the configured one when the broker did not say)."""
    for value in (actual, settings.configs.get("max.message.bytes")):
        if value is not None and value.strip().isdigit():
            return int(value)
    return MAX_MESSAGE_BYTES


async def _create(cluster: StateCluster, settings: TopicSettings, deadline: float) -> bool:
    """CreateTopics; True once created here, False if another sidecar was first."""
    backoff = Backoff(deadline, f"creating state log topic {settings.name}")
    while True:
        timeout_ms = max(1000, int((deadline - trio.current_time()) * 1000))
        try:
            response = await cluster.any_broker(
                ApiKey.CREATE_TOPICS, CREATE_TOPICS_VERSION, create_topic_request(
                    settings.name, partitions=settings.partitions,
                    replication_factor=settings.replication_factor, configs=settings.configs,
                    timeout_ms=timeout_ms),
                timeout=timeout_ms / 1000 + cluster.request_timeout)
        except UpstreamError as exc:
            await backoff.wait(str(exc))
            continue
        error, message = create_topic_error(response)
        if error == ErrorCode.TOPIC_ALREADY_EXISTS:
            return False
        if error in CREATE_RETRIABLE:
            await backoff.wait(error_name(error))
            continue
        if error != ErrorCode.NONE:
            raise StateTopicError(
                f"cannot create state log topic {settings.name} ({settings.partitions} "
                f"partitions, replication factor {settings.replication_factor}): "
                f"{error_name(error)}: {message}")
        return True


async def _describe(cluster: StateCluster, settings: TopicSettings, deadline: float
                    ) -> dict[str, str | None]:
    keys = sorted(settings.configs)
    backoff = Backoff(deadline, f"configs of state log topic {settings.name}")
    while True:
        try:
            response = await cluster.any_broker(
                ApiKey.DESCRIBE_CONFIGS, DESCRIBE_CONFIGS_VERSION, {
                    "resources": [{"resource_type": TOPIC_RESOURCE,
                                   "resource_name": settings.name,
                                   "configuration_keys": keys}],
                    "include_synonyms": False, "include_documentation": False})
        except UpstreamError as exc:
            await backoff.wait(str(exc))
            continue
        (result,) = response["results"]
        error = result["error_code"]
        if error == ErrorCode.NONE:
            return {c["name"]: c["value"] for c in result["configs"]}
        if error in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.REQUEST_TIMED_OUT):
            await backoff.wait(error_name(error))
            continue
        raise StateTopicError(f"DescribeConfigs of state log topic {settings.name}: "
                              f"{error_name(error)}: {result.get('error_message') or ''}")
