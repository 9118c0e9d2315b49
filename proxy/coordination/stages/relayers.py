"""Relayers noted, first on the fleet listener's list: which sidecars relay a group's requests.

A request relayed here with a protocol-3 relay mark names the relaying sidecar's fleet address
(:func:`~..fleet.mark_forwarded`); one with an older mark is noted as ``0.2.0@<host>``
(:attr:`~..handler.GroupRequest.relayed_by`, set by the relayed decoder). The holder keeps them
for a member session (:class:`~..release_fleet.Relayers`): a hand-back of the group tells each
of them first (:mod:`..release_fleet`). Every request goes on.
"""

from __future__ import annotations

from proxy.connection import Decision
from proxy.coordination.stages.stage import Passage, Stage


class NoteRelayers(Stage):
    """Notes who relayed a request for its groups; decides nothing."""

    __slots__ = ()

    def request(self, passage: Passage) -> Decision | None:
        relayed_by = passage.request.relayed_by
        if relayed_by is not None:
            passage.chain.service.relayers.note(passage.groups(), relayed_by)
        return None
