"""Public entry points of the codec: decode and encode request/response bodies by API key.

Bodies are the bytes after the request/response header. Values are dicts keyed by snake_case
field names (see :mod:`proxy.codec.compiler`). Versions outside a schema's ``validVersions`` are
rejected; nothing assumes versions start at 0. Compiled functions are built on first use and
cached per (api key, version, direction), so importing this module costs only schema parsing.

The proxy only calls these for APIs it owns or rewrites; everything else is forwarded as opaque
bytes after :mod:`proxy.codec.header` has peeked at the request header.
"""

from __future__ import annotations

import struct
from typing import Any

from proxy.codec.api_index import api_index
from proxy.codec.api_keys import ApiKey
from proxy.codec.compiler import Compiled, compile_message
from proxy.codec.errors import CodecError
from proxy.codec.schema import MessageSchema, all_messages, load

_DECODE_ERRORS = (struct.error, IndexError, ValueError, TypeError, OverflowError, KeyError,
                  AttributeError, RecursionError, MemoryError)

_CACHE: dict[tuple[int, int, bool], Compiled] = {}


def api_keys() -> frozenset[int]:
    """API keys with vendored schemas."""
    return frozenset(k for k, _ in all_messages())


def schema(api_key: int, response: bool = False) -> MessageSchema:
    """The request (or response) schema of ``api_key``."""
    m = all_messages().get((api_key, "response" if response else "request"))
    if m is None:
        raise CodecError(f"no schema for api key {api_key}")
    return m


def supported_versions(api_key: int) -> tuple[int, int]:
    """(min, max) versions the codec can parse for ``api_key`` (request and response agree)."""
    req = schema(api_key).valid
    resp = schema(api_key, response=True).valid
    return max(req.lo, resp.lo), min(req.hi, resp.hi)


def is_flexible(api_key: int, version: int) -> bool:
    """Whether (api_key, version) uses flexible encoding.

    Vendored schemas answer first; other broker APIs are looked up in ``api_index.json`` so the
    header of any forwarded request can be parsed.
    """
    m = all_messages().get((api_key, "request"))
    if m is not None:
        return m.is_flexible(version)
    info = api_index().get(api_key)
    if info is None:
        raise CodecError(f"unknown api key {api_key}")
    return info.is_flexible(version)


def request_header_version(api_key: int, version: int) -> int:
    """2 for flexible request versions, else 1 (v0 was only ControlledShutdown v0's)."""
    return 2 if is_flexible(api_key, version) else 1


def response_header_version(api_key: int, version: int) -> int:
    """1 for flexible response versions, else 0; ApiVersions responses always use v0."""
    if api_key == ApiKey.API_VERSIONS:
        return 0
    return 1 if is_flexible(api_key, version) else 0


def compiled(api_key: int, version: int, response: bool) -> Compiled:
    key = (api_key, version, response)
    c = _CACHE.get(key)
    if c is None:
        m = schema(api_key, response)
        if version not in m.valid:
            raise CodecError(
                f"{m.name} v{version} is not supported (valid {m.valid.lo}-{m.valid.hi})")
        c = _CACHE[key] = compile_message(m, version)
    return c


def as_buffer(buf: Any) -> Any:
    """bytes / bytearray as they are; anything else as a flat unsigned-byte memoryview."""
    if isinstance(buf, bytes | bytearray):
        return buf
    try:
        mv = memoryview(buf)
    except TypeError:
        raise CodecError(f"expected a bytes-like buffer, got {type(buf).__name__}") from None
    if not mv.contiguous:
        return mv.tobytes()  # a strided view cannot be cast; copy it
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def _decode(c: Compiled, buf: Any, offset: int) -> tuple[dict[str, Any], int]:
    buf = as_buffer(buf)
    if offset < 0 or offset > len(buf):
        raise CodecError(f"offset {offset} outside a buffer of {len(buf)} bytes")
    try:
        return c.decode(buf, offset)
    except CodecError:
        raise
    except _DECODE_ERRORS as e:
        raise CodecError(f"cannot decode {c.name} v{c.version}: {type(e).__name__}: {e}") from e


def _encode(c: Compiled, value: Any) -> bytes:
    if not isinstance(value, dict):
        raise CodecError(f"{c.name} v{c.version}: expected a dict, got {type(value).__name__}")
    try:
        return c.encode(value)
    except CodecError:
        raise
    except _DECODE_ERRORS as e:
        raise CodecError(f"cannot encode {c.name} v{c.version}: {type(e).__name__}: {e}") from e


def decode_request(api_key: int, version: int, buf: Any, offset: int = 0
                   ) -> tuple[dict[str, Any], int]:
    """Decode a request body at ``offset``; return (value, offset after the body)."""
    return _decode(compiled(api_key, version, False), buf, offset)


def decode_response(api_key: int, version: int, buf: Any, offset: int = 0
                    ) -> tuple[dict[str, Any], int]:
    """Decode a response body; an ApiVersions response with an error is read as v0 (KIP-511)."""
    if api_key == ApiKey.API_VERSIONS and version > 0:
        b = as_buffer(buf)
        if len(b) >= offset + 2 and (b[offset] or b[offset + 1]):
            version = 0
    return _decode(compiled(api_key, version, True), buf, offset)


def encode_request(api_key: int, version: int, value: dict[str, Any]) -> bytes:
    return _encode(compiled(api_key, version, False), value)


def encode_response(api_key: int, version: int, value: dict[str, Any]) -> bytes:
    return _encode(compiled(api_key, version, True), value)


# ---- "data" schemas: the consumer protocol embedded in JoinGroup / SyncGroup ----------------

_DATA_CACHE: dict[tuple[str, int], Compiled] = {}
_i16 = struct.Struct(">h")


def _data(name: str, version: int) -> Compiled:
    c = _DATA_CACHE.get((name, version))
    if c is None:
        c = _DATA_CACHE[(name, version)] = compile_message(load(name), version)
    return c


def decode_data(name: str, buf: Any) -> tuple[int, dict[str, Any]]:
    """Decode a versioned data blob (``ConsumerProtocolSubscription``/``...Assignment``).

    The blob starts with an int16 version. Versions above the newest known one are read with the
    newest schema, as Kafka's ConsumerProtocol does (newer versions only append fields).
    Returns (version on the wire, value).
    """
    m = load(name)
    b = as_buffer(buf)
    if len(b) < 2:
        raise CodecError(f"{name}: {len(b)} bytes, no version")
    (version,) = _i16.unpack_from(b, 0)
    if version < m.valid.lo:
        raise CodecError(f"{name}: unsupported version {version}")
    value, _ = _decode(_data(name, min(version, m.valid.hi)), b, 2)
    return version, value


def encode_data(name: str, version: int, value: dict[str, Any]) -> bytes:
    m = load(name)
    if version not in m.valid:
        raise CodecError(f"{name}: unsupported version {version}")
    return _i16.pack(version) + _encode(_data(name, version), value)
