"""Rewrite broker endpoints in responses so that clients keep talking to the proxy.

Four places carry broker addresses (field guide section 8):

* Metadata (all versions): the brokers array, which precedes the topics. Only that array is
  decoded and re-encoded; the bytes before and after it are copied untouched (a splice).
* FindCoordinator: v0-v3 one node at the top level, v4+ a ``coordinators`` list; node -1
  (no coordinator / error) is left alone.
* DescribeCluster: the brokers array; the message is small, so it is fully re-encoded.
* KIP-951 ``NodeEndpoints``: a top-level tagged field at the end of Produce v10+ and Fetch v16+
  responses. The response is skimmed with the generated skip functions (record batches are
  jumped over by their length, never copied) to reach the tagged section; when the tag is absent
  the original object is returned.

Each function takes the response body (after the response header) and returns new bytes, or the
very same object when nothing changed. Malformed input raises :class:`CodecError`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from proxy.codec._runtime import tag_entries, w_tags
from proxy.codec.api_keys import ApiKey
from proxy.codec.compiler import Compiled, TopField
from proxy.codec.errors import CodecError
from proxy.codec.messages import as_buffer, compiled
from proxy.rewrite.address import AddressMap, RecordingMap

_ERRORS = (struct.error, IndexError, ValueError, TypeError, OverflowError, KeyError,
           AttributeError, RecursionError, MemoryError)

Body = bytes | bytearray | memoryview


def _map_nodes(nodes: list[dict[str, Any]] | None, amap: AddressMap,
               id_key: str = "node_id") -> bool:
    changed = False
    for n in nodes or ():
        node_id = n[id_key]
        if node_id < 0:
            continue
        host, port = amap.lookup(node_id, n["host"], n["port"])
        if host != n["host"] or port != n["port"]:
            n["host"] = host
            n["port"] = port
            changed = True
    return changed


# ---- Metadata: splice the brokers array -------------------------------------------------

_SPLICE: dict[tuple[int, int, str], tuple[tuple[Callable[[Any, int], int], ...], TopField]] = {}


def _splice_plan(api_key: int, version: int, key: str
                 ) -> tuple[tuple[Callable[[Any, int], int], ...], TopField]:
    plan = _SPLICE.get((api_key, version, key))
    if plan is None:
        c = compiled(api_key, version, True)
        skips = []
        for f in c.fields:
            if f.key == key:
                break
            if f.skip is None:
                raise CodecError(f"{c.name} v{version}: tagged field before {key}")
            skips.append(f.skip)
        plan = _SPLICE[(api_key, version, key)] = (tuple(skips), c.field(key))
    return plan


def rewrite_metadata(version: int, body: Body, amap: AddressMap) -> Body:
    skips, brokers_field = _splice_plan(ApiKey.METADATA, version, "brokers")
    buf = as_buffer(body)
    try:
        pos = 0
        for skip in skips:
            pos = skip(buf, pos)
        if pos > len(buf):
            raise CodecError("metadata response truncated before its brokers")
        brokers, end = brokers_field.decode(buf, pos)
    except CodecError:
        raise
    except _ERRORS as e:
        raise CodecError(f"cannot read Metadata v{version} brokers: {type(e).__name__}: {e}"
                         ) from e
    if not _map_nodes(brokers, amap):
        return body
    new = bytearray()
    try:
        brokers_field.encode(brokers, new)
    except _ERRORS as e:
        raise CodecError(f"cannot encode rewritten brokers: {e}") from e
    with memoryview(buf) as mv:  # one copy of the untouched parts, in the join
        return b"".join((mv[:pos], new, mv[end:]))


# ---- FindCoordinator and DescribeCluster: full decode / encode --------------------------


def _full(api_key: int, version: int, body: Body, amap: AddressMap,
          edit: Callable[[dict[str, Any], AddressMap], bool]) -> Body:
    c: Compiled = compiled(api_key, version, True)
    buf = as_buffer(body)
    try:
        value, end = c.decode(buf, 0)
    except CodecError:
        raise
    except _ERRORS as e:
        raise CodecError(f"cannot decode {c.name} v{version}: {type(e).__name__}: {e}") from e
    if end != len(buf):
        raise CodecError(f"{c.name} v{version}: {len(buf) - end} trailing bytes")
    if not edit(value, amap):
        return body
    try:
        return c.encode(value)
    except _ERRORS as e:
        raise CodecError(f"cannot encode {c.name} v{version}: {e}") from e


def _edit_single_coordinator(value: dict[str, Any], amap: AddressMap) -> bool:
    if value["error_code"] != 0 or value["node_id"] < 0:
        return False
    return _map_nodes([value], amap)


def rewrite_find_coordinator(version: int, body: Body, amap: AddressMap) -> Body:
    if version >= 4:  # batched lookups: a list of (key, node, host, port, error)
        return _full(ApiKey.FIND_COORDINATOR, version, body, amap,
                     lambda v, m: _map_nodes(v["coordinators"], m))
    return _full(ApiKey.FIND_COORDINATOR, version, body, amap, _edit_single_coordinator)


def rewrite_describe_cluster(version: int, body: Body, amap: AddressMap) -> Body:
    return _full(ApiKey.DESCRIBE_CLUSTER, version, body, amap,
                 lambda v, m: _map_nodes(v["brokers"], m, "broker_id"))


# ---- KIP-951 NodeEndpoints: top-level tagged field ---------------------------------------

_NE: dict[tuple[int, int], tuple[Compiled, TopField]] = {}


def _node_endpoints_plan(api_key: int, version: int) -> tuple[Compiled, TopField]:
    plan = _NE.get((api_key, version))
    if plan is None:
        c = compiled(api_key, version, True)
        plan = _NE[(api_key, version)] = (c, c.field("node_endpoints"))
    return plan


def rewrite_node_endpoints(api_key: int, version: int, body: Body, amap: AddressMap) -> Body:
    """Rewrite NodeEndpoints of a Produce v10+ / Fetch v16+ response body."""
    c, field = _node_endpoints_plan(api_key, version)
    tag = field.tag
    buf = as_buffer(body)
    n = len(buf)
    try:
        ts = c.tagged_start(buf, 0)
        if ts < n and buf[ts] == 0:  # empty tagged section: the common case
            if ts + 1 != n:
                raise CodecError(f"{c.name} v{version}: {n - ts - 1} trailing bytes")
            return body
        entries, end = tag_entries(buf, ts)
        if end != n:
            raise CodecError(f"{c.name} v{version}: {n - end} trailing bytes")
        found = [e for e in entries if e[0] == tag]
        if not found:
            return body
        _, start, stop = found[0]
        nodes, p = field.decode(buf, start)
        if p != stop:
            raise CodecError(f"{c.name} v{version}: NodeEndpoints size mismatch")
    except CodecError:
        raise
    except _ERRORS as e:
        raise CodecError(f"cannot skim {c.name} v{version}: {type(e).__name__}: {e}") from e
    if not _map_nodes(nodes, amap):
        return body
    data = bytearray()
    try:
        field.encode(nodes, data)
    except _ERRORS as e:
        raise CodecError(f"cannot encode rewritten NodeEndpoints: {e}") from e
    section = bytearray()
    w_tags(section, [(t, data if t == tag else bytes(buf[s:e])) for t, s, e in entries])
    with memoryview(buf) as mv:  # the records before the tagged section are copied once
        return b"".join((mv[:ts], section))


def rewrite_produce(version: int, body: Body, amap: AddressMap) -> Body:
    return body if version < 10 else rewrite_node_endpoints(ApiKey.PRODUCE, version, body, amap)


def rewrite_fetch(version: int, body: Body, amap: AddressMap) -> Body:
    return body if version < 16 else rewrite_node_endpoints(ApiKey.FETCH, version, body, amap)


# ---- dispatch -----------------------------------------------------------------------------

REWRITERS: dict[int, Callable[[int, Body, AddressMap], Body]] = {
    ApiKey.METADATA: rewrite_metadata,
    ApiKey.FIND_COORDINATOR: rewrite_find_coordinator,
    ApiKey.DESCRIBE_CLUSTER: rewrite_describe_cluster,
    ApiKey.PRODUCE: rewrite_produce,
    ApiKey.FETCH: rewrite_fetch,
}


_PRODUCE, _FETCH = ApiKey.PRODUCE, ApiKey.FETCH
"""Bound once: an enum attribute costs a metaclass lookup on every response."""


def needs_rewrite(api_key: int, version: int) -> bool:
    """Whether responses of (api_key, version) can carry broker addresses."""
    if api_key == _PRODUCE:
        return version >= 10
    if api_key == _FETCH:
        return version >= 16
    return api_key in REWRITERS


def rewrite_response(api_key: int, version: int, body: Body, amap: AddressMap) -> Body:
    """Rewrite broker addresses in a response body; other APIs come back untouched."""
    fn = REWRITERS.get(api_key)
    if fn is None:
        return body
    return fn(version, body, amap)


def brokers_in(api_key: int, version: int, body: Body) -> list[tuple[int, str, int]]:
    """(node_id, host, port) of every broker endpoint in a response body, in order."""
    rec = RecordingMap()
    rewrite_response(api_key, version, body, rec)
    return rec.seen
