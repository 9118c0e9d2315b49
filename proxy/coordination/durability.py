"""Durable group state in the coordinator service: what the engine changes is written to the
state log before any answer that depends on it leaves, and a sidecar taking a group over
loads it first.

With ``state-log`` on, the engine tracks what each call changed (``GroupConfig.durable_state``)
and the service drains it after every call (:meth:`Durability.submit`). Each coordinated group
has one :class:`GroupWrites`: its transactional writer (:mod:`proxy.state_log.writer`,
fenced by the group's transactional id), the records waiting, and two counters, units submitted
and units acknowledged. One task per group writes what is waiting as one transaction at a time
(what arrives meanwhile goes into the next one), in order.

The rule a response follows (:meth:`Durability.settled`, kept by the group's
:class:`~translation.write_barrier.WriteBarrier`, the same one the fleet core and the engine's
failover simulation keep): it leaves only once every unit of its group submitted up to its
engine call is acknowledged, not only its own. A call that wrote
nothing may still answer with what an earlier, unacknowledged call decided (a retried heartbeat
gets the epoch the lost response carried); if that write were lost in a failover, the member
would know an epoch the next coordinator never heard of. The simulator checks this rule
(``translation/simulation/failover.py``).

Taking a group over (:meth:`Durability.take_over`, run by the broker membership when it first
holds the group, before anyone waiting on it is answered): open the group's writer (which
fences every earlier one and aborts its open transaction), read the group's records to the end,
refresh topic metadata for the topics they name, and load them into the engine. Members that
heartbeat through the failover keep their member ids, epochs and partitions.

A write that fails fails its group here: the answers waiting on it get an error, the engine
forgets the group, and the broker membership is given up (:class:`GroupStateLost`), so that
this sidecar or another takes the group over again from what the log holds. A group's write
task that fails unexpectedly (a bug) is treated the same way, for that group alone: whether its
batch was written is unknown, so its answers fail and the group is taken over again, which
starts a new write task; other groups' tasks and the service go on.

Records too large for the topic. A record larger than the topic's ``max.message.bytes`` can
never be written, and a write that fails gives the whole group up. So the engine is told the
largest record the log takes (``GroupConfig.max_state_record_bytes``: the topic's
``max.message.bytes``, as the broker reports it once the topic is checked, less a batch's
overhead) and refuses a member whose record would be larger before it is admitted or changed
(:func:`translation.limits.check_member_record`); the service counts each refusal
(``groupgate_state_members_refused_too_large_total``). Only a member's member record is sized this
way: its assignment record and the group record grow with the partitions and topics the group's
assignor hands out, which the member's request does not decide.

Records that cannot be read back. A takeover never retries a record that will never decode: a
record of the group whose value (or key) does not decode is skipped with an ERROR line naming
the group, the key and the offset (metric ``groupgate_state_records_skipped_total``). A member
is loaded from its member and assignment records together, so a member with either one skipped
is not loaded at all: it is unknown to the new coordinator, its next request is answered
UNKNOWN_MEMBER_ID and it rejoins (as a member the old coordinator removed would); its partitions
are free to be assigned anew. A group record that does not decode, or records the engine cannot
make a group of, leave the group unloaded: it starts empty, as if the log held nothing. Either
way :attr:`Loaded.skipped` says so, and the service then lets joins wait as after a takeover
without state (``takeover-wait-ms``), so members the old coordinator assigned let go first.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import trio

from proxy import metrics
from proxy.state_log.log import StateLog, StateLogError, Writer
from translation.coordinator import GroupCoordinator
from translation.durable import StateLoadError
from translation.effects import Effect
from translation.records import (
    MemberValue,
    RecordError,
    RecordKind,
    StateRecord,
    decode_key,
    decode_record,
    encode_record,
)
from translation.write_barrier import WriteBarrier

log = logging.getLogger("groupgate.coordination")

START_RETRY_SECONDS = 1.0
SETTLE_SECONDS = 30.0
"""Longest an answer waits for its group's writes (the state log's own write timeout is
shorter; this only guards against a bug)."""


class GroupStateLost(Exception):
    """The group's state could not be written or loaded: this sidecar must stop coordinating
    it (it may take it over again from the log)."""


@dataclass
class GroupWrites:
    """One coordinated group's write pipeline."""

    group_id: str
    writer: Writer
    pending: list[StateRecord] = field(default_factory=list)
    barrier: WriteBarrier[trio.Event] = field(default_factory=WriteBarrier)
    """Units (one per engine call that changed the group) submitted and acknowledged, and the
    answers waiting for them (:mod:`translation.write_barrier`): each an event set once it
    may leave, or once the group failed."""
    failed: str | None = None
    wake: trio.Event = field(default_factory=trio.Event)


@dataclass(frozen=True)
class Loaded:
    """What a takeover found in the log."""

    records: int
    """Live records of the group loaded (0: none)."""
    effects: list[Effect]
    skipped: int = 0
    """Records of the group that could not be loaded (see the module docstring)."""
    deleted: bool = False
    """The log holds the group's tombstones and nothing live: a coordinator writing this log
    deleted the group (it was empty)."""


class Durability:
    """The state log as the coordinator service uses it."""

    def __init__(self, log_: StateLog, engine: GroupCoordinator,
                 wall_ms: Callable[[], int], now_ms: Callable[[], int],
                 refresh_topics: Callable[[Iterable[str], bool], Awaitable[None]]) -> None:
        self.log = log_
        self.engine = engine
        self._wall_ms = wall_ms
        self._now_ms = now_ms
        self._refresh_topics = refresh_topics
        self.groups: dict[str, GroupWrites] = {}
        self.lost: Callable[[str, str], None] = lambda _group, _reason: None
        """Told when a group's writes failed (the service gives the group up)."""
        self._nursery: trio.Nursery | None = None
        self.started = trio.Event()
        """Set once the topic is known to be usable."""
        engine.config.max_state_record_bytes = log_.max_record_bytes

    async def run(self) -> None:
        """Create or check the topic (again and again until it works: groups wait for it
        meanwhile), then run the groups' writer tasks until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            delay = START_RETRY_SECONDS
            while not self.started.is_set():
                try:
                    await self.log.start()
                except StateLogError as exc:
                    log.error("the state log cannot be used yet (groups are not taken over "
                              "until it can): %s", exc)
                    await trio.sleep(delay)
                    delay = min(delay * 2, 60.0)
                    continue
                # before any group is taken over: members are sized against the topic's own
                # max.message.bytes, whatever it was configured with
                self.engine.config.max_state_record_bytes = self.log.max_record_bytes
                self.started.set()
            await trio.sleep_forever()

    async def aclose(self) -> None:
        await self.log.aclose()

    # -- taking a group over ------------------------------------------------------------------

    async def take_over(self, group_id: str) -> Loaded:
        """Fence earlier writers of ``group_id``, read its records and load them into the
        engine (GroupStateLost if the log cannot be used)."""
        await self.started.wait()
        assert self._nursery is not None
        previous = self.groups.pop(group_id, None)
        if previous is not None:
            self._fail(previous, "taken over again")
        try:
            writer = await self.log.open_writer(group_id)
            loaded = await self.log.load_group(group_id)
        except StateLogError as exc:
            raise GroupStateLost(f"group {group_id}: its state could not be loaded: {exc}"
                                 ) from exc
        records, skipped = _readable(group_id, loaded.records, loaded.offsets)
        writes = GroupWrites(group_id, writer)
        self.groups[group_id] = writes
        self._nursery.start_soon(self._write_loop, writes)
        if not records:
            return Loaded(0, [], skipped, deleted=not skipped and loaded.group_records > 0)
        names, regex = _subscriptions(records)
        await self._refresh_topics(names, regex)
        try:
            effects = self.engine.load_group(group_id, records, self._now_ms(),
                                             self._wall_ms())
        except (StateLoadError, RecordError) as exc:
            # never loadable: retrying would fail the same way forever
            log.error("group %s: its %d record(s) in the state log (partition %d) do not make "
                      "a group and are skipped; it starts empty: %s", group_id, len(records),
                      loaded.partition, exc)
            metrics.STATE_RECORDS_SKIPPED.inc(len(records))
            return Loaded(0, [], skipped + len(records))
        log.info("group %s: loaded %d record(s) from the state log (partition %d, %d "
                 "record(s) read)", group_id, len(records), loaded.partition,
                 loaded.records_read)
        return Loaded(len(records), effects, skipped)

    def release(self, group_id: str) -> None:
        """The service no longer coordinates ``group_id``: stop writing it (what is pending
        is dropped; the next coordinator reads what the log holds)."""
        writes = self.groups.pop(group_id, None)
        if writes is not None:
            self._fail(writes, "no longer coordinated here")

    # -- writing --------------------------------------------------------------------------------

    def submit(self, records: list[StateRecord]) -> None:
        """Queue what one engine call changed, one unit per group."""
        by_group: dict[str, list[StateRecord]] = {}
        for record in records:
            by_group.setdefault(record.key.group_id, []).append(record)
        for group_id, mine in by_group.items():
            writes = self.groups.get(group_id)
            if writes is None or writes.failed is not None:
                # Nothing of it is coordinated here (any more): the engine changed a group it
                # is about to forget; the log keeps what the last writer wrote.
                continue
            writes.pending.extend(mine)
            writes.barrier.submit()
            writes.wake.set()

    async def flush(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) until everything submitted for every group is written."""
        with trio.move_on_after(timeout_s):
            for group_id in list(self.groups):
                await self.settled(group_id)

    async def settled(self, group_id: str) -> str | None:
        """Wait until every unit of ``group_id`` submitted so far is acknowledged; None, or
        why it never will be (the answer must not leave then)."""
        writes = self.groups.get(group_id)
        if writes is None:
            return None  # nothing was written for it here
        if writes.failed is not None:
            return writes.failed
        leave = trio.Event()
        needed = writes.barrier.submitted
        if writes.barrier.hold(leave):
            return None
        with trio.move_on_after(SETTLE_SECONDS):
            await leave.wait()
        if writes.barrier.acknowledged >= needed:
            # written: the answer may leave, even if the group was given up right after (a
            # hand-back's own tombstones follow the last member's leave)
            return None
        if writes.failed is not None:
            return writes.failed
        if not leave.is_set():
            writes.barrier.withdraw(leave)
            return "the group's state was not written in time"
        return None

    async def _write_loop(self, writes: GroupWrites) -> None:
        """Write the group's batches until it fails or is released; whatever goes wrong stays
        with this group (see the module docstring)."""
        try:
            await self._write_batches(writes)
        except Exception as exc:
            log.exception("group %s: writing its state failed unexpectedly; giving the group "
                          "up (it is taken over again, with a new write task)", writes.group_id)
            metrics.STATE_WRITE_TASK_FAILURES.inc()
            self._give_up(writes, f"writing its state failed unexpectedly: {exc!r}")

    async def _write_batches(self, writes: GroupWrites) -> None:
        while writes.failed is None:
            await writes.wake.wait()
            writes.wake = trio.Event()
            if writes.failed is not None:
                return
            if not writes.pending:
                continue
            batch, writes.pending = writes.pending, []
            unit = writes.barrier.submitted
            try:
                await writes.writer.write([encode_record(r) for r in batch])
            except StateLogError as exc:
                reason = f"writing its state failed: {exc}"
                log.warning("group %s: %s; giving the group up", writes.group_id, reason)
                self._give_up(writes, reason)
                return
            for leave in writes.barrier.acknowledge(unit):
                leave.set()

    def _give_up(self, writes: GroupWrites, reason: str) -> None:
        """The group's writes failed: its answers fail and the service gives it up."""
        if writes.failed is not None:
            return  # released or taken over again meanwhile: nothing more to tell
        self._fail(writes, reason)
        if self.groups.get(writes.group_id) is writes:
            del self.groups[writes.group_id]
        self.lost(writes.group_id, reason)

    @staticmethod
    def _fail(writes: GroupWrites, reason: str) -> None:
        if writes.failed is None:
            writes.failed = reason
            writes.pending = []
            writes.wake.set()
            for leave in writes.barrier.drop():
                leave.set()


def _subscriptions(records: Iterable[StateRecord]) -> tuple[set[str], bool]:
    """The topic names the members in ``records`` subscribe to, and whether any subscribes by
    regex (then every topic's metadata is needed)."""
    names: set[str] = set()
    regex = False
    for record in records:
        if isinstance(record.value, MemberValue):
            names.update(record.value.subscribed_topic_names)
            regex = regex or bool(record.value.subscribed_topic_regex)
    return names, regex


def _readable(group_id: str, raw: Iterable[tuple[bytes, bytes]], offsets: dict[bytes, int]
              ) -> tuple[list[StateRecord], int]:
    """The group's records that decode, in order, and how many were skipped: a record that
    does not decode, and the other record of the same member (a member is loaded from both or
    not at all)."""
    decoded: list[StateRecord] = []
    bad_members: set[str] = set()
    skipped = 0
    for key, value in raw:
        try:
            decoded.append(decode_record(key, value))
        except RecordError as exc:
            skipped += 1
            log.error("group %s: skipping the state record with key %r at offset %d (it "
                      "cannot be decoded: %s)", group_id, key[:200], offsets.get(key, -1), exc)
            try:
                bad = decode_key(key)
            except RecordError:
                continue
            if bad.kind != RecordKind.GROUP:
                bad_members.add(bad.member_id)
    if bad_members:
        kept = [r for r in decoded if r.key.kind == RecordKind.GROUP
                or r.key.member_id not in bad_members]
        for record in decoded:
            if record not in kept:
                log.error("group %s: skipping the state record of member %s (%s) at offset %d: "
                          "the member's other record cannot be decoded; it rejoins",
                          group_id, record.key.member_id, record.key.kind.name,
                          offsets.get(encode_record(record)[0], -1))
        skipped += len(decoded) - len(kept)
        decoded = kept
    if skipped:
        metrics.STATE_RECORDS_SKIPPED.inc(skipped)
    return decoded, skipped
