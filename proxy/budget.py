"""A byte budget shared by every client connection.

Requests the proxy decodes (the group APIs it examines) are held whole in memory while they
arrive and while they are decoded, and a decoded request takes several times its wire size.
:class:`ByteBudget` bounds the bytes of such requests across all connections: a connection
reserves a large examined request's size before reading the rest of it, and a request that
does not fit waits (its client is not read meanwhile, so TCP flow control slows it) until
others have been handled. Small requests, read in one receive anyway, need no reservation.
"""

from __future__ import annotations

import trio


class ByteBudget:
    def __init__(self, total: int) -> None:
        if total <= 0:
            raise ValueError("a byte budget must be positive")
        self.total = total
        self.used = 0
        self._changed = trio.Event()

    async def acquire(self, size: int) -> int:
        """Reserve ``size`` bytes (at most the whole budget), waiting until they fit; returns
        what was reserved, to be given back with :meth:`release`."""
        size = min(size, self.total)
        while self.used + size > self.total:
            await self._changed.wait()
        self.used += size
        return size

    def release(self, size: int) -> None:
        self.used -= size
        self._changed.set()
        self._changed = trio.Event()
