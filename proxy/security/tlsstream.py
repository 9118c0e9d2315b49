"""TLS over a trio socket stream that reads many records per call and decrypts into the
caller's buffer.

The forwarding path relays large Fetch and Produce frames. Over TLS those bytes cannot be
spliced, and ``trio.SSLStream`` hands them over one TLS record (at most 16 KiB) per
``receive_some``, each a new bytes object and a round through its retry machinery, and each
then written to the other side on its own. :class:`TlsStream` uses the same building blocks
(``ssl.SSLObject`` over two ``ssl.MemoryBIO``) but reads up to 1 MiB of ciphertext from the
socket at once and decrypts every record already received in one call, straight into the
frame buffer when the caller gives one (:meth:`TlsStream.receive_into`); writes are encrypted
in slices of 256 KiB. A caller that knows how many bytes are still coming (the rest of a large
frame) says so, and the stream then waits for the socket to hold many of them
(``SO_RCVLOWAT``) instead of waking at every segment that arrives.
docs/decisions/0017-tls-on-the-forwarding-path.md has the measurements.

One task may receive while another sends (as with every trio stream); encrypted bytes leave
through one lock, in the order the SSL object produced them, whichever task produced them (a
read can produce some: TLS 1.3 key updates). An end of stream without close_notify counts as
an end of stream: Kafka brokers and clients close that way.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from typing import Any, cast

import trio

RAW_RECEIVE = 1024 * 1024
"""Ciphertext read from the socket at once (and the most a wait asks the socket to hold)."""
WRITE_SLICE = 256 * 1024
"""Plaintext encrypted and sent at once."""
DEFAULT_RECEIVE = 64 * 1024
RECORD_MARGIN = 17 * 1024
"""Up to one TLS record of what a caller expects may sit inside the SSL object already (read
from the socket in part), so that much is never counted on arriving from the socket."""
MIN_LOW_WATER = 32 * 1024
"""Below this, waiting for more bytes at once saves little: the task wakes at the first one."""
_SCRATCH = [memoryview(bytearray(RAW_RECEIVE))]
"""Ciphertext from sockets passes through this one buffer (see :meth:`TlsStream._fill`)."""


class TlsStream(trio.abc.Stream):
    """See the module docstring. Call :meth:`do_handshake` before anything else."""

    def __init__(self, transport: trio.abc.Stream, context: ssl.SSLContext, *,
                 server_side: bool = False, server_hostname: str | None = None) -> None:
        self.transport = transport
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_side=server_side,
                                     server_hostname=server_hostname)
        self._send_lock = trio.Lock()
        self._closed = False
        self._socket = transport.socket if isinstance(transport, trio.SocketStream) else None
        self._fd = self._socket.fileno() if self._socket is not None else -1
        self._low_water = 1
        """The socket's SO_RCVLOWAT: how many received bytes make it readable."""

    # -- handshake and peer -----------------------------------------------------------------

    async def do_handshake(self) -> None:
        """Complete the handshake; raises :class:`ssl.SSLError` (the reason) or
        ``trio.BrokenResourceError`` (the peer went away)."""
        while True:
            try:
                self._ssl.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                filled = await self._fill()
                if not filled:
                    raise trio.BrokenResourceError(
                        "the peer closed during the TLS handshake") from None
                continue
            except ssl.SSLError:
                # send our alert, if any, before the caller closes
                with trio.move_on_after(1.0):
                    await self._flush_quietly()
                raise
            await self._flush()
            return

    def getpeercert(self) -> dict[str, Any] | None:
        return cast("dict[str, Any] | None", self._ssl.getpeercert())

    # -- receiving --------------------------------------------------------------------------

    async def _fill(self, expect: int = 0) -> bool:
        """Read ciphertext from the socket into the SSL object; False at the end of stream.

        From a socket the bytes go through one buffer shared by every stream of the process:
        they are read and handed to the SSL object with no pass through the scheduler in
        between, so no other stream can use the buffer meanwhile (and no stream holds 1 MiB
        of its own).

        ``expect``: plaintext bytes the caller knows are still coming. If many are, it waits
        until the socket holds as many ciphertext bytes as surely follow (the expected bytes
        less what the SSL object may hold already; at most :data:`RAW_RECEIVE`) before
        reading, so a large frame moves in a few large steps rather than one per TCP segment;
        the frame's last bytes never wait, since fewer are asked for than come."""
        if self._fd < 0:
            data = await self.transport.receive_some(RAW_RECEIVE)
            if not data:
                self._incoming.write_eof()
                return False
            self._incoming.write(data)
            return True
        waited = False
        if self._set_low_water(expect - self._incoming.pending - RECORD_MARGIN) > 1:
            waited = True  # readable once that much is there (at once if it is already)
            await trio.lowlevel.wait_readable(self._fd)
        while True:
            try:
                n = os.readv(self._fd, _SCRATCH)
            except BlockingIOError:
                waited = True
                await trio.lowlevel.wait_readable(self._fd)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc
            break
        if not n:
            self._incoming.write_eof()
            return False
        self._incoming.write(_SCRATCH[0][:n])
        if not waited:
            await trio.lowlevel.checkpoint()
        return True

    def _set_low_water(self, wanted: int) -> int:
        """Make the socket readable only once it holds ``wanted`` bytes (at most
        :data:`RAW_RECEIVE`; 1 when fewer than :data:`MIN_LOW_WATER`); returns the mark."""
        low_water = min(wanted, RAW_RECEIVE) if wanted >= MIN_LOW_WATER else 1
        if low_water != self._low_water and self._socket is not None:
            try:
                self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, low_water)
            except OSError:
                return self._low_water
            self._low_water = low_water
        return self._low_water

    async def receive_into(self, view: memoryview, expect: int = 0) -> int:
        """Decrypt into ``view``: every byte available without waiting, or, when there is
        none, what the next bytes from the socket give. 0 at the end of stream.

        ``expect``: how many more plaintext bytes the caller knows the peer is sending (the
        rest of a frame; 0: unknown), so that a wait for them wakes on many at once
        (:meth:`_fill`)."""
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        size = len(view)
        total = 0
        waited = False
        while total < size:
            try:
                got = cast(int, self._ssl.read(size - total, view[total:]))
            except ssl.SSLWantReadError:
                if total:
                    break
                waited = True
                await self._fill(expect)
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
            except ssl.SSLError as exc:
                raise trio.BrokenResourceError(f"TLS error: {exc}") from exc
            if not got:
                break
            total += got
        if self._outgoing.pending:
            await self._flush()
        elif not waited:
            await trio.lowlevel.checkpoint()
        return total

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        buffer = bytearray(max_bytes or DEFAULT_RECEIVE)
        got = await self.receive_into(memoryview(buffer))
        if got < len(buffer):
            del buffer[got:]
        return buffer

    # -- sending ----------------------------------------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        view = memoryview(data)
        for start in range(0, len(view), WRITE_SLICE):
            try:
                self._ssl.write(view[start:start + WRITE_SLICE])
            except ssl.SSLError as exc:
                raise trio.BrokenResourceError(f"TLS error: {exc}") from exc
            await self._flush()

    async def _flush(self) -> None:
        lock = self._send_lock
        try:
            lock.acquire_nowait()  # the common case: no extra pass through the scheduler
        except trio.WouldBlock:
            await lock.acquire()
        try:
            pending = self._outgoing.read()
            if pending:
                await self.transport.send_all(pending)
        finally:
            lock.release()

    async def _flush_quietly(self) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self._flush()

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        """Send close_notify (a second at most) and close the socket."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        try:
            with contextlib.suppress(ssl.SSLError):  # the peer's close_notify is not awaited
                self._ssl.unwrap()
            with trio.move_on_after(1.0):
                await self._flush_quietly()
        finally:
            await self.transport.aclose()
