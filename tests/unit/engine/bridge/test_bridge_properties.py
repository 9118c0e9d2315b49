"""Random runs of a bridged member against a scripted broker and a client that does what it is
told: the client is never shown a partition the broker did not give, never an addition while
it still owns a partition it must revoke, nothing while an eager rebalance releases; and a run
that ends with a quiet broker ends with the client owning the broker's assignment."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from translation.bridge import BridgedMember, BridgeState, BrokerJoinAnswer, ClientHeartbeat
from translation.bridge.messages import LeaderSyncGroupRequest
from translation.classic.messages import (
    ClassicAssignment,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    SyncGroupResponse,
)
from translation.errors import ErrorCode

SESSION = 3_000
PARTITIONS = list(range(6))
ERRORS = [ErrorCode.NONE] * 6 + [ErrorCode.REBALANCE_IN_PROGRESS] * 2 + [
    ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION]

steps = st.lists(st.tuples(
    st.sampled_from(["client"] * 3 + ["broker"] * 5 + ["time"] * 2 + ["names"]),
    st.sampled_from(ERRORS),
    st.frozensets(st.sampled_from(PARTITIONS)),
), max_size=60)


class Run:
    def __init__(self, protocol: str) -> None:
        self.m = BridgedMember(group_id="g", fleet_address="f", member_id="k", client_id="c",
                               subscribed_names=["t"], session_timeout_ms=SESSION,
                               rebalance_timeout_ms=SESSION, current_protocol=protocol)
        self.protocol = protocol
        self.now = 0
        self.owned: frozenset[int] = frozenset()
        self.outstanding: list[object] = []
        self.generation = 0

    def send(self, requests: list[object]) -> None:
        self.outstanding += requests

    def client(self) -> None:
        self.send(list(self.m.client_heartbeat(ClientHeartbeat(
            max(self.m.epoch, 0), {"t": sorted(self.owned)}), self.now)))
        answer = self.m.client_answer()
        if answer is None or answer.assignment is None or answer.error_code:
            return
        shown = answer.assignment.get("t", frozenset())
        broker = self.m.assignment.get("t", frozenset())
        assert shown <= broker
        if self.owned - broker:
            assert shown <= self.owned  # revocations only
        if self.m.state is BridgeState.RELEASING:
            assert not shown
        self.owned = frozenset(shown)  # the client does as it is told

    def broker(self, error: int, parts: frozenset[int]) -> None:
        if not self.outstanding:
            return
        request = self.outstanding.pop(0)
        if isinstance(request, JoinGroupRequest):
            self.generation += 1
            answer = (BrokerJoinAnswer(error_code=error) if error != ErrorCode.NONE else
                      BrokerJoinAnswer(generation_id=self.generation, protocol_name=self.protocol,
                                       leader="x", member_id="b"))
            self.send(list(self.m.on_join_answer(answer, {}, self.now)))
        elif isinstance(request, LeaderSyncGroupRequest):
            sync = (SyncGroupResponse(error_code=error) if error != ErrorCode.NONE else
                    SyncGroupResponse(assignment=ClassicAssignment(3, [("t", sorted(parts))])))
            self.send(list(self.m.on_sync_answer(sync, self.now)))
        elif isinstance(request, HeartbeatRequest):
            self.send(list(self.m.on_heartbeat_answer(HeartbeatResponse(error), self.now)))

    def settle(self) -> None:
        """A quiet broker: every request succeeds, the client heartbeats."""
        for _ in range(30):
            self.client()
            while self.outstanding:
                self.broker(ErrorCode.NONE, frozenset(self.m.assignment.get("t", ())) or
                            frozenset({0, 1}))
            self.now += SESSION // 3
            self.send(list(self.m.poll(self.now)))
            while self.outstanding:
                self.broker(ErrorCode.NONE, frozenset())


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["range", "cooperative-sticky"]), steps)
def test_the_client_is_told_revocations_before_additions(protocol: str, script: list[
        tuple[str, ErrorCode, frozenset[int]]]) -> None:
    run = Run(protocol)
    run.client()
    for kind, error, parts in script:
        if kind == "client":
            run.client()
        elif kind == "broker":
            run.broker(error, parts)
        elif kind == "names":
            run.send(list(run.m.set_subscription(["t", "u"] if "u" not in run.m.subscribed
                                                 else ["t"], run.now)))
        else:
            run.now += SESSION // 3
            run.send(list(run.m.poll(run.now)))
    run.settle()
    assert run.m.state is BridgeState.STABLE
    assert run.owned == run.m.assignment.get("t", frozenset())
    assert run.m.epoch == run.m.generation
