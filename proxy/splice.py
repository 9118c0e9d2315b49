"""Relaying a large frame while it arrives: through a kernel pipe with ``splice(2)`` on Linux, so
its bytes never enter Python, else through one reused buffer.

:func:`stream_frame` is the cut-through path of :class:`proxy.connection.Connection` (frames
that pass unchanged and are too large to hold whole; docs/decisions/0005-fetch-cut-through.md).
:class:`Pipe` is the per-connection, per-direction kernel pipe; the ``splice`` setting turns it
off (copying instead), as does any platform without ``os.splice``.
"""

from __future__ import annotations

import fcntl
import logging
import os

import trio

from proxy.frames import FrameSplitter
from proxy.security.tlsstream import TlsStream

log = logging.getLogger("groupgate.connection")

CUT_THROUGH_CHUNK = 256 * 1024
TLS_CHUNK = 1024 * 1024
"""From a TLS source: plaintext decrypted and sent on at once (the TLS stream reads up to as
much ciphertext per wait, docs/decisions/0017)."""
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, Linux
F_GETPIPE_SZ = 1032
AVAILABLE = hasattr(os, "splice")


class SinkFailed(trio.BrokenResourceError):
    """Writing to the sink failed (its peer reset or went away), as opposed to reading the
    source: a relay in one direction can tell which end of it failed. The error is the
    cause."""
"""Whether this platform has ``splice(2)``."""


async def stream_frame(splitter: FrameSplitter, source: trio.abc.Stream,
                        sink: trio.abc.Stream, pipe: Pipe | None = None) -> None:
    """Send the splitter's incomplete frame to ``sink`` and relay the rest of it from
    ``source`` as it arrives: through a kernel pipe with ``splice(2)`` when one is given (the
    bytes never enter Python), else through one reused buffer."""
    size = splitter.incomplete_frame_size
    step = TLS_CHUNK if isinstance(source, TlsStream) else CUT_THROUGH_CHUNK
    buffer = bytearray(max(min(step, size), splitter.buffered))
    view = memoryview(buffer)
    have = splitter.take_incomplete(buffer)

    async def send(data: memoryview | bytes | bytearray) -> None:
        try:
            await sink.send_all(data)
        except (trio.BrokenResourceError, OSError) as exc:
            raise SinkFailed(f"sending failed: {exc!r}") from exc

    await send(view[:have])
    remaining = size - have
    if (pipe is not None and isinstance(source, trio.SocketStream)
            and isinstance(sink, trio.SocketStream)):
        await pipe.relay(source.socket, sink.socket, remaining)
        return
    if isinstance(source, TlsStream):  # decrypted into the buffer
        while remaining:
            n = await source.receive_into(view[:min(remaining, len(buffer))], remaining)
            if not n:
                raise trio.BrokenResourceError("peer closed in the middle of a frame")
            await send(view[:n])
            remaining -= n
        return
    if not isinstance(source, trio.SocketStream):
        while remaining:
            chunk = await source.receive_some(min(remaining, len(buffer)))
            if not chunk:
                raise trio.BrokenResourceError("peer closed in the middle of a frame")
            await send(chunk)
            remaining -= len(chunk)
        return
    recv_into = source.socket.recv_into
    while remaining:
        n = await recv_into(view[:min(remaining, len(buffer))])
        if not n:
            raise trio.BrokenResourceError("peer closed in the middle of a frame")
        await send(view[:n])
        remaining -= n


class Pipe:
    """A kernel pipe for ``splice(2)``: socket -> pipe -> socket without user-space copies.

    Linux only; :meth:`open` returns None elsewhere, and callers fall back to copying.
    """

    SIZE = 1 << 20

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd = read_fd
        self.write_fd = write_fd

    @classmethod
    def open(cls) -> Pipe | None:
        """A pipe of ``SIZE`` bytes, or None (copy instead) when it cannot be had."""
        if not hasattr(os, "splice"):
            return None
        try:
            read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            log.debug("no pipe for splice (%s); copying instead", exc)
            return None
        pipe = cls(read_fd, write_fd)
        try:
            fcntl.fcntl(write_fd, F_SETPIPE_SZ, cls.SIZE)
            if fcntl.fcntl(write_fd, F_GETPIPE_SZ) >= cls.SIZE:
                return pipe
        except OSError:
            pass
        pipe.close()  # e.g. the user's pipe-buffer quota is used up: copy instead
        return None

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)

    async def relay(self, source: trio.socket.SocketType, sink: trio.socket.SocketType,
                    count: int) -> None:
        """Move exactly ``count`` bytes from ``source`` to ``sink``.

        Whether the pipe is full is learnt from ``splice`` itself (EAGAIN), not from a byte
        count: a pipe fills by page slots, and small TCP segments use one slot each. When
        nothing moved, the task sleeps on the side that blocked: the sink when bytes wait in
        the pipe and could not be written, else the source.
        """
        flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
        src, dst = source.fileno(), sink.fileno()
        in_pipe = 0
        since_checkpoint = 0
        while count or in_pipe:
            moved_in = moved_out = 0
            if count:
                try:
                    moved_in = os.splice(src, self.write_fd, min(count, self.SIZE), flags=flags)
                except BlockingIOError:  # no data yet, or the pipe is full
                    pass
                else:
                    if moved_in == 0:
                        raise trio.BrokenResourceError("peer closed in the middle of a frame")
                    count -= moved_in
                    in_pipe += moved_in
            if in_pipe:
                try:
                    moved_out = os.splice(self.read_fd, dst, in_pipe, flags=flags)
                except BlockingIOError:  # the sink's buffer is full
                    pass
                except OSError as exc:
                    raise SinkFailed(f"sending failed: {exc!r}") from exc
                else:
                    in_pipe -= moved_out
            if moved_in or moved_out:
                since_checkpoint += moved_in + moved_out
                if since_checkpoint >= self.SIZE:  # stay fair to other connections
                    since_checkpoint = 0
                    await trio.lowlevel.checkpoint()
            elif in_pipe:
                await trio.lowlevel.wait_writable(sink)
            else:
                await trio.lowlevel.wait_readable(source)
