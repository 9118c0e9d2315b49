"""``proxy/codec/api_keys.py`` is what the generator makes of the vendored index, and its
members are Kafka's API keys."""

from __future__ import annotations

import json
from pathlib import Path

from proxy.codec import api_keys
from proxy.codec.api_index import INDEX_FILE, api_index, render_api_keys
from proxy.codec.api_keys import ApiKey


def test_the_enum_is_generated_from_the_vendored_index() -> None:
    expected = render_api_keys(json.loads(INDEX_FILE.read_text()))
    assert Path(api_keys.__file__).read_text() == expected, "run dev/vendor-schemas"


def test_every_indexed_api_has_a_member_named_after_it() -> None:
    index = api_index()
    assert {int(k) for k in ApiKey} == set(index)
    assert ApiKey.CONSUMER_GROUP_HEARTBEAT == 68 and ApiKey.API_VERSIONS == 18
    assert ApiKey.OFFSET_FOR_LEADER_EPOCH == 23 and ApiKey.SASL_HANDSHAKE == 17
    for key, info in index.items():
        assert ApiKey(key).name.replace("_", "") == info.name.upper()
