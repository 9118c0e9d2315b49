"""Request builders and a small driver for the classic-protocol engine tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from translation.classic.coordinator import ClassicGroupCoordinator
from translation.classic.messages import (
    ClassicProtocol,
    ClassicSubscription,
    HeartbeatRequest,
    HeldRequest,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeavingMember,
    SyncGroupRequest,
    SyncGroupResponse,
)
from translation.coordinator import GroupCoordinator
from translation.effects import Effect, JoinCompleted, SyncCompleted
from translation.errors import ErrorCode

from ..helpers import make_engine

G = "grp"
E = ErrorCode


def subscription(
    topics: Sequence[str] = ("foo",),
    owned: Mapping[str, Iterable[int]] | None = None,
    *,
    version: int = 3,
    rack: str | None = None,
    user_data: bytes | None = None,
) -> ClassicSubscription:
    return ClassicSubscription(
        version=version,
        topics=tuple(topics),
        user_data=user_data,
        owned_partitions=tuple((t, sorted(ps)) for t, ps in (owned or {}).items()),
        rack_id=rack,
    )


def join_req(
    member_id: str = "",
    topics: Sequence[str] = ("foo",),
    owned: Mapping[str, Iterable[int]] | None = None,
    *,
    protocols: Sequence[str] = ("range",),
    protocol_type: str = "consumer",
    instance_id: str | None = None,
    version: int = 9,
    session_timeout_ms: int = 10_000,
    rebalance_timeout_ms: int = 30_000,
    sub_version: int = 3,
    group_id: str = G,
) -> JoinGroupRequest:
    sub = subscription(topics, owned, version=sub_version)
    return JoinGroupRequest(
        group_id=group_id,
        member_id=member_id,
        protocol_type=protocol_type,
        protocols=[ClassicProtocol(name, sub) for name in protocols],
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        group_instance_id=instance_id,
        api_version=version,
    )


@dataclass
class Classic:
    """An engine plus its classic coordinator, with the effects of every call collected."""

    engine: GroupCoordinator
    classic: ClassicGroupCoordinator
    effects: list[Effect] = field(default_factory=list)

    @staticmethod
    def of(topics, *assignors: object, **config: object) -> Classic:  # type: ignore[no-untyped-def]
        engine = make_engine(topics, *assignors, **config)
        return Classic(engine, ClassicGroupCoordinator(engine))

    def join(self, request: JoinGroupRequest, now: int = 0) -> JoinGroupResponse | HeldRequest:
        response, effects = self.classic.join_group(request, now)
        self.effects.extend(effects)
        return response

    def joined(self, request: JoinGroupRequest, now: int = 0) -> JoinGroupResponse:
        response = self.join(request, now)
        assert isinstance(response, JoinGroupResponse), "join unexpectedly held"
        assert response.error_code == 0, ErrorCode(response.error_code).name
        return response

    def sync(
        self,
        member_id: str,
        generation: int,
        now: int = 0,
        *,
        instance_id: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncGroupResponse | HeldRequest:
        response, effects = self.classic.sync_group(
            SyncGroupRequest(
                G,
                member_id,
                generation,
                group_instance_id=instance_id,
                protocol_type="consumer" if protocol_name else None,
                protocol_name=protocol_name,
            ),
            now,
        )
        self.effects.extend(effects)
        return response

    def beat(
        self, member_id: str, generation: int, now: int = 0, *, instance_id: str | None = None
    ) -> ErrorCode:
        response, effects = self.classic.heartbeat(
            HeartbeatRequest(G, member_id, generation, instance_id), now
        )
        self.effects.extend(effects)
        return ErrorCode(response.error_code)

    def leave(self, *members: LeavingMember, now: int = 0, version: int = 5):  # type: ignore[no-untyped-def]
        response, effects = self.classic.leave_group(LeaveGroupRequest(G, members, version), now)
        self.effects.extend(effects)
        return response

    def tick(self, now: int) -> list[Effect]:
        effects = self.engine.tick(now)
        self.effects.extend(effects)
        return effects

    def completed(self) -> dict[str, JoinGroupResponse]:
        return {e.member_id: e.response for e in self.effects if isinstance(e, JoinCompleted)}

    def synced(self) -> dict[str, SyncGroupResponse]:
        """Held SyncGroups answered so far (by member)."""
        return {e.member_id: e.response for e in self.effects if isinstance(e, SyncCompleted)}


def names(response: SyncGroupResponse | HeldRequest) -> dict[str, list[int]]:
    assert isinstance(response, SyncGroupResponse), "SyncGroup unexpectedly held"
    assert response.assignment is not None, ErrorCode(response.error_code).name
    return {t: sorted(ps) for t, ps in response.assignment.partitions}
