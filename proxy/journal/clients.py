"""Which client software each client runs, from its ApiVersions request (KIP-511).

Since ApiVersions v3 a client names its software and version (``apache-kafka-java`` /
``3.9.1``, ``librdkafka`` / ``2.16.1``, ``kafka-python`` / ``3.0.12``) in the first request of
every connection. The engine knows a member by client id and host only, so the proxy notes
the pair per ``(client host, client id)`` when an ApiVersions request passes
(:func:`client_software` reads it from the frame) and the journal's observer looks it up
(:meth:`ClientSoftwareDirectory.lookup`, a
:data:`~proxy.journal.observer.SoftwareLookup`). Clients on one host with one client id are
taken to run the same software. The directory is a bounded map with expiry (decision record
0008): at most ``max_entries`` pairs, each forgotten ``ttl_s`` after it was last noted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cachetools import TTLCache

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.errors import CodecError
from proxy.codec.header import parse_request_header

MAX_TEXT = 256
"""Longer names and versions are cut (a client controls them)."""


def client_software(frame: memoryview | bytes, api_version: int
                    ) -> tuple[str, str, str] | None:
    """``(client id, software name, software version)`` from an ApiVersions request frame
    (header and body, no length prefix), or None before v3, when the client sent none, or
    when the frame does not decode."""
    if api_version < 3:
        return None
    try:
        header = parse_request_header(frame)
        value, _ = messages.decode_request(ApiKey.API_VERSIONS, api_version, frame,
                                           header.header_length)
    except (CodecError, ValueError, IndexError):
        return None
    name = value.get("client_software_name") or ""
    version = value.get("client_software_version") or ""
    if not name:
        return None
    return (header.client_id or "")[:MAX_TEXT], name[:MAX_TEXT], version[:MAX_TEXT]


class ClientSoftwareDirectory:
    """``(client host, client id) -> (software name, version)``, bounded and expiring."""

    def __init__(self, *, max_entries: int = 10_000, ttl_s: float = 86_400.0,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self._entries: TTLCache[tuple[str, str], tuple[str, str]] = TTLCache(
            maxsize=max_entries, ttl=ttl_s, timer=timer)

    def note(self, client_host: str, client_id: str, name: str, version: str) -> None:
        self._entries[(client_host, client_id)] = (name, version)

    def note_request(self, client_host: str, frame: memoryview | bytes,
                     api_version: int) -> None:
        """Note what an ApiVersions request (``frame``: header and body) says, if anything."""
        found = client_software(frame, api_version)
        if found is not None:
            client_id, name, version = found
            self.note(client_host, client_id, name, version)

    def lookup(self, client_host: str, client_id: str) -> tuple[str, str] | None:
        return self._entries.get((client_host, client_id))

    def __len__(self) -> int:
        return len(self._entries)
