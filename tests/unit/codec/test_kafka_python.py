"""Cross-check against kafka-python 3.0.12's protocol classes (an independent implementation).

For every API both know and every version in the overlap: our encoding decodes with
kafka-python to the same leaf values and re-encodes byte for byte, and kafka-python's encoding
of that value decodes with our codec to the same value.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.codec import messages
from tests.unit.codec.kp import (
    CLASSES,
    KpMetadataResponse,
    kp_decode,
    kp_encode,
    kp_leaves,
    kp_max_version,
    my_leaves,
)
from tests.unit.codec.strategies import ALL_KEYS, examples, message_values

CASES = [(k, r) for k in ALL_KEYS for r in (False, True) if (k, r) in CLASSES]

# kafka-python 3.0.12 loads its schemas with a deprecated importlib.resources call
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_overlap_is_substantial() -> None:
    assert len(CASES) >= 32  # all but ConsumerGroupHeartbeat/Describe


@pytest.mark.parametrize(("api_key", "response"), CASES)
@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_against_kafka_python(api_key: int, response: bool, data: st.DataObject) -> None:
    m = messages.schema(api_key, response)
    hi = min(m.valid.hi, kp_max_version(api_key, response) or 0)
    version = data.draw(st.integers(m.valid.lo, hi), label="version")
    value = data.draw(message_values(api_key, version, response, unknown_tags=False),
                      label="value")
    if api_key == 18 and response:
        value["error_code"] = 0
    enc = messages.encode_response if response else messages.encode_request
    dec = messages.decode_response if response else messages.decode_request
    flexible = m.is_flexible(version)

    ours = enc(api_key, version, value)
    theirs_obj = kp_decode(api_key, response, version, ours)
    assert kp_encode(theirs_obj, version) == ours

    got, _ = dec(api_key, version, ours)
    mine: list[object] = []
    my_leaves(got, m.struct, version, flexible, mine)
    kp: list[object] = []
    kp_leaves(theirs_obj, CLASSES[(api_key, response)]._struct, version, flexible, kp)
    assert mine == kp


@pytest.mark.parametrize("version", range(0, 14))
def test_metadata_response_from_kafka_python(version: int) -> None:
    """A value built with kafka-python's own classes decodes to the same fields by name."""
    import uuid

    cls = KpMetadataResponse[version]
    broker = cls.MetadataResponseBroker(node_id=7, host="b7.example", port=9093,
                                        rack="r1" if version >= 1 else None)
    part = cls.MetadataResponseTopic.MetadataResponsePartition(
        error_code=0, partition_index=2, leader_id=7, leader_epoch=5, replica_nodes=[7, 8],
        isr_nodes=[7], offline_replicas=[8])
    tid = uuid.UUID("12345678-1234-5678-1234-567812345678")
    topic = cls.MetadataResponseTopic(error_code=0, name="orders", topic_id=tid,
                                      is_internal=False, partitions=[part])
    wire = bytes(cls(throttle_time_ms=3, brokers=[broker], cluster_id="cid", controller_id=7,
                     topics=[topic]).encode(version=version))
    got, end = messages.decode_response(3, version, wire)
    assert end == len(wire)
    assert got["brokers"][0]["node_id"] == 7
    assert got["brokers"][0]["host"] == "b7.example"
    assert got["brokers"][0]["port"] == 9093
    assert got["topics"][0]["name"] == "orders"
    p = got["topics"][0]["partitions"][0]
    assert (p["partition_index"], p["leader_id"], p["replica_nodes"]) == (2, 7, [7, 8])
    if version >= 10:
        assert got["topics"][0]["topic_id"] == tid
    if version >= 3:
        assert got["throttle_time_ms"] == 3
    assert messages.encode_response(3, version, got) == wire
