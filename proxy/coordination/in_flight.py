"""Requests at the broker that a step must wait for before it changes the group.

A rejoin the proxy chooses waits for the commits it stamped with the old generation; a
conversion waits for the forwarded requests of the group it converts. Both count each request
while it is at the broker and wait, within a bound, for the count to reach zero.
:meth:`InFlight.track` counts one and returns the callable that ends it: idempotent, so a
request answered and then cancelled is ended once.
"""

from __future__ import annotations

from collections.abc import Callable

import trio


class InFlight:
    def __init__(self) -> None:
        self.count = 0
        self._drained = trio.Event()
        self._drained.set()

    def track(self) -> Callable[[], None]:
        """Count one request; call the result exactly when its answer is back or will never
        come (calling it again does nothing)."""
        self.count += 1
        if self.count == 1:
            self._drained = trio.Event()
        done = False

        def release() -> None:
            nonlocal done
            if done:
                return
            done = True
            self.count -= 1
            if not self.count:
                self._drained.set()

        return release

    async def drained(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for nothing to be in flight; whether that came."""
        with trio.move_on_after(timeout):
            await self._drained.wait()
        return not self.count
