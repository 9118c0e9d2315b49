"""The real-broker test bed: Apache Kafka brokers and Java tools assembled from Maven Central.

``artifacts`` resolves and caches Maven bundles, ``distributions`` names the jars and main classes
of each Kafka line, ``broker`` runs single-node and 3-broker KRaft clusters on loopback, and
``tools`` drives Kafka's VerifiableProducer, VerifiableConsumer and consumer-groups command.
Used by the integration tests (``tests/conftest.py``), ``dev/`` scripts and benchmarks.
"""
