"""Benchmarks and long scenarios that need the test bed's brokers and JVMs.

They are commands, not tests: ``dev/bench NAME ...`` (``python -m tests.benchmarks NAME``) runs
one and prints figures (and writes JSON); nothing here asserts a timing. ``workload`` builds
seeded assignor inputs that ``java/AssignorBench.java`` reads, so groupgate's assignors and
Kafka's own run on identical inputs. The pass-through benchmark is a product command
(``groupgate bench passthrough``, against any cluster); ``dev/bench passthrough`` runs it
against a test-bed broker.
"""
