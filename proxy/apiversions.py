"""The ApiVersions answer the proxy gives clients (sans-I/O).

Clients pick request versions from the ApiVersions response, so the proxy must never advertise
a version it cannot handle. :func:`client_view` takes the broker's decoded ApiVersions response
and a table of what the proxy parses, and returns the response the client gets:

* APIs the proxy decodes (owns or rewrites): the broker's range intersected with the parseable
  range; the API is dropped when the intersection is empty;
* APIs the proxy only forwards: the broker's range unchanged;
* APIs the proxy serves itself (ConsumerGroupHeartbeat 68, ConsumerGroupDescribe 69): the range
  the caller gives, whatever the broker says.

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
                served: Mapping[int, VersionRange] | None = None) -> dict[str, Any]:
    """The ApiVersions response value to send the client (the broker's is not modified)."""
    out = copy.deepcopy(dict(broker))
    served = dict(served or {})
    keys: list[dict[str, Any]] = []
    for entry in broker.get("api_keys", ()):
        key = entry["api_key"]
        if key in served:
            continue
        lo, hi = entry["min_version"], entry["max_version"]
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
