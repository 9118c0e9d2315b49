"""Held here, on the fleet listener's list: a relayed request is decided here or refused.

Another sidecar relays a request here because it saw this sidecar hold its groups. A request
is never relayed again: if any of its groups is not held (or being taken over) here, it is
answered NOT_COORDINATOR, and the relaying sidecar looks the group up again.
"""

from __future__ import annotations

from proxy.connection import Decision, Local
from proxy.coordination.stages.stage import Passage, Stage
from translation.errors import ErrorCode

NOT_COORDINATOR = int(ErrorCode.NOT_COORDINATOR)


class HeldHere(Stage):
    """Refuses a relayed request whose groups this sidecar does not hold."""

    __slots__ = ()

    def request(self, passage: Passage) -> Decision | None:
        claims = passage.chain.claims
        if not all(claims(g) for g in passage.groups()):
            handler, request = passage.handler, passage.request
            return Local(passage.chain.encode(handler, request, handler.failure(
                request, NOT_COORDINATOR)))
        return None
