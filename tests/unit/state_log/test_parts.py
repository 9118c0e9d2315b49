"""The pure parts of the group state log: partitioning and transactional ids, checked against
Kafka's own test vectors and kafka-python (murmur2 itself is tests/unit/kafka_client/
test_partitioner.py; record batches and the read_committed filter are
tests/unit/proxy/test_records.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from proxy.state_log.ids import (
    DIGEST_HEX,
    MAX_TRANSACTIONAL_ID,
    check_prefix,
    partition_for,
    transactional_id,
)
from proxy.state_log.log import StateLogSettings

# -- partitioning --------------------------------------------------------------------------

@given(st.text(min_size=1, max_size=40), st.integers(1, 200))
def test_partition_is_kafkas_default_partitioner_for_the_group_id(group: str, n: int) -> None:
    expected = (kafka_python_murmur2(group.encode()) & 0x7FFFFFFF) % n
    assert partition_for(group, n) == expected


def test_partition_of_known_groups() -> None:
    # fixed forever: a change moves every group's state to another partition
    for group, signed in ((b"21", -973932308), (b"foobar", -790332482), (b"abc", 479470107)):
        for n in (1, 16, 50, 1000):
            assert partition_for(group.decode(), n) == (signed & 0x7FFFFFFF) % n
    with pytest.raises(ValueError):
        partition_for("g", 0)


# -- transactional ids -----------------------------------------------------------------------

def test_plain_group_ids_are_used_as_they_are() -> None:
    assert transactional_id("gg", "orders.v2_eu-1") == "gg-orders.v2_eu-1"


@pytest.mark.parametrize("group", ["", "with space", "a/b", "k=v,x", "ü", "x" * 300,
                                   "new\nline", "tilde~"])
def test_other_group_ids_get_the_digest_form(group: str) -> None:
    tid = transactional_id("gg", group)
    assert tid.startswith("gg-") and len(tid) <= MAX_TRANSACTIONAL_ID
    readable, sep, digest = tid[3:].rpartition("~")
    assert sep and len(digest) == DIGEST_HEX
    assert all(c.isalnum() or c in "._-" for c in readable)
    assert transactional_id("gg", group) == tid  # stable


@given(st.text(max_size=300), st.text(max_size=300))
def test_distinct_groups_get_distinct_ids(a: str, b: str) -> None:
    if a != b:
        assert transactional_id("p", a) != transactional_id("p", b)


def test_a_literal_form_never_looks_like_a_digest_form() -> None:
    digest_form = transactional_id("p", "a b")
    assert transactional_id("p", digest_form[2:]) != digest_form  # '~' forces a digest


def test_prefixes_are_checked() -> None:
    assert check_prefix("groupgate-state") == "groupgate-state"
    for bad in ("", "a b", "x" * 101, "a~b"):
        with pytest.raises(ValueError):
            check_prefix(bad)
    with pytest.raises(ValueError):
        StateLogSettings(transactional_id_prefix="no spaces")
    with pytest.raises(ValueError):
        StateLogSettings(transaction_timeout_ms=5_000, write_timeout=10.0)
