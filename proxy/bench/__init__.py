"""Benchmark support for the ``groupgate bench`` commands (``proxy.commands.bench_*``).

For the engine benchmark, ``workload`` builds seeded assignor inputs (group specs, topic
metadata, previous targets) and writes them in a small text format that
``java/AssignorBench.java`` reads, so that groupgate's assignors and Kafka's own run on
identical inputs.
"""
