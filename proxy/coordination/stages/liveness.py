"""Pod-local liveness, first on the client-facing list: the connection's group requests are told.

A sidecar that sees an application's group connection close can tell the group's coordinator
that its member is gone (:mod:`..pod_liveness`). This stage tells the connection's watch each
decoded group request (the members it names, joins, leaves) before anything decides it; a
request decided again after a lookup or after the client's rights were asked is not told twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.connection import Decision
from proxy.coordination.stages.stage import Passage, Stage

if TYPE_CHECKING:
    from proxy.coordination.pod_liveness import ConnectionWatch


class PodLiveness(Stage):
    """Tells the connection's :class:`~..pod_liveness.ConnectionWatch` its group requests."""

    __slots__ = ("watch",)

    def __init__(self, watch: ConnectionWatch) -> None:
        self.watch = watch

    def request(self, passage: Passage) -> Decision | None:
        if passage.route is None and not passage.authorized:
            self.watch.group_request(passage.request)
        return None
