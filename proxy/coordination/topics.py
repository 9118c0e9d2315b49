"""Keeps the engine's topic metadata fresh: the broker's topic ids, names and partition counts.

The engine identifies topics by the broker's own topic ids (Metadata v10+), so clients that
resolve an assigned topic id through the proxy get the broker's name for it.
:class:`TopicWatcher` asks a broker for the topics the coordinated groups subscribe to (every
topic when some group subscribes by regex, so that new matching topics are found) every
``group-metadata-refresh-ms``, and at once when :meth:`TopicWatcher.refresh` is awaited (a
heartbeat named a topic the image does not know). Each result is a complete
:class:`~translation.topics.TopicsImage`, handed to a callback that feeds it to the engine,
which bumps the epoch of every group whose subscribed topics changed (partitions added, topic
created, deleted or recreated under a new id).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import trio

from proxy.codec.api_keys import ApiKey
from proxy.kafka_client.links import Address, LinkPool
from proxy.kafka_client.metadata import METADATA_VERSION, ZERO_UUID, metadata_request
from proxy.upstream import UpstreamError
from translation.topics import TopicMetadata, TopicsImage

log = logging.getLogger("groupgate.coordination")

Wanted = Callable[[], tuple[frozenset[str], bool]]
"""Returns (topic names subscribed by name, whether some group subscribes by regex)."""


def image_from_metadata(response: dict[str, Any]) -> TopicsImage:
    """The topics of a Metadata response (v10+) as an image; internal and failed topics are
    left out."""
    topics = []
    for t in response["topics"]:
        if t["error_code"] != 0 or t["is_internal"] or t["name"] is None:
            continue
        topic_id = t["topic_id"]
        if topic_id == ZERO_UUID:
            continue
        topics.append(TopicMetadata(topic_id, t["name"], len(t["partitions"])))
    return TopicsImage.of(topics)


class TopicWatcher:
    """Periodic and on-demand Metadata refreshes for the coordinated groups' topics."""

    def __init__(self, pool: LinkPool, bootstrap: Sequence[Address], refresh_seconds: float,
                 wanted: Wanted, on_image: Callable[[TopicsImage], None]) -> None:
        self._pool = pool
        self._bootstrap = tuple(bootstrap)
        self._refresh_seconds = refresh_seconds
        self._wanted = wanted
        self._on_image = on_image
        self._wake = trio.Event()
        self._done = trio.Event()
        self.refreshes = 0

    async def refresh(self, timeout: float) -> None:
        """Ask for a refresh now and wait (at most ``timeout`` seconds) until one finished."""
        done = self._done
        self._wake.set()
        with trio.move_on_after(timeout):
            await done.wait()

    async def run(self) -> None:
        while True:
            with trio.move_on_after(self._refresh_seconds):
                await self._wake.wait()
            self._wake = trio.Event()
            done, self._done = self._done, trio.Event()
            try:
                await self._refresh_once()
            finally:
                done.set()

    async def _refresh_once(self) -> None:
        names, all_topics = self._wanted()
        if not names and not all_topics:
            return
        request = metadata_request(None if all_topics else sorted(names))
        for address in self._bootstrap:
            try:
                response = await self._pool.link(address).request(ApiKey.METADATA, METADATA_VERSION,
                                                                    request)
            except UpstreamError as exc:
                log.warning("topic metadata from %s:%d failed: %s", *address, exc)
                continue
            self.refreshes += 1
            self._on_image(image_from_metadata(response))
            return
