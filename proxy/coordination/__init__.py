"""Coordinating KIP-848 consumer groups in front of a classic broker (the trio side).

The sans-I/O engine (:mod:`translation.coordinator`) decides everything about a group; this
package gives it time, topic metadata and a network (the proxy's own requests to brokers go
through :mod:`proxy.kafka_client`; durable group state is :mod:`proxy.state_log`, used through
:mod:`proxy.coordination.durability`):

* :mod:`proxy.coordination.service` owns the one :class:`~translation.coordinator.GroupCoordinator`
  of the process, its timer task and the per-group state;
* :mod:`proxy.coordination.membership` holds the proxy's own member in the broker's classic
  group of the same id (offset commits, fencing of clients that bypass the proxy);
* :mod:`proxy.coordination.topics` keeps the topic metadata of subscribed topics fresh;
* :mod:`proxy.coordination.convert` maps decoded group messages onto the engine's dataclasses
  and back, for both protocols;
* :mod:`proxy.coordination.routing` is the connection router: a request passes the stages of
  its connection's list (:mod:`.stages`: authorization, the fleet route, ...) to one handler
  per group API (:mod:`.consumer_group`, :mod:`.classic`, :mod:`.offsets`, :mod:`.listing`,
  in the table :data:`~proxy.coordination.routing.HANDLERS`), which decides whether the proxy
  answers it, rewrites it or lets it pass to the broker.
"""
