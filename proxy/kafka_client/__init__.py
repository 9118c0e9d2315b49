"""The proxy's own Kafka client: the requests it sends for itself, not for a client.

Everything the proxy asks a broker on its own behalf (the coordinator service, the state log,
the journal) goes through here; requests it forwards or rewrites for a client do not. It
depends on the codec, the upstream connection (TLS and SASL with it) and Kafka's error codes
(:mod:`translation.errors`) only, never on the packages that use it
(``tests/unit/test_package_layering.py``); its callers encode their record batches.

* :mod:`proxy.kafka_client.links`: request/response connections to brokers and to other
  sidecars' fleet listeners, opened lazily as the proxy's own identity, one request at a time;
* :mod:`proxy.kafka_client.metadata`: Metadata and FindCoordinator requests and answers
  (topic partitions, leaders and ids; brokers; coordinators), the broker list for readiness;
* :mod:`proxy.kafka_client.create_topic`: CreateTopics for one topic and its answer;
* :mod:`proxy.kafka_client.partitioner`: Kafka's default partitioner (murmur2 of the key);
* :mod:`proxy.kafka_client.produce`: Produce of encoded record batches, plain or
  transactional, and the answer per partition.
"""
