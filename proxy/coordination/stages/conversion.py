"""Conversion holds, on the client-facing list: a group being moved to the engine waits.

While a classic group at the broker is converted to the engine (the online upgrade,
:mod:`..upgrade`), its members' requests must not reach either coordinator: they wait here for
the conversion's end, at most :data:`~..upgrade.HOLD_SECONDS` (by then the group's takeover is
registered and they wait for it in the service), and are decided again from decoding.
"""

from __future__ import annotations

import trio

from proxy.connection import Decision, Local, Prepare, RequestInfo, Rewrite
from proxy.coordination import upgrade
from proxy.coordination.handler import ApiHandler
from proxy.coordination.stages.stage import Chain, Passage, Stage, settled


class ConversionHold(Stage):
    """Holds the requests of a group being converted (:meth:`~..upgrade.Upgrades.holding`)."""

    __slots__ = ()

    def request(self, passage: Passage) -> Decision | None:
        upgrades = passage.chain.service.upgrades
        if upgrades.converting and (hold := upgrades.holding(passage.groups())) is not None:
            # the group is being moved to the engine: decided once it is
            return Prepare(_after_hold(passage.chain, passage.handler, passage.info, hold))
        return None


async def _after_hold(chain: Chain, handler: ApiHandler, info: RequestInfo, hold: trio.Event
                      ) -> int | Rewrite | Local:
    with trio.move_on_after(upgrade.HOLD_SECONDS):
        await hold.wait()
    return await settled(chain.decide(handler, info))
