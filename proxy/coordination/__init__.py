"""Coordinating KIP-848 consumer groups in front of a classic broker (the trio side).

The sans-I/O engine (:mod:`translation.coordinator`) decides everything about a group; this
package gives it time, topic metadata and a network:

* :mod:`proxy.coordination.service` owns the one :class:`~translation.coordinator.GroupCoordinator`
  of the process, its timer task and the per-group state;
* :mod:`proxy.coordination.membership` holds the proxy's own member in the broker's classic
  group of the same id (offset commits, fencing of clients that bypass the proxy);
* :mod:`proxy.coordination.topics` keeps the topic metadata of subscribed topics fresh;
* :mod:`proxy.coordination.links` are the proxy's own request/response connections to brokers;
* :mod:`proxy.coordination.wire`, :mod:`proxy.coordination.offsets` and
  :mod:`proxy.coordination.listing` translate between decoded requests and the engine;
* :mod:`proxy.coordination.routing` is the connection router that sends group requests of
  coordinated groups here instead of to the broker.
"""
