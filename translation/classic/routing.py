"""Which classic JoinGroups the engine may take, and which the proxy passes to the broker.

:func:`classify_classic_join` is asked by the proxy before it hands a JoinGroup to
:meth:`~translation.classic.coordinator.ClassicGroupCoordinator.join_group`:

* a group the engine already serves (it has members) is always the engine's: the engine
  answers, including INCONSISTENT_GROUP_PROTOCOL for a request it cannot serve (Kafka answers
  a join to a non-empty consumer group the same way);
* otherwise the join goes to the broker when the engine could not serve the group faithfully:
  a protocol type other than ``consumer`` (Kafka Connect's ``connect``, or any other embedded
  protocol); no protocols, or a first protocol whose metadata is not a consumer-protocol
  subscription; a first protocol that is not one of the client assignors known to send no
  assignment userData (``GroupConfig.classic_assignors``: range, roundrobin, sticky,
  cooperative-sticky). The engine's assignment never carries userData, and a custom
  assignor that needs it (Kafka Streams' ``stream``, whose AssignmentInfo lives there) would
  fail. Kafka makes the same call when converting a classic group (``fromClassicGroup``
  refuses an assignment with userData); at JoinGroup time only the name is known, so the
  name decides. Subscription userData is fine (the sticky assignors put their generation and
  previous assignment there; server-side assignors ignore it);
* a join the engine would refuse (a group id, instance id or subscription it does not take,
  no room for another member, a state record too large for the state log,
  :mod:`translation.limits`) goes to the broker, which answers it as it would without the
  proxy: nothing is taken over for it;
* when the broker's own classic group still has members (``broker_group_active``): the group
  must be converted as a whole (:mod:`translation.classic.migration`) or stay with the broker;
* with ``GroupConfig.adopt_classic_groups`` off (Kafka's behaviour) a group nobody serves yet
  stays with the broker: a classic JoinGroup creates a classic group there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from translation import limits
from translation.coordinator import GroupCoordinator
from translation.errors import GroupError
from translation.member import ConsumerGroupMember, MemberProtocol

from .coordinator import classic_member_value
from .messages import CONSUMER_PROTOCOL_TYPE, JoinGroupRequest


class JoinRoute(enum.Enum):
    ENGINE = "engine"
    BROKER = "broker"


@dataclass(frozen=True, slots=True)
class JoinRouting:
    route: JoinRoute
    reason: str

    @property
    def to_engine(self) -> bool:
        return self.route is JoinRoute.ENGINE


def classify_classic_join(
    engine: GroupCoordinator,
    request: JoinGroupRequest,
    *,
    broker_group_active: bool = False,
) -> JoinRouting:
    """Whether ``request`` is for the engine or must be forwarded to the broker."""
    group = engine.groups.get(request.group_id)
    if group is not None and group.members:
        return JoinRouting(JoinRoute.ENGINE, "the engine serves this group")
    if request.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return JoinRouting(
            JoinRoute.BROKER, f"protocol type {request.protocol_type!r} is not 'consumer'"
        )
    if not request.protocols:
        return JoinRouting(JoinRoute.BROKER, "no protocols")
    first = request.protocols[0]
    if first.subscription is None:
        return JoinRouting(
            JoinRoute.BROKER, f"protocol {first.name!r} is not a consumer-protocol subscription"
        )
    config = engine.config
    if first.name not in config.classic_assignors:
        return JoinRouting(
            JoinRoute.BROKER,
            f"assignor {first.name!r} may need assignment userData the engine cannot produce",
        )
    if broker_group_active:
        return JoinRouting(JoinRoute.BROKER, "the broker's classic group has members")
    session = request.session_timeout_ms
    if not (config.classic_min_session_timeout_ms <= session
            <= config.classic_max_session_timeout_ms):
        return JoinRouting(JoinRoute.BROKER, f"session timeout {session} ms is out of range")
    try:  # what the engine would refuse is the broker's to answer: nothing is taken over
        limits.check_group_id(request.group_id)
        limits.check_instance_id(request.group_instance_id)
        limits.check_subscription(first.subscription.topics, None,
                                  max_topics=config.max_subscription_topics,
                                  max_regex_bytes=config.max_regex_bytes)
        if engine.is_new_member(request.group_id, request.member_id, request.group_instance_id):
            engine.check_room_for_a_member()
        if config.max_state_record_bytes is not None:
            # sized with the member id the request carries (the engine re-checks with the
            # one it gives a member joining without)
            joining = ConsumerGroupMember(request.member_id, instance_id=request.group_instance_id,
                                          protocol=MemberProtocol.CLASSIC)
            limits.check_member_record(
                config, request.group_id, request.member_id,
                classic_member_value(joining, request, first.subscription),
                api="join-group", effects=[])
    except GroupError as exc:
        return JoinRouting(JoinRoute.BROKER, exc.message)
    if not config.adopt_classic_groups:
        return JoinRouting(JoinRoute.BROKER, "classic-only groups stay with the broker")
    return JoinRouting(JoinRoute.ENGINE, "a consumer-protocol group the engine can serve")
