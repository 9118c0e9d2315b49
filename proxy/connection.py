"""One client connection: read request frames, forward them, return responses in order.

Theory of operation. Each accepted client connection gets its own upstream connection to one
broker (the bootstrap listener picks the first reachable bootstrap server, a broker listener
its broker), so correlation ids pass through unchanged and SASL exchanges stay on one socket.
Two tasks run per connection:

* ``_pump_requests`` reads client bytes, cuts them into frames (hard maximum size), peeks each
  request header and asks the :class:`Router` what to do: forward (the common case: the frame's
  bytes are sent upstream as they are, contiguous frames in one write), examine, or reject
  (close the connection with one log line). An examined request is decided on its whole,
  decoded frame (:meth:`Router.decide`): forwarded as it is, forwarded rewritten (its response
  then passes through the decision's filter), or answered by the proxy (:class:`Local`).
  Forwarded requests reserve a slot in the :class:`~proxy.orderer.ResponseOrderer`, except
  Produce with ``acks=0``, which gets no response. When ``max-in-flight`` slots are taken
  the task stops reading: the client's TCP window fills and it slows down, instead of the
  proxy buffering without bound.
* ``_pump_responses`` reads upstream frames, hands each to the slot of the oldest outstanding
  request (brokers answer in order), rewrites the few responses that carry broker addresses or
  API versions, and releases the ready prefix of slots to the client.

Order. Kafka handles the requests of one connection one after the other, and clients rely on
it (pipelined asynchronous offset commits must land in the order they were sent). The proxy
keeps that order for everything it examines: an examined request is decided only after every
earlier answer the proxy gives on this connection is complete, and whatever it sends upstream
on the client's behalf goes on this connection's own upstream socket, in request order. Frames
that are only forwarded are not held back by an answer in progress.

Probes. To authorize what it answers itself as the client would be authorized, the proxy asks
the broker on the client's own connection (:mod:`proxy.security.rights`): :meth:`Connection.probe`
writes a request of the proxy's own (correlation ids of its own, counting down from -1) and
returns the broker's answer. The orderer keeps it in wire order with the client's requests but
out of the client's queue, so the client never sees it. Probes are sent only where no answer of
the proxy is being prepared at the head of the queue (a router's :class:`Prepare`, or an answer
that holds the requests after it), and a probe's answer is always read even while responses
are held, so waiting for one cannot block the pump that brings it.

Frames that need no change are never copied into new objects: they are forwarded as slices of
the buffer they arrived in. A large response that needs no change and is next in line is
streamed through as it arrives (cut-through) rather than stored whole and then sent, which
would double the time a big Fetch response takes to reach the client.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from proxy import metrics
from proxy.budget import ByteBudget
from proxy.codec.errors import CodecError
from proxy.frames import FrameError, FrameSplitter, encode_frame
from proxy.orderer import HeldBytes, OrderingError, ResponseFilter, ResponseOrderer, Slot
from proxy.security.tlsstream import TlsStream
from proxy.splice import AVAILABLE as SPLICE_AVAILABLE
from proxy.splice import Pipe, SinkFailed, stream_frame
from proxy.upstream import reset_on_close

log = logging.getLogger("groupgate.connection")

RECEIVE_BYTES = 64 * 1024
HOLD_POLL_SECONDS = 0.02
"""How often a connection that stopped reading its broker (too many bytes held) looks again."""
LARGE_FRAME_BYTES = 128 * 1024
"""Frames at least this big are received into one buffer of their own size, or, for
responses that pass unchanged, streamed through as they arrive."""
CLASSIFY_PREFIX_BYTES = 1024
"""How much of a large request is read before it is classified and streamed upstream."""
_HEADER = struct.Struct(">hhi")
_CORRELATION = struct.Struct(">i")
TLS_HANDSHAKE = 0x16
"""First byte of a TLS record (a ClientHello); as a frame length prefix it would mean >= 352
MiB. A listener without TLS refuses such a connection with a log line; a listener with TLS
terminates it before the connection starts (:mod:`proxy.server`)."""

Payload = bytes | bytearray | memoryview


class ClientSendFailed(trio.BrokenResourceError):
    """Sending to the client failed (it reset or went away): the client's end failed, not
    the broker's, though the response side noticed (pod-local liveness tells a client's
    close from one the proxy made, :func:`proxy.coordination.pod_liveness.closed_by_client`).
    The error is the cause."""


class ProbeFailed(Exception):
    """The connection ended, or the broker did not answer, before a probe's answer came."""


class ListenerError(Exception):
    """A broker listener could not be opened for an address a response revealed."""


class RejectRequest(Exception):
    """The request breaks the protocol; the connection is closed with this message."""


class IncompleteHeader(Exception):
    """The part of a large request read so far ends before the fields the router needs."""


@dataclass(slots=True)
class RequestInfo:
    """The peeked request header plus the frame it came in."""

    api_key: int
    api_version: int
    correlation_id: int
    frame: memoryview
    """The request payload (header and body), without the 4-byte length prefix."""
    complete: bool = True
    """False when ``frame`` is only the first bytes of a large request (cut-through)."""


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Forward ``payload`` (header and body, without the length prefix) instead of the
    client's request; the broker's response to it goes through ``on_response``."""

    payload: Payload
    on_response: ResponseFilter
    on_abandon: Callable[[], None] | None = None
    """Called if the connection closes before the response arrives."""


@dataclass(frozen=True, slots=True)
class Local:
    """The proxy answers the request: with the full response payload (header included), or
    with an awaitable producing it, or producing a :class:`Rewrite` to send upstream then."""

    answer: Payload | Awaitable[Payload | Rewrite]
    holds_later: bool = False
    """The awaitable may produce a :class:`Rewrite`: later requests on the connection, the
    ones only forwarded included, wait for it (their responses would otherwise come before
    its own and be held in memory, and the broker would see them first)."""

@dataclass(frozen=True, slots=True)
class Prepare:
    """The router cannot decide yet: it must first learn something it does not hold (e.g. which
    sidecar coordinates the request's group). The connection awaits ``decision``, reading
    nothing more from its client meanwhile (so the request's frame stays valid and the bytes it
    holds stay bounded as for any request being decided), and acts on what it returns."""

    decision: Awaitable[int | Rewrite | Local]


Decision = int | Rewrite | Local | Prepare
"""What :meth:`Router.decide` returns: ``FORWARD`` (the frame as it is), a :class:`Rewrite`,
a :class:`Local` answer, or :class:`Prepare` (decided once something is known)."""


class Router(Protocol):
    """Decides, per request and per response, what the connection does with a frame."""

    def classify(self, request: RequestInfo) -> int:
        """Return FORWARD, FORWARD_NO_RESPONSE or EXAMINE from the header alone (``request``
        may be only the first bytes of a large frame); raise RejectRequest to close."""
        ...

    def decide(self, request: RequestInfo) -> Decision:
        """Decide a request classified EXAMINE, given its whole frame, once every earlier
        answer of the proxy on this connection is complete."""
        ...

    def decide_oversized(self, request: RequestInfo) -> int:
        """A request classified EXAMINE is too large to decode (``request.frame`` may be only
        its first bytes): return FORWARD if it may pass untouched, else raise RejectRequest
        saying why."""
        ...

    def response_rewriter(
        self, api_key: int, api_version: int
    ) -> Callable[[memoryview], Payload | None] | None:
        """Return a function rewriting a response payload (None from it: unchanged), or None
        when responses of this API pass untouched."""
        ...


FORWARD = 0
FORWARD_NO_RESPONSE = 1
EXAMINE = 2


class Connection:
    """Serves one accepted client stream against one upstream broker stream."""

    def __init__(
        self,
        client: trio.abc.Stream,
        upstream: trio.abc.Stream,
        router: Router,
        *,
        max_frame_bytes: int,
        max_in_flight: int,
        name: str,
        max_held_response_bytes: int = 16 * 1024 * 1024,
        max_examined_request_bytes: int = 1024 * 1024,
        examined_budget: ByteBudget | None = None,
        held: HeldBytes | None = None,
        examined_read_seconds: float = 30.0,
        splice: bool = True,
        traffic: metrics.Traffic | None = None,
    ) -> None:
        self.client = client
        self.traffic = traffic if traffic is not None else metrics.Traffic()
        """Bytes of frames to and from the client, counted for the listener's metrics; each
        request's latency goes to :func:`proxy.metrics.observe_request` when its response
        leaves."""
        self.splice = splice
        """Relay cut-through frames with ``splice(2)`` where the platform has it."""
        self.upstream = upstream
        self.router = router
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.max_held_response_bytes = max_held_response_bytes
        """Responses the broker has answered but the client cannot have yet (they wait
        behind an earlier request the proxy is still answering) are held up to this many
        bytes; beyond it the proxy stops reading the broker until the client has them."""
        self.max_examined_request_bytes = max_examined_request_bytes
        self.examined_budget = examined_budget
        """Shared by all connections: bytes of large examined requests held at once."""
        self._reserved = 0
        """Bytes of :attr:`examined_budget` held for the examined request being received."""
        self._reserved_deadline = 0.0
        self.examined_read_seconds = examined_read_seconds
        self.name = name
        self.orderer = ResponseOrderer(held)
        self._space = trio.Event()
        self._send_lock = trio.Lock()
        """Held while writing to the client."""
        self._upstream_lock = trio.Lock()
        """Held while writing to the broker and registering what was written with the
        orderer, so that the order of the upstream slots is the order on the wire."""
        self._answering = 0
        """Local answers of this connection still in progress."""
        self._answered = trio.Event()
        self._answered.set()
        self._holding = 0
        """Local answers in progress that later requests, forwarded ones too, wait for."""
        self._held_done = trio.Event()
        self._held_done.set()
        self._draining = False
        self._boundary_wait: trio.CancelScope | None = None
        """The cancel scope of the request pump's wait for a new frame, while it waits."""
        self._progress = trio.Event()
        self._finished = False
        self._reading = True
        """The request pump still runs (it stops at the first frame boundary once draining)."""
        self._nursery: trio.Nursery | None = None
        self.closing_reason: str | None = None
        self._first: bytes | bytearray = b""
        self._pipes: list[Pipe | None] | None = None
        self.bad_input = False
        """Set when the client sent something that broke the protocol."""
        self._probe_id = 0
        """The last correlation id of the proxy's own probes (counting down from -1)."""
        attach = getattr(router, "attach", None)
        if attach is not None:  # the router may ask the broker on this connection
            attach(self.probe)

    @property
    def draining(self) -> bool:
        """The proxy is closing the connection (shutdown): whatever ends it is the proxy's."""
        return self._draining

    async def run(self) -> None:
        """Serve until either side closes, a protocol error occurs, or we are cancelled."""
        try:
            first = await self.client.receive_some(RECEIVE_BYTES)
            if not first:
                return
            if (first[0] == TLS_HANDSHAKE and self.max_frame_bytes < TLS_HANDSHAKE << 24
                    and isinstance(self.client, trio.SocketStream)):
                self.bad_input = True  # counted with the connections closed for bad input
                log.warning("%s: closing connection: the client started TLS, but this listener "
                            "has none (set listener-tls-cert-file and listener-tls-key-file, "
                            "or connect in plaintext)", self.name)
                return
            self._first = first
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._requests_then_close, nursery.cancel_scope)
                nursery.start_soon(self._responses_then_close, nursery.cancel_scope)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.debug("%s: connection failed: %r", self.name, exc)
        finally:
            self._finished = True
            self._progress.set()
            if self.orderer.awaiting_upstream:
                reset_on_close(self.upstream)  # see its docstring
            self.orderer.abandon()
            for pipe in self._pipes or ():
                if pipe is not None:
                    pipe.close()
            with trio.CancelScope(shield=True):
                await self.upstream.aclose()  # a TLS close_notify waits a second at most
                await self.client.aclose()
                closer = getattr(self.router, "aclose", None)  # links the router opened
                if closer is not None:
                    await closer()

    def _pipe(self, direction: int) -> Pipe | None:
        """The splice pipe of one direction (0: requests, 1: responses), opened on first use;
        None when either side is encrypted (TLS bytes are not the frame's bytes)."""
        if self._pipes is None:
            plain = (isinstance(self.client, trio.SocketStream)
                     and isinstance(self.upstream, trio.SocketStream))
            self._pipes = ([Pipe.open(), Pipe.open()] if self.splice and SPLICE_AVAILABLE
                           and plain else [None, None])
            # Pipe.open returns None rather than raising, so no descriptor can leak here.
        return self._pipes[direction]

    async def drain(self, grace: float) -> None:
        """Stop reading requests at the next frame boundary; wait up to ``grace`` seconds for
        the outstanding responses, then close.

        A request in the middle of being received or forwarded is finished first, so the
        broker never sees a truncated frame and the client never a truncated response.
        """
        self._draining = True
        if self._boundary_wait is not None:
            self._boundary_wait.cancel()
        with trio.move_on_after(grace):
            while (self._reading or len(self.orderer)) and not self._finished:
                self._progress = trio.Event()
                await self._progress.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _close(self, reason: str, scope: trio.CancelScope, *, warn: bool) -> None:
        if self.closing_reason is None:
            self.closing_reason = reason
            (log.warning if warn else log.debug)("%s: closing connection: %s", self.name, reason)
        scope.cancel()

    async def _requests_then_close(self, scope: trio.CancelScope) -> None:
        try:
            try:
                await self._pump_requests()
            finally:
                self._reading = False
                self._release_reservation()
                self._progress.set()
            if self._draining:
                return  # the response side and drain() finish the connection
            self._close("client closed the connection", scope, warn=False)
        except (FrameError, RejectRequest) as exc:
            self.bad_input = True
            self._close(f"bad request from client: {exc}", scope, warn=True)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._close(f"client connection failed: {exc!r}", scope, warn=False)
        except OrderingError as exc:
            self._close(f"upstream protocol error: {exc}", scope, warn=True)

    async def _responses_then_close(self, scope: trio.CancelScope) -> None:
        try:
            await self._pump_responses()
            outstanding = self.orderer.awaiting_upstream
            if outstanding:
                self._close(f"upstream broker closed the connection with {outstanding} "
                            "request(s) unanswered (it rejected a request)", scope, warn=True)
            else:
                self._close("upstream broker closed the connection", scope, warn=False)
        except (FrameError, OrderingError, CodecError, ListenerError) as exc:
            self._close(f"bad response from upstream: {exc}", scope, warn=True)
        except ClientSendFailed as exc:  # a killed client's reset, seen when answering it
            self._close(f"client connection failed while answering it: {exc.__cause__!r}",
                        scope, warn=False)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._close(f"connection failed: {exc!r}", scope, warn=False)

    # -- client -> upstream -------------------------------------------------------------------

    async def _pump_requests(self) -> None:
        splitter = FrameSplitter(self.max_frame_bytes, min_frame_bytes=_HEADER.size)
        receive = self.client.receive_some
        router = self.router
        orderer = self.orderer
        data, self._first = self._first, b""
        while True:
            if data:
                blob, spans = splitter.feed(data)
                data = b""
            else:
                at_boundary = splitter.buffered == 0
                if at_boundary and self._draining:
                    return
                with trio.CancelScope() as wait:
                    if at_boundary:
                        self._boundary_wait = wait
                    await self._wait_for_space()
                    if not at_boundary and (splitter.incomplete_frame_size >= LARGE_FRAME_BYTES
                                            and await self._cut_through_request(splitter)):
                        continue
                    if self._reserved:
                        received = await self._receive_reserved(receive, splitter)
                    else:
                        received = await _receive_frames(self.client, receive, splitter)
                self._boundary_wait = None
                if wait.cancelled_caught:
                    return  # draining; nothing of a new frame was consumed
                if received is None:
                    return
                blob, spans = received
            if not spans:
                continue
            read_at = trio.current_time()
            view = memoryview(blob)
            batch: list[Slot] = []
            batch_start = batch_end = -1
            received_bytes = 0
            for start, end in spans:
                received_bytes += end - start + 4
                if len(orderer) >= self.max_in_flight:
                    if batch_start >= 0:
                        await self._send_upstream(view[batch_start:batch_end], batch)
                        batch, batch_start = [], -1
                    await self._wait_for_space()
                api_key, api_version, correlation_id = _HEADER.unpack_from(blob, start)
                request = RequestInfo(api_key, api_version, correlation_id, view[start:end])
                action = router.classify(request)
                if action == EXAMINE and end - start > self.max_examined_request_bytes:
                    action = self._oversized(request, end - start)
                if action != EXAMINE and self._holding:
                    if batch_start >= 0:
                        await self._send_upstream(view[batch_start:batch_end], batch)
                        batch, batch_start = [], -1
                    await self._wait_for_held_answers()
                if action == FORWARD:
                    batch.append(orderer.reserve(correlation_id, api_key, api_version, read_at))
                elif action != FORWARD_NO_RESPONSE:
                    if batch_start >= 0:
                        await self._send_upstream(view[batch_start:batch_end], batch)
                        batch, batch_start = [], -1
                    await self._examine(request, view[start - 4:end], read_at)
                    continue
                if batch_start < 0:
                    batch_start = start - 4
                batch_end = end
            self.traffic.received += received_bytes
            if batch_start >= 0:
                await self._send_upstream(view[batch_start:batch_end], batch)
            if self._reserved:
                self._release_reservation()

    def _oversized(self, request: RequestInfo, size: int) -> int:
        """A request the proxy would decode is over ``max-examined-request-bytes``: forwarded
        untouched if the router allows it, else the connection closes."""
        try:
            action = self.router.decide_oversized(request)
        except RejectRequest as exc:
            raise RejectRequest(
                f"a {size}-byte request (api key {request.api_key}) exceeds "
                f"max-examined-request-bytes ({self.max_examined_request_bytes}) and {exc}"
            ) from None
        log.debug("%s: a %d-byte request (api key %d) over max-examined-request-bytes is "
                  "forwarded untouched", self.name, size, request.api_key)
        return action

    async def _receive_reserved(self, receive: Callable[[int], Awaitable[bytes | bytearray]],
                                splitter: FrameSplitter
                                ) -> tuple[bytes | bytearray, list[tuple[int, int]]] | None:
        """Receive the rest of an examined request that holds part of the shared budget: it
        must arrive within ``examined_read_seconds``, or a client sending slowly on purpose
        could keep the budget from everyone else."""
        size = splitter.incomplete_frame_size  # before the receive takes the frame's tail
        with trio.move_on_at(self._reserved_deadline) as late:
            return await _receive_frames(self.client, receive, splitter)
        assert late.cancelled_caught
        what = f"a {size - 4}-byte group request" if size > 4 else "a group request"
        raise RejectRequest(f"{what} took longer than {self.examined_read_seconds:g}s to arrive")

    def _release_reservation(self) -> None:
        if self.examined_budget is not None and self._reserved:
            self.examined_budget.release(self._reserved)
        self._reserved = 0

    async def _wait_for_space(self) -> None:
        while len(self.orderer) >= self.max_in_flight:
            self._space = trio.Event()
            await self._space.wait()

    async def _examine(self, request: RequestInfo, frame: memoryview, read_at: float) -> None:
        """Decide an examined request (after the proxy's earlier answers on this connection
        are complete, as Kafka would have handled them first) and act on the decision."""
        while self._answering:
            await self._answered.wait()
        decision = self.router.decide(request)
        if isinstance(decision, Prepare):
            decision = await decision.decision
        slot = self.orderer.reserve(request.correlation_id, request.api_key,
                                    request.api_version, read_at)
        if isinstance(decision, Local):
            answer = decision.answer
            if isinstance(answer, bytes | bytearray | memoryview):
                self.orderer.fill(slot, encode_frame(answer))
                await self._flush()
                return
            assert self._nursery is not None
            self._answering += 1
            self._answered = trio.Event()
            if decision.holds_later:
                self._holding += 1
                self._held_done = trio.Event()
            self._nursery.start_soon(self._answer_later, slot, answer, decision.holds_later)
        elif isinstance(decision, Rewrite):
            await self._send_rewritten(slot, decision)
        else:
            await self._send_upstream(frame, [slot])

    async def _wait_for_held_answers(self) -> None:
        while self._holding:
            await self._held_done.wait()

    async def _answer_later(self, slot: Slot, answer: Awaitable[Payload | Rewrite],
                            holds_later: bool = False) -> None:
        try:
            result = await answer
            if isinstance(result, Rewrite):
                await self._send_rewritten(slot, result)
            else:
                self.orderer.fill(slot, encode_frame(result))
                await self._flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            # the client went away while its answer was being made: an ordinary close
            assert self._nursery is not None
            self._close(f"client connection failed: {exc!r}", self._nursery.cancel_scope,
                        warn=False)
        finally:
            self._answering -= 1
            if not self._answering:
                self._answered.set()
            if holds_later:
                self._holding -= 1
                if not self._holding:
                    self._held_done.set()

    async def _send_rewritten(self, slot: Slot, rewrite: Rewrite) -> None:
        slot.on_response = rewrite.on_response
        slot.on_abandon = rewrite.on_abandon
        await self._send_upstream(encode_frame(rewrite.payload), [slot])

    async def _send_upstream(self, data: Payload, slots: list[Slot]) -> None:
        """Write requests to the broker; their slots now wait for its responses, in order."""
        lock = self._upstream_lock
        try:
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            for slot in slots:
                self.orderer.sent_upstream(slot)
            await self.upstream.send_all(data)
        finally:
            lock.release()

    async def probe(self, api_key: int, api_version: int, encode: Callable[[int], Payload],
                    timeout: float) -> bytes:
        """Send the proxy's own request (``encode(correlation_id)``: header and body, without
        the length prefix) on this connection's broker socket and return the broker's answer
        payload; the client never sees it. Raises :class:`ProbeFailed` when the connection
        ends first or no answer comes within ``timeout`` (the late answer is still read and
        dropped, so the connection's order holds)."""
        self._probe_id = self._probe_id - 1 if self._probe_id > -(1 << 31) else -1
        correlation_id = self._probe_id
        answer: list[bytes] = []
        done = trio.Event()

        def on_response(payload: memoryview) -> None:
            answer.append(bytes(payload))
            done.set()

        data = encode_frame(encode(correlation_id))
        async with self._upstream_lock:
            self.orderer.probe(correlation_id, api_key, api_version, on_response, done.set)
            await self.upstream.send_all(data)
        with trio.move_on_after(timeout):
            await done.wait()
        if not answer:
            raise ProbeFailed(f"no answer to the proxy's api key {api_key} on {self.name}")
        return answer[0]

    # -- upstream -> client -------------------------------------------------------------------

    async def _pump_responses(self) -> None:
        splitter = FrameSplitter(self.max_frame_bytes, min_frame_bytes=_CORRELATION.size)
        receive = self.upstream.receive_some
        orderer = self.orderer
        router = self.router
        while True:
            await self._wait_to_hold(splitter.incomplete_frame_size)
            if (splitter.incomplete_frame_size >= LARGE_FRAME_BYTES
                    and await self._cut_through(splitter)):
                continue
            received = await _receive_frames(self.upstream, receive, splitter)
            if received is None:
                return
            blob, spans = received
            if not spans:
                continue
            view = memoryview(blob)
            for start, end in spans:
                (correlation_id,) = _CORRELATION.unpack_from(blob, start)
                slot = orderer.upstream_response(correlation_id)
                if slot.probe:  # the proxy's own request: its answer is the proxy's
                    assert slot.on_response is not None
                    slot.on_response(view[start:end])
                    continue
                rewrite = slot.on_response or router.response_rewriter(slot.api_key,
                                                                       slot.api_version)
                if rewrite is None:
                    orderer.fill(slot, view[start - 4:end])
                else:
                    new_payload = rewrite(view[start:end])
                    if new_payload is None:
                        orderer.fill(slot, view[start - 4:end])
                    else:
                        orderer.fill(slot, encode_frame(new_payload))
            await self._flush()

    async def _wait_to_hold(self, coming: int) -> None:
        """While the proxy is still preparing the answer at the head of the queue, every
        response read from the broker is held in memory: stop reading the broker (what it
        sends waits in its socket, TCP flow control) while that would take this connection
        past ``max-held-response-bytes`` or all connections past theirs together. The head's
        answer comes without the broker (or, rewritten, is sent upstream, which ends the
        wait), so waiting cannot block it."""
        orderer = self.orderer
        shared = orderer.shared
        while orderer.answering_head and not orderer.probe_next and (
                orderer.held_bytes + coming > self.max_held_response_bytes
                or shared.used + coming > shared.limit):
            await trio.sleep(HOLD_POLL_SECONDS)

    async def _cut_through(self, splitter: FrameSplitter) -> bool:
        """Stream a large response to the client while it arrives, if nothing stands in the way.

        A response that needs no rewriting and is next in line goes out chunk by chunk instead
        of being stored whole first: the client starts receiving while the broker still
        sends, as it would without the proxy. Returns False (nothing consumed) otherwise.
        """
        prefix = splitter.peek_incomplete(8)
        if len(prefix) < 8:
            return False
        (correlation_id,) = _CORRELATION.unpack_from(prefix, 4)
        orderer = self.orderer
        slot = orderer.upstream_response(correlation_id)
        if (not orderer.is_next(slot) or slot.on_response is not None
                or self.router.response_rewriter(slot.api_key, slot.api_version) is not None):
            orderer.push_back(slot)
            return False
        size = splitter.incomplete_frame_size
        async with self._send_lock:
            try:
                await stream_frame(splitter, self.upstream, self.client, self._pipe(1))
            except SinkFailed as exc:
                raise ClientSendFailed(str(exc)) from exc.__cause__
            orderer.release_next(slot)
        self.traffic.sent += size
        metrics.observe_request(slot.api_key, trio.current_time() - slot.started)
        self._after_release()
        return True

    async def _cut_through_request(self, splitter: FrameSplitter) -> bool:
        """Stream a large request upstream while it arrives (the requests' cut-through).

        The header, and for Produce the ``acks``, sit at the start of the frame, so a large
        request is classified from its first bytes. Returns False (nothing consumed) when the
        prefix is too short to classify or the request must be examined whole.
        """
        if splitter.buffered < CLASSIFY_PREFIX_BYTES:
            return False
        prefix = splitter.peek_incomplete(CLASSIFY_PREFIX_BYTES)
        api_key, api_version, correlation_id = _HEADER.unpack_from(prefix, 4)
        request = RequestInfo(api_key, api_version, correlation_id, memoryview(prefix)[4:],
                              complete=False)
        try:
            action = self.router.classify(request)
        except IncompleteHeader:
            return False  # decide on the whole frame
        if action == EXAMINE:
            size = splitter.incomplete_frame_size - 4
            if size <= self.max_examined_request_bytes:
                # read whole and decoded: bounded by the budget of all connections too
                if self.examined_budget is not None and not self._reserved:
                    self._reserved = await self.examined_budget.acquire(size)
                    self._reserved_deadline = trio.current_time() + self.examined_read_seconds
                return False
            action = self._oversized(request, size)
        read_at = trio.current_time()
        if self._holding:
            await self._wait_for_held_answers()
        slots = ([self.orderer.reserve(correlation_id, api_key, api_version, read_at)]
                 if action == FORWARD else [])
        size = splitter.incomplete_frame_size
        async with self._upstream_lock:
            for slot in slots:
                self.orderer.sent_upstream(slot)
            await stream_frame(splitter, self.client, self.upstream, self._pipe(0))
        self.traffic.received += size
        return True

    async def _flush(self) -> None:
        """Send every response that is ready, in request order."""
        released: list[Slot] = []
        async with self._send_lock:
            ready = self.orderer.take_ready(released)
            if not ready:
                return
            data = ready[0] if len(ready) == 1 else b"".join(ready)
            try:
                await self.client.send_all(data)
            except (trio.BrokenResourceError, OSError) as exc:
                raise ClientSendFailed(f"sending failed: {exc!r}") from exc
        self.traffic.sent += len(data)
        sent_at = trio.current_time()
        observe = metrics.observe_request
        for slot in released:
            observe(slot.api_key, sent_at - slot.started)
        self._after_release()

    def _after_release(self) -> None:
        if len(self.orderer) < self.max_in_flight:
            self._space.set()
        self._progress.set()


async def _receive_frames(
    stream: trio.abc.Stream,
    receive: Callable[[int], Awaitable[bytes | bytearray]],
    splitter: FrameSplitter,
) -> tuple[bytes | bytearray, list[tuple[int, int]]] | None:
    """Receive once and split; None at end of stream.

    When the splitter holds the start of a large frame, the rest of that frame is received
    directly into a buffer of the frame's size (one copy from the kernel, none in Python).
    """
    size = splitter.incomplete_frame_size
    if size >= LARGE_FRAME_BYTES:
        frame = bytearray(size)
        have = splitter.take_incomplete(frame)
        view = memoryview(frame)
        if isinstance(stream, trio.SocketStream):
            recv_into = stream.socket.recv_into
            while have < size:
                n = await recv_into(view[have:])
                if not n:
                    return None
                have += n
        elif isinstance(stream, TlsStream):  # decrypted straight into the frame
            while have < size:
                n = await stream.receive_into(view[have:], size - have)
                if not n:
                    return None
                have += n
        else:
            while have < size:
                chunk = await stream.receive_some(size - have)
                if not chunk:
                    return None
                view[have:have + len(chunk)] = chunk
                have += len(chunk)
        return frame, [(4, size)]
    data = await receive(RECEIVE_BYTES)
    if not data:
        return None
    return splitter.feed(data)
