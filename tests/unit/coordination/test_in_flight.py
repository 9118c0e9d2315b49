""":class:`proxy.coordination.in_flight.InFlight`: each request ends once, and a wait for the
drain ends when the last one does, or at its bound."""

from __future__ import annotations

import trio
import trio.testing

from proxy.coordination.in_flight import InFlight


async def test_the_drain_waits_for_the_last_request_and_each_ends_once(
        autojump_clock: trio.testing.MockClock) -> None:
    requests = InFlight()
    assert await requests.drained(1)  # nothing in flight: at once
    first, second = requests.track(), requests.track()
    first()
    first()  # answered, then cancelled: ended once
    assert requests.count == 1
    waited: list[tuple[bool, float]] = []

    async def drain() -> None:
        waited.append((await requests.drained(10), trio.current_time()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drain)
        await trio.sleep(3)
        second()
    assert waited == [(True, 3)]


async def test_the_drain_gives_up_at_its_bound(autojump_clock: trio.testing.MockClock) -> None:
    requests = InFlight()
    release = requests.track()
    assert not await requests.drained(2)
    assert trio.current_time() == 2 and requests.count == 1
    release()
    assert await requests.drained(2) and requests.count == 0
