"""Tests of the schema-driven Kafka codec, header peek and their fuzzing."""
