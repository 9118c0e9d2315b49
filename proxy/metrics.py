"""Prometheus metrics of the proxy, labelled by node and API where it matters.

Counters on the forwarding path are looked up once per (listener, API key) and cached, so a
request costs one dictionary lookup and one increment.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

REGISTRY = CollectorRegistry(auto_describe=True)

REQUESTS = Counter("groupgate_requests", "Requests received from clients",
                   ["node", "api_key"], registry=REGISTRY)
CONNECTIONS = Counter("groupgate_connections_accepted", "Client connections accepted",
                      ["node"], registry=REGISTRY)
ACTIVE_CONNECTIONS = Gauge("groupgate_connections_active", "Client connections open",
                           ["node"], registry=REGISTRY)
CLOSED_BAD_INPUT = Counter("groupgate_connections_closed_bad_input",
                           "Connections closed because of a malformed or hostile frame",
                           ["node"], registry=REGISTRY)
UPSTREAM_FAILURES = Counter("groupgate_upstream_connect_failures",
                            "Client connections closed because no upstream broker was reachable",
                            ["node"], registry=REGISTRY)


class RequestCounters:
    """Per-connection cache of ``groupgate_requests`` children."""

    __slots__ = ("_children", "_node")

    def __init__(self, node: str) -> None:
        self._node = node
        self._children: dict[int, Counter] = {}

    def inc(self, api_key: int) -> None:
        child = self._children.get(api_key)
        if child is None:
            child = self._children[api_key] = REQUESTS.labels(self._node, str(api_key))
        child.inc()
