"""Broker address rewriting for responses that advertise brokers (sans-I/O).

``rewrite_response(api_key, version, body, address_map)`` returns the body with every broker
endpoint replaced by the proxy endpoint the :class:`AddressMap` gives for that node (or the same
object when nothing changed); ``needs_rewrite`` tells the forwarding path which responses to
look at at all, so every other response stays an opaque frame.
"""

from proxy.rewrite.address import AddressMap, DictAddressMap, RecordingMap
from proxy.rewrite.brokers import (
    REWRITERS,
    brokers_in,
    needs_rewrite,
    rewrite_describe_cluster,
    rewrite_fetch,
    rewrite_find_coordinator,
    rewrite_metadata,
    rewrite_node_endpoints,
    rewrite_produce,
    rewrite_response,
)

__all__ = [
    "REWRITERS",
    "AddressMap",
    "DictAddressMap",
    "RecordingMap",
    "brokers_in",
    "needs_rewrite",
    "rewrite_describe_cluster",
    "rewrite_fetch",
    "rewrite_find_coordinator",
    "rewrite_metadata",
    "rewrite_node_endpoints",
    "rewrite_produce",
    "rewrite_response",
]
