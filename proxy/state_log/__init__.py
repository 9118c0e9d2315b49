"""The group state log: each coordinated group's durable state as records of a compacted topic.

The coordinator service writes what its engine changed here before it answers, and a sidecar
taking a group over reads the group back from here (through
:mod:`proxy.coordination.durability`, which knows the engine; this package does not). One
transactional writer per group, fenced by the group's transactional id. Design and
measurements: ``docs/decisions/0013-group-state-log.md``.

* :mod:`proxy.state_log.log`: :class:`~proxy.state_log.log.StateLog`, the entry point (start,
  open a group's writer, load a group), its settings and its exceptions;
* :mod:`proxy.state_log.topic`: the topic's settings, created or checked at start;
* :mod:`proxy.state_log.ids`: group -> partition, group -> transactional id;
* :mod:`proxy.state_log.writer`: a group's transactions and fencing;
* :mod:`proxy.state_log.loader`: reading a group's records back, read committed;
* :mod:`proxy.state_log.cluster`: the log's own connections, partition leaders and
  transaction coordinators;
* :mod:`proxy.state_log.errors`: the exceptions.

It uses the proxy's own Kafka client (:mod:`proxy.kafka_client`) and the record batches
(:mod:`proxy.records`) and never imports :mod:`proxy.coordination`
(``tests/unit/test_package_layering.py``).
"""
