"""Cuts a byte stream into Kafka frames (4-byte big-endian length, then payload).

The splitter is sans-I/O and built for the forwarding hot path: :meth:`FrameSplitter.feed`
takes the bytes one ``receive`` returned and gives back a buffer plus the ``(start, end)``
offsets of every complete payload in it, so the caller can forward frames as slices of that
buffer without copying them. Only an incomplete tail is kept, as a list of chunks joined once
the frame it belongs to is complete. For a large frame the caller does better still: it asks
:attr:`FrameSplitter.incomplete_frame_size`, allocates the frame once, moves the tail in with
:meth:`FrameSplitter.take_incomplete` and receives the rest directly into that buffer.
"""

from __future__ import annotations

import struct

_LENGTH = struct.Struct(">i")


class FrameError(Exception):
    """The stream does not carry valid frames; the connection must be closed."""


class FrameTooLarge(FrameError):
    pass


class FrameTooSmall(FrameError):
    pass


class FrameSplitter:
    def __init__(self, max_frame_bytes: int, *, min_frame_bytes: int = 0) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.min_frame_bytes = min_frame_bytes
        self._chunks: list[bytes | bytearray] = []
        self._buffered = 0
        self._needed = 4
        """Bytes the buffered tail must reach before scanning it is worth it."""

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return self._buffered

    @property
    def incomplete_frame_size(self) -> int:
        """Size, prefix included, of the frame the buffered tail begins; 0 while unknown."""
        return self._needed if self._chunks and self._needed > 4 else 0

    def peek_incomplete(self, n: int) -> bytes:
        """Up to ``n`` first bytes of the buffered tail (the prefix of the incomplete frame)."""
        if not self._chunks:
            return b""
        first = self._chunks[0]
        return bytes(first[:n]) if len(first) >= n else b"".join(self._chunks)[:n]

    def take_incomplete(self, into: bytearray) -> int:
        """Move the buffered tail to the start of ``into``; return how many bytes it was.

        For large frames the caller allocates the whole frame once, takes the tail, and
        receives the rest straight into the same buffer.
        """
        pos = 0
        for chunk in self._chunks:
            into[pos:pos + len(chunk)] = chunk
            pos += len(chunk)
        self._chunks.clear()
        self._buffered = 0
        self._needed = 4
        return pos

    def feed(self, data: bytes | bytearray) -> tuple[bytes | bytearray, list[tuple[int, int]]]:
        """Add received bytes; return a buffer and the payload spans complete in it.

        Raises :class:`FrameError` on a length below ``min_frame_bytes`` (negative included)
        or above ``max_frame_bytes``; the stream cannot be resynchronised after that.
        """
        if self._chunks:
            self._chunks.append(data)
            self._buffered += len(data)
            if self._buffered < self._needed:
                return b"", []
            blob: bytes | bytearray = b"".join(self._chunks)
            self._chunks.clear()
            self._buffered = 0
        else:
            blob = data
        spans: list[tuple[int, int]] = []
        pos = 0
        size = len(blob)
        unpack = _LENGTH.unpack_from
        while size - pos >= 4:
            (length,) = unpack(blob, pos)
            if length > self.max_frame_bytes:
                raise FrameTooLarge(f"frame of {length} bytes exceeds the maximum of "
                                    f"{self.max_frame_bytes}")
            if length < self.min_frame_bytes:
                raise FrameTooSmall(f"frame length {length} is below the minimum of "
                                    f"{self.min_frame_bytes}")
            end = pos + 4 + length
            if end > size:
                self._needed = end - pos
                break
            spans.append((pos + 4, end))
            pos = end
        else:
            self._needed = 4
        if pos < size:
            tail = blob[pos:]
            self._chunks.append(tail)
            self._buffered = len(tail)
        return blob, spans


def encode_frame(payload: bytes | bytearray | memoryview) -> bytes:
    """The 4-byte length prefix plus ``payload``."""
    return _LENGTH.pack(len(payload)) + bytes(payload)
