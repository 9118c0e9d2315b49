"""Where the proxy tells clients to find each broker.

A rewriter calls :meth:`AddressMap.lookup` for every broker endpoint it sees in a response, with
the broker's node id and its real (upstream) host and port, and writes the returned proxy
endpoint in its place. The proxy's implementation opens a listener for a node id it has not seen
yet and remembers the upstream address, so Metadata responses are also how it learns brokers.
:class:`DictAddressMap` is the plain in-memory version used by tests and static configurations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol


class AddressMap(Protocol):
    def lookup(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        """Proxy endpoint to advertise for broker ``node_id`` (upstream ``host:port``)."""
        ...


class DictAddressMap:
    """``node_id -> (host, port)``; unseen nodes go through ``allocate`` when given.

    Without ``allocate`` an unseen node raises :class:`KeyError`, so a test notices a broker it did
    not expect. ``upstream`` records the real address of every node looked up.
    """

    def __init__(self, mapping: Mapping[int, tuple[str, int]] | None = None,
                 allocate: Callable[[int, str, int], tuple[str, int]] | None = None) -> None:
        self.mapping: dict[int, tuple[str, int]] = dict(mapping or {})
        self.allocate = allocate
        self.upstream: dict[int, tuple[str, int]] = {}

    def lookup(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        self.upstream[node_id] = (host, port)
        addr = self.mapping.get(node_id)
        if addr is None:
            if self.allocate is None:
                raise KeyError(node_id)
            addr = self.mapping[node_id] = self.allocate(node_id, host, port)
        return addr


class RecordingMap:
    """Leaves every address as it is and records what it saw (for :func:`brokers_in`)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, int]] = []

    def lookup(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        self.seen.append((node_id, host, port))
        return host, port
