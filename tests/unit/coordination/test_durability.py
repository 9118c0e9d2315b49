"""Durable group state in the coordinator service, against an in-memory state log: answers
wait for their group's writes, a failed write gives the group up, a new coordinator loads what
the old one wrote and its members go on as if nothing happened, and a stopping proxy leaves its
groups for the next one without disturbing anybody."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing

from proxy import metrics
from proxy.codec.api_keys import ApiKey
from proxy.coordination.fleet import Holder
from proxy.coordination.peers import LOOKUP
from proxy.coordination.service import CoordinatorService
from proxy.records import max_record_bytes
from proxy.state_log.log import WriteFailed
from proxy.state_log.topic import MAX_MESSAGE_BYTES
from tests.unit.coordination.test_fuzz_requests import stub_broker
from translation.records import RecordKind, decode_record, fold

from .helpers import coordinate, exchange, make_service, request, router

NOT_COORDINATOR = 16
COORDINATOR_NOT_AVAILABLE = 15


@dataclass
class Log:
    """The topic: what every writer committed, per group, in order."""

    records: dict[str, list[tuple[bytes, bytes | None]]] = field(default_factory=dict)
    writers: dict[str, int] = field(default_factory=dict)
    """Group -> epoch of its current writer (opening one fences the others)."""
    max_message_bytes: int = MAX_MESSAGE_BYTES
    """The topic's: a write with a record that does not fit a batch of its own fails, as the
    broker refuses it (MESSAGE_TOO_LARGE)."""


class FakeWriter:
    def __init__(self, log: Log, group_id: str) -> None:
        self.log = log
        self.group_id = group_id
        log.writers[group_id] = log.writers.get(group_id, 0) + 1
        self.epoch = log.writers[group_id]
        self.gate: trio.Event | None = None
        """When set to an unset event, writes wait for it."""
        self.fail_next = False
        self.writes = 0

    async def write(self, records: list[tuple[bytes, bytes | None]]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise WriteFailed("broker gone", committed=False)
        if self.log.writers[self.group_id] != self.epoch:
            from proxy.state_log.log import Fenced
            raise Fenced("a newer writer exists")
        limit = max_record_bytes(self.log.max_message_bytes)
        if any(len(k) + len(v or b"") > limit for k, v in records):
            raise WriteFailed(f"group {self.group_id}: Produce: MESSAGE_TOO_LARGE",
                              committed=False)
        self.writes += 1
        self.log.records.setdefault(self.group_id, []).extend(records)


@dataclass
class Loaded:
    group_id: str
    records: list[tuple[bytes, bytes | None]]
    partition: int = 0
    records_read: int = 0
    offsets: dict[bytes, int] = field(default_factory=dict)
    group_records: int = 0


class FakeStateLog:
    def __init__(self, log: Log) -> None:
        self.log = log
        self.writers: dict[str, FakeWriter] = {}

    async def start(self) -> Any:
        return None

    @property
    def max_record_bytes(self) -> int:
        return max_record_bytes(self.log.max_message_bytes)

    async def open_writer(self, group_id: str) -> FakeWriter:
        writer = self.writers[group_id] = FakeWriter(self.log, group_id)
        return writer

    async def load_group(self, group_id: str) -> Loaded:
        latest: dict[bytes, bytes | None] = {}
        for key, value in self.log.records.get(group_id, []):
            latest.pop(key, None)
            latest[key] = value
        live = [(k, v) for k, v in latest.items() if v is not None]
        offsets = {k: i for i, (k, _) in enumerate(self.log.records.get(group_id, []))}
        return Loaded(group_id, live, records_read=len(live), offsets=offsets,
                      group_records=len(self.log.records.get(group_id, [])))

    async def aclose(self) -> None:
        return None


def durable_service(log: Log) -> tuple[CoordinatorService, FakeStateLog]:
    service = make_service(stub_broker, state_log=True)
    assert service.durability is not None
    fake = FakeStateLog(log)
    service.durability.log = fake  # type: ignore[assignment]
    return service, fake


JOIN = {"group_id": "g", "member_id": "", "member_epoch": 0, "instance_id": None,
        "rack_id": None, "rebalance_timeout_ms": 30000, "subscribed_topic_names": ["orders"],
        "server_assignor": None, "topic_partitions": []}


async def heartbeat(service: CoordinatorService, value: dict[str, Any],
                    correlation: int = 1) -> dict[str, Any]:
    result = await exchange(router(service), request(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0,
                                                     value, correlation))
    assert result.response is not None
    return result.response


async def started(service: CoordinatorService, nursery: trio.Nursery) -> None:
    await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                        task_status=task_status))
    assert service.durability is not None
    await service.durability.started.wait()


async def test_an_answer_leaves_only_once_its_group_s_state_is_written() -> None:
    service, fake = durable_service(Log())
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        coordinate(service, "g")
        await service.durability.take_over("g")  # type: ignore[union-attr]
        writer = fake.writers["g"]
        writer.gate = trio.Event()
        answers: list[dict[str, Any]] = []

        async def join() -> None:
            answers.append(await heartbeat(service, JOIN))

        nursery.start_soon(join)
        await trio.sleep(0.5)
        assert answers == [] and writer.writes == 0  # decided, not yet written: not sent
        writer.gate.set()
        await trio.sleep(0.1)
        assert len(answers) == 1 and answers[0]["error_code"] == 0 and writer.writes == 1
        nursery.cancel_scope.cancel()


async def test_an_answer_written_leaves_even_if_its_group_is_given_up_right_after() -> None:
    """The last KIP-848 member's leave hands the group back (the downgrade policy): the
    hand-back waits for the same units as the leave's answer and gives the group up (its
    tombstones) the moment they are written. The leave was written: it is answered, not
    NOT_COORDINATOR."""
    service, fake = durable_service(Log())
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        coordinate(service, "g")
        durability = service.durability
        assert durability is not None
        await durability.take_over("g")
        writer = fake.writers["g"]
        joined = await heartbeat(service, JOIN)
        assert joined["error_code"] == 0, joined
        writer.gate = trio.Event()

        class GivesUp:
            """Held first: released first, it gives the group up before the answer runs."""

            def set(self) -> None:
                durability.release("g")

        answers: list[dict[str, Any]] = []

        async def beat() -> None:
            answers.append(await heartbeat(service, dict(
                JOIN, member_id=joined["member_id"], member_epoch=-1)))

        writes = durability.groups["g"]
        # the next unit (the leave's) releases it first
        assert not writes.barrier.hold(GivesUp(), writes.barrier.submitted + 1)
        nursery.start_soon(beat)
        await trio.sleep(0.1)
        assert answers == [] and writes.barrier.waiting == 2
        writer.gate.set()
        await trio.sleep(0.1)
        assert "g" not in durability.groups  # given up right after the write
        assert len(answers) == 1 and answers[0]["error_code"] == 0, answers
        nursery.cancel_scope.cancel()


async def test_a_failed_write_fails_the_answer_and_gives_the_group_up() -> None:
    service, fake = durable_service(Log())
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        membership = coordinate(service, "g")
        await service.durability.take_over("g")  # type: ignore[union-attr]
        fake.writers["g"].fail_next = True
        answer = await heartbeat(service, JOIN)
        assert answer["error_code"] == NOT_COORDINATOR
        await trio.sleep(0.1)
        assert "g" not in service.memberships and service.engine.group("g") is None
        assert membership.leaves == 1  # the broker's group is given up: taken over anew
        nursery.cancel_scope.cancel()


async def test_a_new_coordinator_loads_the_group_and_its_members_go_on() -> None:
    log = Log()
    first, _ = durable_service(log)
    async with trio.open_nursery() as nursery:
        await started(first, nursery)
        coordinate(first, "g")
        await first.durability.take_over("g")  # type: ignore[union-attr]
        joined = await heartbeat(first, JOIN)
        member_id, epoch = joined["member_id"], joined["member_epoch"]
        assert joined["assignment"] is not None and epoch > 0
        owned = joined["assignment"]["topic_partitions"]
        nursery.cancel_scope.cancel()

    second, _ = durable_service(log)  # the first one is gone (SIGKILL)
    async with trio.open_nursery() as nursery:
        await started(second, nursery)
        coordinate(second, "g")
        loaded = await second.durability.take_over("g")  # type: ignore[union-attr]
        second.apply(loaded.effects)
        assert loaded.records > 0
        again = await heartbeat(second, dict(JOIN, member_id=member_id, member_epoch=epoch,
                                             rebalance_timeout_ms=-1,
                                             subscribed_topic_names=None,
                                             topic_partitions=owned))
        assert again["error_code"] == 0 and again["member_epoch"] == epoch
        assert again["member_id"] == member_id  # no rejoin, no revocation
        nursery.cancel_scope.cancel()
    assert log.writers["g"] == 2  # the second coordinator's writer fenced the first


async def test_a_stopping_proxy_writes_what_is_pending_leaves_and_disturbs_nobody() -> None:
    service, fake = durable_service(Log())
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        membership = coordinate(service, "g")
        await service.durability.take_over("g")  # type: ignore[union-attr]
        joined = await heartbeat(service, JOIN)
        await service.let_go(5.0)
        assert membership.leaves == 1 and "g" not in service.memberships
        again = await heartbeat(service, dict(JOIN, member_id=joined["member_id"],
                                              member_epoch=joined["member_epoch"],
                                              rebalance_timeout_ms=-1,
                                              subscribed_topic_names=None,
                                              topic_partitions=None))
        # retriable: the member keeps its partitions and finds the next coordinator
        assert again["error_code"] == COORDINATOR_NOT_AVAILABLE
        assert fake.writers["g"].writes >= 1
        nursery.cancel_scope.cancel()


async def test_a_stopping_proxy_looks_its_groups_up_again_for_the_members_left_on_it() -> None:
    """After stepping down, the view of a group this sidecar held named this sidecar, so a
    member's request it had read before the drain began but decides after the step-down (one
    queued behind a waiting commit on the member's connection) was answered
    COORDINATOR_NOT_AVAILABLE even once another sidecar held the group (a drain reads no new
    request). The view is dropped: such a request looks the group up and is relayed once a
    sidecar holds it. (The 6 s of double ownership in the fleet soak, seed 32, run 12, came
    from the takeover wait instead: see the takeover given up in
    ``test_membership_lease.py``.)"""
    service, _ = durable_service(Log())
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        coordinate(service, "g")
        await service.durability.take_over("g")  # type: ignore[union-attr]
        await heartbeat(service, JOIN)
        service.directory._views["g"] = Holder("sidecar", card=service.card)
        await service.let_go(5.0)
        assert service.directory.view("g") is None
        assert service.routes.route(["g"]).kind == LOOKUP
        nursery.cancel_scope.cancel()


async def test_a_stopping_proxy_answers_its_members_commits_itself_not_through_the_broker(
        ) -> None:
    """After stepping down (state written, the broker's group left), the sidecar's client
    connections drain for up to ``shutdown-grace``: a commit (or classic heartbeat) of a
    member of the group it held is answered COORDINATOR_NOT_AVAILABLE, and the member keeps
    its partitions until it reaches the next coordinator. It used to be passed to the broker,
    whose group of that id is the fleet's lock: UNKNOWN_MEMBER_ID, and a kafka-python member
    dropped its partitions and rejoined under a new member id while the next coordinator had
    loaded the old one, whose partitions then waited a whole session (fleet soak, seed 32,
    19 s sessions, runs 2, 3 and 5). A broker's member id passes as before."""
    service, _ = durable_service(Log())
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        coordinate(service, "g")
        await service.durability.take_over("g")  # type: ignore[union-attr]
        joined = await heartbeat(service, JOIN)
        await service.let_go(5.0)

        def commit(member_id: str) -> Any:
            return request(ApiKey.OFFSET_COMMIT, 8, {
                "group_id": "g", "generation_id_or_member_epoch": joined["member_epoch"],
                "member_id": member_id, "group_instance_id": None, "topics": [
                    {"name": "orders", "partitions": [
                        {"partition_index": 0, "committed_offset": 5,
                         "committed_leader_epoch": -1, "committed_metadata": ""}]}]})

        answered = await exchange(router(service), commit(joined["member_id"]))
        assert answered.action == "local" and answered.response is not None
        assert answered.response["topics"][0]["partitions"][0]["error_code"] == \
            COORDINATOR_NOT_AVAILABLE
        classic = await exchange(router(service), request(ApiKey.HEARTBEAT, 4, {
            "group_id": "g", "generation_id": 3,
            "member_id": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "group_instance_id": None}))
        assert classic.action == "local" and classic.response is not None
        assert classic.response["error_code"] == COORDINATOR_NOT_AVAILABLE
        direct = await exchange(router(service),
                                commit("connect-1-1b4e28ba-2fa1-11d2-883f-0016d3cca427"))
        assert direct.action == "forward"
        nursery.cancel_scope.cancel()


async def test_only_members_a_groupgate_engine_may_know_take_a_free_group_over() -> None:
    """A classic member id a broker gave (client id, dash, UUID: Kafka Connect workers, direct
    consumers) belongs to the broker's own group; a free group is taken over (to load its
    state) only for a member whose id came from an engine: a bare UUID for classic members, a
    client-made id for new-protocol ones."""
    from proxy.coordination.fleet import Holder
    from proxy.coordination.service import issued_by_a_broker

    assert issued_by_a_broker("connect-1-1b4e28ba-2fa1-11d2-883f-0016d3cca427")
    assert not issued_by_a_broker("1b4e28ba-2fa1-11d2-883f-0016d3cca427")
    assert not issued_by_a_broker("xrCvVRBIR6WzpIOySybM+g")
    service, _ = durable_service(Log())
    service.directory._views["g"] = Holder("free")
    assert not service.may_load("g", "connect-1-1b4e28ba-2fa1-11d2-883f-0016d3cca427")
    assert service.may_load("g", "1b4e28ba-2fa1-11d2-883f-0016d3cca427")
    assert service.may_load("g", "xrCvVRBIR6WzpIOySybM+g")
    assert not service.may_load("g", "")
    service.directory._views["g"] = Holder("broker")
    assert not service.may_load("g", "xrCvVRBIR6WzpIOySybM+g")


UNKNOWN_MEMBER_ID = 25


async def _two_members(log: Log) -> list[dict[str, Any]]:
    """Two members join a group coordinated by a first sidecar writing ``log``."""
    first, _ = durable_service(log)
    async with trio.open_nursery() as nursery:
        await started(first, nursery)
        coordinate(first, "g")
        await first.durability.take_over("g")  # type: ignore[union-attr]
        joined = [await heartbeat(first, JOIN), await heartbeat(first, JOIN, 2)]
        nursery.cancel_scope.cancel()
    return joined


async def test_a_record_that_cannot_be_decoded_is_skipped_and_its_member_rejoins() -> None:
    from translation.records import RecordKind, decode_key

    log = Log()
    joined = await _two_members(log)
    bad, good = joined[0], joined[1]
    # the first member's member record becomes unreadable (a newer version, a bit flip)
    records = log.records["g"]
    for i, (key, _value) in enumerate(records):
        record_key = decode_key(key)
        if record_key.kind == RecordKind.MEMBER and record_key.member_id == bad["member_id"]:
            records[i] = (key, b"\xff\xffgarbage")
    second, _ = durable_service(log)
    async with trio.open_nursery() as nursery:
        await started(second, nursery)
        membership = coordinate(second, "g")
        membership.previous_generation = 7
        await second._established(membership)  # before the fix: GroupStateLost, forever
        group = second.engine.group("g")
        assert group is not None and set(group.members) == {good["member_id"]}
        # the loaded member goes on; the skipped one is unknown and rejoins
        again = await heartbeat(second, dict(JOIN, member_id=good["member_id"],
                                             member_epoch=good["member_epoch"],
                                             rebalance_timeout_ms=-1,
                                             subscribed_topic_names=None,
                                             topic_partitions=None))
        assert again["error_code"] == 0 and again["member_id"] == good["member_id"]
        lost = await heartbeat(second, dict(JOIN, member_id=bad["member_id"],
                                            member_epoch=bad["member_epoch"],
                                            rebalance_timeout_ms=-1,
                                            subscribed_topic_names=None,
                                            topic_partitions=None), 3)
        assert lost["error_code"] == UNKNOWN_MEMBER_ID
        # what the skipped member held is not handed out before it can have let go
        assert second.loading("g") > 0
        nursery.cancel_scope.cancel()


async def test_a_write_task_that_fails_on_a_bug_gives_up_its_group_alone() -> None:
    service, fake = durable_service(Log())
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        broken = coordinate(service, "g")
        coordinate(service, "h")
        await service.durability.take_over("g")  # type: ignore[union-attr]
        await service.durability.take_over("h")  # type: ignore[union-attr]

        async def bug(records: list[tuple[bytes, bytes | None]]) -> None:
            raise RuntimeError("a bug")

        fake.writers["g"].write = bug  # type: ignore[method-assign]
        with trio.fail_after(10):  # before the fix: the state log's task died with it
            answer = await heartbeat(service, JOIN)
        assert answer["error_code"] == NOT_COORDINATOR
        await trio.testing.wait_all_tasks_blocked()
        assert broken.leaves == 1 and "g" not in service.memberships
        # the other group is written and answered as ever
        with trio.fail_after(10):
            other = await heartbeat(service, dict(JOIN, group_id="h"), 2)
        assert other["error_code"] == 0 and fake.writers["h"].writes == 1
        nursery.cancel_scope.cancel()


async def test_a_takeover_without_state_of_a_group_held_before_waits() -> None:
    """A sidecar with other state-log settings (or a lost log) finds nothing: it must not
    assign at once what the last coordinator's members may still consume."""
    service, _ = durable_service(Log())
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        membership = coordinate(service, "g")
        membership.previous_generation = 4  # someone held the broker's group
        await service._established(membership)
        assert service.loading("g") > 0
        answer = await heartbeat(service, JOIN)
        assert answer["error_code"] == 14  # COORDINATOR_LOAD_IN_PROGRESS
        fresh = coordinate(service, "new")
        fresh.previous_generation = 0  # a group that never had members: no wait
        await service._established(fresh)
        assert service.loading("new") == 0
        joined = await heartbeat(service, dict(JOIN, group_id="new"), 2)
        assert joined["error_code"] == 0
        nursery.cancel_scope.cancel()


async def test_a_group_the_log_shows_deleted_is_assigned_at_once() -> None:
    log = Log()
    log.records["g"] = [(b"k", b"v"), (b"k", None)]  # written, then deleted
    service, _ = durable_service(log)
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        membership = coordinate(service, "g")
        membership.previous_generation = 4
        await service._established(membership)
        assert service.loading("g") == 0
        assert (await heartbeat(service, JOIN))["error_code"] == 0
        nursery.cancel_scope.cancel()


INVALID_REQUEST = 42
HUGE = [f"topic-{i:05d}-" + "x" * 200 for i in range(400)]
"""400 legal topic names of 212 characters: a member record of about 86 KB."""


def refused_too_large() -> float:
    return metrics.REGISTRY.get_sample_value(
        "groupgate_state_members_refused_too_large_total",
        {"api": "consumer-group-heartbeat"}) or 0.0


async def test_a_member_too_large_for_the_log_is_refused_and_the_group_goes_on() -> None:
    """A member whose record exceeds the topic's max.message.bytes (64 KiB here) is refused
    with INVALID_REQUEST, joining or changing its subscription; the group's writes go on and
    its other members never see NOT_COORDINATOR."""
    log = Log(max_message_bytes=64 * 1024)
    service, fake = durable_service(log)
    async with trio.open_nursery() as nursery:
        await started(service, nursery)
        membership = coordinate(service, "g")
        await service.durability.take_over("g")  # type: ignore[union-attr]
        limit = max_record_bytes(64 * 1024)
        assert service.engine.config.max_state_record_bytes == limit  # the topic's, less
        m1 = await heartbeat(service, JOIN)
        m2 = await heartbeat(service, JOIN, 2)
        assert m1["error_code"] == m2["error_code"] == 0
        writes, counted = fake.writers["g"].writes, refused_too_large()

        big = await heartbeat(service, dict(JOIN, subscribed_topic_names=HUGE), 3)
        assert big["error_code"] == INVALID_REQUEST
        assert str(limit) in big["error_message"]
        grown = await heartbeat(service, dict(
            JOIN, member_id=m1["member_id"], member_epoch=m1["member_epoch"],
            rebalance_timeout_ms=-1, subscribed_topic_names=HUGE, topic_partitions=None), 4)
        assert grown["error_code"] == INVALID_REQUEST
        assert refused_too_large() == counted + 2

        for n, m in enumerate((m1, m2)):  # the others go on: no NOT_COORDINATOR, same epochs
            steady = await heartbeat(service, dict(
                JOIN, member_id=m["member_id"], member_epoch=m["member_epoch"],
                rebalance_timeout_ms=-1, subscribed_topic_names=None, topic_partitions=None),
                5 + n)
            assert steady["error_code"] == 0
        m3 = await heartbeat(service, JOIN, 7)  # and the group's state is still written
        assert m3["error_code"] == 0 and fake.writers["g"].writes > writes
        assert membership.leaves == 0 and "g" in service.memberships
        live = fold(decode_record(k, v) for k, v in log.records["g"])
        members = {k.member_id for k in live if k.kind is RecordKind.MEMBER}
        assert members == {m1["member_id"], m2["member_id"], m3["member_id"]}
        nursery.cancel_scope.cancel()
