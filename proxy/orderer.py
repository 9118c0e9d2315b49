"""Keeps the responses on one client connection in request order.

Kafka clients match responses to requests by correlation id but also rely on the broker's
guarantee that responses come back in the order the requests were sent. The proxy answers some
requests itself (ApiVersions it cannot forward, later the group APIs it coordinates) while
forwarding the rest, so answers become ready out of order. :class:`ResponseOrderer` holds one
slot per request that expects a response, in arrival order; a slot is filled either at once
(a local answer) or when the upstream broker's response arrives, and only the filled prefix of
the queue is released to the client. Produce with ``acks=0`` gets no slot: no response comes.

Probes. The proxy also sends requests of its own on a client's broker connection (asking the
broker what the client may do, :mod:`proxy.security.rights`): a probe is a slot that waits
for the broker like any other, in wire order, but is never part of the client's queue. Its
answer goes to ``on_response`` (the proxy) and nothing of it is released to the client, so
the client sees exactly its own responses, in its own order.

It is sans-I/O: the connection task calls it and writes what :meth:`take_ready` returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class OrderingError(Exception):
    """The upstream broker answered a correlation id other than the oldest one outstanding."""


Payload = bytes | bytearray | memoryview
ResponseFilter = Callable[[memoryview], Payload | None]
"""Turns the broker's response payload into the client's (None: unchanged)."""


class Slot:
    """One request awaiting its response."""

    __slots__ = ("api_key", "api_version", "correlation_id", "data", "on_abandon",
                 "on_response", "probe", "sent", "started")

    def __init__(self, correlation_id: int, api_key: int, api_version: int,
                 probe: bool = False, started: float = 0.0) -> None:
        self.correlation_id = correlation_id
        self.started = started
        """When the request was read (the caller's clock; the request latency metric)."""
        self.probe = probe
        """The proxy's own request (:meth:`ResponseOrderer.probe`): its answer goes to
        ``on_response`` only, never to the client."""
        self.api_key = api_key
        self.api_version = api_version
        self.data: Payload | None = None
        self.sent = False
        """Its request (or the proxy's rewrite of it) has been written to the broker."""
        self.on_response: ResponseFilter | None = None
        """For a request the proxy rewrote before forwarding: what to do with its answer."""
        self.on_abandon: Callable[[], None] | None = None
        """Called if the connection ends before the answer comes."""


class HeldBytes:
    """Bytes of responses held by every connection's orderer together, against a limit."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int = 1 << 62) -> None:
        self.limit = limit
        self.used = 0


class ResponseOrderer:
    def __init__(self, shared: HeldBytes | None = None) -> None:
        self.shared = shared if shared is not None else HeldBytes()
        """Held bytes of every connection together."""
        self._slots: deque[Slot] = deque()
        self._upstream: deque[Slot] = deque()
        """Slots waiting for the upstream broker, oldest first (a subsequence of _slots)."""
        self.held_bytes = 0
        """Bytes of responses filled but not yet released (waiting behind an earlier slot)."""

    def __len__(self) -> int:
        """Requests whose responses have not been released to the client yet."""
        return len(self._slots)

    @property
    def awaiting_upstream(self) -> int:
        return len(self._upstream)

    def reserve(self, correlation_id: int, api_key: int, api_version: int,
                started: float = 0.0) -> Slot:
        """Reserve the next slot in request order; it is filled by :meth:`fill` (a local
        answer) or, once :meth:`sent_upstream` says so, by the broker's response.
        ``started``: when the request was read, kept on the slot."""
        slot = Slot(correlation_id, api_key, api_version, started=started)
        self._slots.append(slot)
        return slot

    def sent_upstream(self, slot: Slot) -> None:
        """``slot``'s request has just been written to the broker: its response comes after
        those of the requests written before it."""
        slot.sent = True
        self._upstream.append(slot)

    def probe(self, correlation_id: int, api_key: int, api_version: int,
              on_response: ResponseFilter, on_abandon: Callable[[], None]) -> Slot:
        """A probe just written to the broker: it waits in wire order with the client's
        requests, takes no place in the client's queue, and its answer is handed to
        ``on_response`` by the response pump (``on_abandon`` if the connection ends first)."""
        slot = Slot(correlation_id, api_key, api_version, probe=True)
        slot.on_response = on_response
        slot.on_abandon = on_abandon
        slot.sent = True
        self._upstream.append(slot)
        return slot

    @property
    def probe_next(self) -> bool:
        """The next response from the broker answers a probe (it is never held for the
        client, so reading it is always allowed)."""
        return bool(self._upstream) and self._upstream[0].probe

    def expect_upstream(self, correlation_id: int, api_key: int, api_version: int) -> Slot:
        """Reserve a slot for a request forwarded right away."""
        slot = self.reserve(correlation_id, api_key, api_version)
        self.sent_upstream(slot)
        return slot

    @property
    def answering_head(self) -> bool:
        """The oldest unreleased slot is an answer the proxy is still preparing (not sent
        to the broker, not filled): every broker response read now would be held."""
        if not self._slots:
            return False
        head = self._slots[0]
        return head.data is None and not head.sent

    def upstream_response(self, correlation_id: int) -> Slot:
        """Return the slot an upstream response with ``correlation_id`` belongs to.

        Brokers answer in order, so it must be the oldest slot still waiting upstream.
        """
        if not self._upstream:
            raise OrderingError(f"response with correlation id {correlation_id} "
                                "but no request is outstanding")
        slot = self._upstream[0]
        if slot.correlation_id != correlation_id:
            raise OrderingError(f"response with correlation id {correlation_id}, "
                                f"expected {slot.correlation_id}")
        self._upstream.popleft()
        if not slot.probe:  # a probe's waiter is told by on_response
            slot.on_abandon = None  # its answer has come
        return slot

    def is_next(self, slot: Slot) -> bool:
        """Whether ``slot`` is the oldest unreleased one (its response may go out now)."""
        return bool(self._slots) and self._slots[0] is slot

    def release_next(self, slot: Slot) -> None:
        """Drop the head slot whose response the caller sent itself (cut-through)."""
        if not self.is_next(slot):
            raise OrderingError(f"slot {slot.correlation_id} is not next in order")
        self._slots.popleft()

    def push_back(self, slot: Slot) -> None:
        """Undo :meth:`upstream_response` for a slot whose frame is read later."""
        self._upstream.appendleft(slot)

    def fill(self, slot: Slot, data: Payload) -> None:
        slot.data = data
        self.held_bytes += len(data)
        self.shared.used += len(data)

    def abandon(self) -> None:
        """The connection ended: tell the slots still waiting for the broker (probes
        included)."""
        slots, self._slots, upstream, self._upstream = (self._slots, deque(), self._upstream,
                                                        deque())
        self.shared.used -= self.held_bytes
        self.held_bytes = 0
        for slot in (*slots, *(s for s in upstream if s.probe)):
            if slot.on_abandon is not None:
                on_abandon, slot.on_abandon = slot.on_abandon, None
                on_abandon()

    def take_ready(self, released: list[Slot] | None = None) -> list[Payload]:
        """Pop and return the responses at the head of the queue that are ready, in order;
        their slots are appended to ``released`` if given."""
        ready: list[Payload] = []
        slots = self._slots
        while slots and slots[0].data is not None:
            slot = slots.popleft()
            data = slot.data
            assert data is not None
            ready.append(data)
            self.held_bytes -= len(data)
            self.shared.used -= len(data)
            slot.data = None
            if released is not None:
                released.append(slot)
        return ready
