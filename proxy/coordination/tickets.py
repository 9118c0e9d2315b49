"""Commit tickets: a relayed member's commit is validated by the holder, sent by its follower.

A commit of a member behind a follower sidecar must reach the broker under the client's own
principal, on the client's own authenticated connection, which only the follower has
(decision record 0018, section 3):

1. The follower asks the group's holder for a ticket: one ``FleetControl`` request
   (:data:`COMMIT_TICKET`) on its link to the holder for that client connection, carrying the
   OffsetCommit or TxnOffsetCommit as the client sent it and the relay mark.
2. The holder decides it exactly as a relayed commit (engine validation, the takeover or
   membership waits, :class:`~proxy.coordination.offsets.OffsetCommitHandler`) but does not
   send it: a refusal comes back as one error code for every partition; an accepted commit as
   a :class:`Ticket`: the lock member's id and generation to stamp it with, the version to send
   it as, the group's broker coordinator node, and a ticket id. The stamp counts as in flight
   (:meth:`~proxy.coordination.membership.BrokerMembership.stamp`: a planned rejoin drains it)
   until the follower reports :data:`COMMIT_DONE` with the broker's partition errors, or
   :data:`TICKET_SECONDS` passed (a follower that died). The broker's errors are read at the
   holder as its own stamped commit's would be (a stale membership rejoins).
3. The follower stamps the commit and sends it upstream on the client's connection, where the
   broker authorizes the client's principal; its answer goes to the client (a refused stamp,
   ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID, becomes the retriable
   COORDINATOR_LOAD_IN_PROGRESS, as for the holder's own members).

A holder that does not know the request (a protocol-3 build from before tickets) answers
INVALID_REQUEST with no body: the follower then relays the commit as before, and the holder
commits it as the proxy. Holders of fleet protocol 2 are never asked.

Bounded state (decision 0008): the holder keeps at most :data:`MAX_TICKETS` open tickets, each
for at most :data:`TICKET_SECONDS`; the follower queues at most :data:`MAX_REPORTS` reports
and keeps links to at most :data:`MAX_REPORT_LINKS` holders.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import trio
from cachetools import TTLCache

from proxy import metrics
from proxy.coordination import fleet_answers, regex_rights
from proxy.coordination.fleet_control import FLEET_CONTROL, FLEET_CONTROL_VERSION
from proxy.coordination.handler import Value
from proxy.coordination.membership import DRAIN_SECONDS
from proxy.upstream import UpstreamError
from translation.errors import ErrorCode

if TYPE_CHECKING:
    from proxy.kafka_client.links import BrokerLink, LinkPool

log = logging.getLogger("groupgate.coordination")

Address = tuple[str, int]

COMMIT_TICKET: Final = "CommitTicket"
COMMIT_DONE: Final = "CommitDone"
TICKET_PROTOCOL: Final = 3
"""The lowest fleet protocol of a holder asked for tickets."""
TICKET_SECONDS: Final = DRAIN_SECONDS
"""How long a holder keeps a ticket the follower never reported."""
MAX_TICKETS: Final = 4096
"""Open tickets a holder keeps; past it, commits are answered the retriable
COORDINATOR_LOAD_IN_PROGRESS until some are reported."""
MAX_REPORTS: Final = 1024
"""Reports a follower queues; one that does not fit is dropped (the holder's ticket then
expires after :data:`TICKET_SECONDS`)."""
MAX_REPORT_LINKS: Final = 64
"""Holders a follower keeps a link to for its reports."""
REPORT_SECONDS: Final = 2.0
MAX_ASK_BYTES: Final = 4 << 20


@dataclass(frozen=True, slots=True)
class Ticket:
    """What the holder tells the follower to send."""

    ticket_id: int
    member_id: str | None
    """The lock member's id to stamp the commit with (None: send it as it is, a version
    without member fields)."""
    generation: int
    version: int | None
    """The version to send it as (None: the client's)."""
    coordinator: int | None
    """The broker node coordinating the group at the broker (None: not known)."""

    def stamped(self, value: Value) -> Value:
        """The client's commit stamped with the lock's membership."""
        if self.member_id is None:
            return value
        return dict(value, member_id=self.member_id,
                    generation_id_or_member_epoch=self.generation, group_instance_id=None)


@dataclass(frozen=True, slots=True)
class Reply:
    """The holder's answer to a ticket request: an error for every partition, or a ticket."""

    error: int = 0
    ticket: Ticket | None = None


# -- what travels ---------------------------------------------------------------------------

def ask_body(api_key: int, version: int, mark: str, request: bytes) -> bytes:
    """A ``CommitTicket`` body: the commit's API, version, encoded body and relay mark."""
    return json.dumps({"type": COMMIT_TICKET, "api_key": api_key, "version": version,
                       "mark": mark, "request": base64.b64encode(request).decode()},
                      separators=(",", ":")).encode()


def read_ask(body: dict[str, Any]) -> tuple[int, int, str, bytes]:
    """(api key, version, mark, encoded request) of a ``CommitTicket`` body; ValueError if it
    does not say them."""
    api_key, version, mark = body.get("api_key"), body.get("version"), body.get("mark")
    request = body.get("request")
    if not (isinstance(api_key, int) and isinstance(version, int) and isinstance(mark, str)
            and isinstance(request, str)):
        raise ValueError("not a CommitTicket")
    return api_key, version, mark, base64.b64decode(request, validate=True)


def reply_body(reply: Reply) -> bytes:
    """The answer's body after its correlation id: the error code, then the ticket (JSON)."""
    ticket = reply.ticket
    if ticket is None:
        return fleet_answers.encode(reply.error, {})
    return fleet_answers.encode(reply.error, {
        "ticket": ticket.ticket_id, "member_id": ticket.member_id,
        "generation": ticket.generation, "version": ticket.version,
        "coordinator": ticket.coordinator})


def read_reply(raw: bytes) -> Reply | None:
    """The holder's answer; None when it does not take tickets (INVALID_REQUEST, no body:
    relay the commit instead). ValueError if it cannot be read."""
    error, body = fleet_answers.read(raw, "a ticket")
    if body is None:
        return None if error in fleet_answers.NOT_TAKEN else Reply(error)
    if "ticket" not in body:
        return Reply(error or int(ErrorCode.UNKNOWN_SERVER_ERROR))
    member_id, version, coordinator = (body.get("member_id"), body.get("version"),
                                       body.get("coordinator"))
    ticket_id, generation = body["ticket"], body.get("generation")
    if not (isinstance(ticket_id, int) and isinstance(generation, int)
            and (member_id is None or isinstance(member_id, str))
            and (version is None or isinstance(version, int))
            and (coordinator is None or isinstance(coordinator, int))):
        raise ValueError("unreadable ticket")
    return Reply(error, Ticket(ticket_id, member_id, generation, version, coordinator))


def done_body(group_id: str, ticket_id: int, errors: list[int]) -> bytes:
    return json.dumps({"type": COMMIT_DONE, "group": group_id, "ticket": ticket_id,
                       "errors": sorted(set(errors))[:32]}, separators=(",", ":")).encode()


def read_done(body: dict[str, Any]) -> tuple[str, int, list[int]]:
    group_id, ticket_id, errors = body.get("group"), body.get("ticket"), body.get("errors")
    if not (isinstance(group_id, str) and isinstance(ticket_id, int)
            and isinstance(errors, list) and all(isinstance(e, int) for e in errors)):
        raise ValueError("not a CommitDone")
    return group_id, ticket_id, errors


# -- the holder's open tickets --------------------------------------------------------------

@dataclass(slots=True)
class _Open:
    group_id: str
    deadline: float
    release: Callable[[], None]
    on_errors: Callable[[set[int]], None]
    """The broker's errors, read as the holder's own stamped commit's would be."""


class TicketBook:
    """The tickets a holder gave out and was not told the end of (sans-I/O: times are
    passed in)."""

    def __init__(self, limit: int = MAX_TICKETS, lifetime: float = TICKET_SECONDS) -> None:
        self._open: OrderedDict[int, _Open] = OrderedDict()
        self._limit = limit
        self._lifetime = lifetime

    def __len__(self) -> int:
        return len(self._open)

    def issue(self, group_id: str, release: Callable[[], None],
              on_errors: Callable[[set[int]], None], now: float) -> int | None:
        """A ticket id for a stamp (``release``: its end), kept until :meth:`done` or its
        lifetime passed; None if too many are open (the stamp is released then). Only the
        callables are kept, never the commit."""
        self.expire(now)
        if len(self._open) >= self._limit:
            release()
            return None
        ticket_id = secrets.randbits(53)  # an integer JSON carries exactly
        while ticket_id in self._open:
            ticket_id = secrets.randbits(53)
        self._open[ticket_id] = _Open(group_id, now + self._lifetime, release, on_errors)
        return ticket_id

    def done(self, group_id: str, ticket_id: int, errors: list[int]) -> bool:
        """The follower's report: the broker answered the stamped commit with ``errors``
        (none: it never reached the broker, or the client's connection closed first). The
        stamp is released and the errors read as the holder's own commit's would be."""
        entry = self._open.get(ticket_id)
        if entry is None or entry.group_id != group_id:
            return False
        del self._open[ticket_id]
        entry.release()
        if errors:
            entry.on_errors(set(errors))
        return True

    def expire(self, now: float) -> int:
        """Release the tickets whose lifetime passed; how many."""
        count = 0
        while self._open:
            ticket_id, entry = next(iter(self._open.items()))
            if entry.deadline > now:
                break
            del self._open[ticket_id]
            entry.release()
            count += 1
        if count:
            log.info("%d commit ticket(s) released unreported after %.0f s", count,
                     self._lifetime)
        return count

    def next_deadline(self) -> float | None:
        return next(iter(self._open.values())).deadline if self._open else None


# -- the running pieces ---------------------------------------------------------------------

class Tickets:
    """A sidecar's side of commit tickets: the book of those it gave out (as a holder), and
    the reports it owes (as a follower), delivered in the background."""

    def __init__(self, pool: Callable[[], LinkPool]) -> None:
        self.book = TicketBook()
        self._pool = pool
        self._reports: trio.MemoryReceiveChannel[tuple[Address, bytes]]
        self._outbox: trio.MemorySendChannel[tuple[Address, bytes]]
        self._outbox, self._reports = trio.open_memory_channel(MAX_REPORTS)
        self._links: OrderedDict[Address, BrokerLink] = OrderedDict()
        self._wake = trio.Event()
        self.dropped = 0
        self._plain: TTLCache[Address, bool] = TTLCache(
            maxsize=regex_rights.MAX_PLAIN, ttl=regex_rights.PLAIN_SECONDS,
            timer=trio.current_time)
        """Holders that took no heartbeat inside ``FleetControl`` (:mod:`.regex_rights`)."""

    def takes_heartbeats(self, address: Address) -> bool:
        """Whether a relayed heartbeat goes to the holder at ``address`` inside
        ``FleetControl`` (:mod:`.regex_rights`)."""
        return address not in self._plain

    def relay_heartbeats(self, address: Address) -> None:
        """The holder at ``address`` takes no heartbeats inside ``FleetControl``: relay them
        for :data:`~.regex_rights.PLAIN_SECONDS`."""
        self._plain[address] = True

    def issue(self, group_id: str, release: Callable[[], None],
              on_errors: Callable[[set[int]], None]) -> int | None:
        ticket_id = self.book.issue(group_id, release, on_errors, trio.current_time())
        if ticket_id is not None:
            self._wake.set()
        return ticket_id

    def report(self, address: Address, group_id: str, ticket_id: int, errors: list[int]
               ) -> None:
        """Tell the holder at ``address`` that the ticket's commit is over (in the
        background; dropped if too many are queued)."""
        try:
            self._outbox.send_nowait((address, done_body(group_id, ticket_id, errors)))
        except trio.WouldBlock:
            self.dropped += 1
            metrics.COMMIT_TICKETS.labels("report_dropped").inc()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire)
            try:
                async for address, body in self._reports:
                    await self._deliver(address, body)
            finally:
                links, self._links = self._links, OrderedDict()
                with trio.CancelScope(shield=True):
                    for link in links.values():
                        await link.aclose()

    async def _expire(self) -> None:
        while True:
            self._wake = trio.Event()
            deadline = self.book.next_deadline()
            if deadline is None:
                await self._wake.wait()
                continue
            await trio.sleep_until(deadline)
            self.book.expire(trio.current_time())

    async def _deliver(self, address: Address, body: bytes) -> None:
        link = self._links.get(address)
        if link is None:
            if len(self._links) >= MAX_REPORT_LINKS:
                _, oldest = self._links.popitem(last=False)
                await oldest.aclose()
            link = self._links[address] = self._pool().peer(address, REPORT_SECONDS)
        else:
            self._links.move_to_end(address)
        try:
            await link.exchange_raw(FLEET_CONTROL, FLEET_CONTROL_VERSION, body,
                                    timeout=REPORT_SECONDS)
            metrics.COMMIT_TICKETS.labels("reported").inc()
        except UpstreamError as exc:
            metrics.COMMIT_TICKETS.labels("report_failed").inc()
            log.info("reporting a commit ticket to %s:%d failed: %s", *address, exc)
