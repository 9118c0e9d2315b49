"""The ApiVersions answer the proxy gives clients (sans-I/O).

Clients pick request versions from the ApiVersions response, so the proxy must never advertise
a version it cannot handle. :func:`client_view` takes the broker's decoded ApiVersions response
and a table of what the proxy parses, and returns the response the client gets:

* APIs the proxy decodes (owns or rewrites): the broker's range intersected with the parseable
  range; the API is dropped when the intersection is empty;
* APIs the proxy only forwards: the broker's range unchanged;
* APIs the proxy serves itself (ConsumerGroupHeartbeat 68, ConsumerGroupDescribe 69): the range
  the caller gives, whatever the broker says;
* APIs the caller bridges (:data:`BRIDGED`: OffsetCommit, when the proxy coordinates groups):
  one version more than the broker's newest, where that next version is the same request on
  the wire (the proxy sends it to the broker as the older one, :func:`downgraded`).

All other fields (throttle time, features, unknown tagged fields) are kept. For a request whose
ApiVersions version is newer than the proxy knows, :func:`unsupported_version_body` builds the
KIP-511 answer: a v0 body with UNSUPPORTED_VERSION and the proxy's own ApiVersions range, sent
with response header v0 (:func:`unsupported_version_response`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.header import response_header
from translation.errors import ErrorCode

VersionRange = tuple[int, int]

# APIs whose responses the proxy rewrites. Produce and Fetch responses are only touched from the
# version that carries NodeEndpoints on, so older versions need no parsing and stay allowed.
REWRITTEN = (ApiKey.METADATA, ApiKey.FIND_COORDINATOR, ApiKey.DESCRIBE_CLUSTER)
REWRITTEN_FROM = {ApiKey.PRODUCE: 10, ApiKey.FETCH: 16}
# Group APIs the proxy decodes when it owns the group.
GROUP_APIS = (ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT,
              ApiKey.LEAVE_GROUP, ApiKey.SYNC_GROUP, ApiKey.DESCRIBE_GROUPS, ApiKey.LIST_GROUPS,
              ApiKey.TXN_OFFSET_COMMIT, ApiKey.OFFSET_DELETE)


BRIDGED: dict[int, int] = {ApiKey.OFFSET_COMMIT: 8}
"""api key -> a broker's newest version after which the proxy offers one more. OffsetCommit v9
is v8 with nothing added ("the first version that can be used with the new consumer group
protocol"): a KIP-848 member must commit with v9, which Kafka 3.6 and older lack, so the
proxy coordinating the member's group takes v9 and sends v8 (its stamped commit is its own
classic member's anyway)."""


def downgraded(frame: bytes | bytearray | memoryview, version: int) -> bytes:
    """A request frame (header and body, no length prefix) relabelled as ``version`` of its
    API: only for a :data:`BRIDGED` API, whose two versions are the same bytes."""
    out = bytearray(frame)
    out[2:4] = version.to_bytes(2, "big", signed=True)
    return bytes(out)


def default_parse_table(extra: Mapping[int, VersionRange] | None = None
                        ) -> dict[int, VersionRange]:
    """api_key -> versions the proxy can parse, derived from the vendored schemas."""
    table: dict[int, VersionRange] = {}
    for key in (*REWRITTEN, *GROUP_APIS, ApiKey.API_VERSIONS):
        table[key] = messages.supported_versions(key)
    for key in REWRITTEN_FROM:
        table[key] = (0, messages.supported_versions(key)[1])
    table.update(extra or {})
    return table


def client_view(broker: Mapping[str, Any], parseable: Mapping[int, VersionRange],
                served: Mapping[int, VersionRange] | None = None,
                bridged: Mapping[int, int] | None = None) -> dict[str, Any]:
    """The ApiVersions response value to send the client (the broker's is not modified);
    ``bridged``: :data:`BRIDGED` when the caller sends the extra version as the older one."""
    out = copy.deepcopy(dict(broker))
    served = dict(served or {})
    keys: list[dict[str, Any]] = []
    for entry in broker.get("api_keys", ()):
        key = entry["api_key"]
        if key in served:
            continue
        lo, hi = entry["min_version"], entry["max_version"]
        if bridged and bridged.get(key) == hi:
            hi += 1
        if key in parseable:
            plo, phi = parseable[key]
            lo, hi = max(lo, plo), min(hi, phi)
            if lo > hi:
                continue
        e = copy.deepcopy(dict(entry))
        e["min_version"], e["max_version"] = lo, hi
        keys.append(e)
    for key, (lo, hi) in served.items():
        keys.append({"api_key": key, "min_version": lo, "max_version": hi})
    keys.sort(key=lambda e: e["api_key"])
    out["api_keys"] = keys
    return out


def proxy_api_versions_range() -> VersionRange:
    return messages.supported_versions(ApiKey.API_VERSIONS)


def is_too_new(api_version: int) -> bool:
    """Whether an ApiVersions request of this version needs the KIP-511 answer."""
    return api_version > proxy_api_versions_range()[1]


def unsupported_version_body(own: VersionRange | None = None) -> bytes:
    """ApiVersions v0 body: UNSUPPORTED_VERSION plus the ApiVersions range the proxy accepts."""
    lo, hi = own or proxy_api_versions_range()
    return messages.encode_response(ApiKey.API_VERSIONS, 0, {
        "error_code": ErrorCode.UNSUPPORTED_VERSION,
        "api_keys": [{"api_key": ApiKey.API_VERSIONS, "min_version": lo, "max_version": hi}],
    })


def unsupported_version_response(correlation_id: int, own: VersionRange | None = None) -> bytes:
    """Header v0 + :func:`unsupported_version_body` (without the 4-byte frame length)."""
    return response_header(correlation_id, 0) + unsupported_version_body(own)
