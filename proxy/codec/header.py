"""Request-header peek and response-header bytes, for the forwarding path.

A connection task reads a frame, calls :func:`peek` (one ``struct`` unpack, no allocation beyond
the tuple) to learn api key, version and correlation id, and then either forwards the frame as
opaque bytes or, for APIs the proxy owns or rewrites, calls :func:`parse_request_header` to find
where the body starts and hands the body to :mod:`proxy.codec.messages`.

Layout (Kafka's RequestHeader.json): int16 api_key, int16 api_version, int32 correlation_id,
nullable int16-length client_id (never compact, also in header v2), then in v2 a tagged-field
section. Response headers: int32 correlation_id, plus an empty tagged-field section in v1.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from proxy.codec import messages
from proxy.codec._runtime import tag_entries
from proxy.codec.errors import CodecError

_FIXED = struct.Struct(">hhi")
_FIXED_LEN = struct.Struct(">hhih")
_CORR = struct.Struct(">i")
FIXED_SIZE = 8

peek_unpack = _FIXED.unpack_from
"""``peek_unpack(frame, 0) -> (api_key, api_version, correlation_id)``: the raw fast path."""


def peek(frame: Any) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame body."""
    if len(frame) < FIXED_SIZE:
        raise CodecError(f"request header needs 8 bytes, frame has {len(frame)}")
    return _FIXED.unpack_from(frame, 0)


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_length: int  # offset of the body within the frame
    unknown_tagged: dict[int, bytes] | None = None


def parse_request_header(frame: Any, flexible: bool | None = None) -> RequestHeader:
    """Full request header: client id and, for header v2, the tagged fields.

    ``flexible`` says whether the request version uses header v2; by default it is looked up
    in the vendored schemas and ``api_index.json`` (:class:`CodecError` for unknown API keys).
    """
    n = len(frame)
    if n < 10:
        raise CodecError(f"request header needs at least 10 bytes, frame has {n}")
    api_key, version, corr, clen = _FIXED_LEN.unpack_from(frame, 0)
    pos = 10
    client_id: str | None
    if clen < 0:
        if clen != -1:
            raise CodecError(f"negative client id length {clen}")
        client_id = None
    else:
        end = pos + clen
        if end > n:
            raise CodecError(f"client id of {clen} bytes exceeds the frame")
        client_id = str(frame[pos:end], "utf-8", "replace")  # as Kafka's Java decoding does
        pos = end
    if flexible is None:
        flexible = messages.request_header_version(api_key, version) == 2
    tagged = None
    if flexible:
        try:
            entries, pos = tag_entries(frame, pos)
        except IndexError:
            raise CodecError("request header truncated in its tagged fields") from None
        if entries:
            tagged = {t: bytes(frame[s:e]) for t, s, e in entries}
    return RequestHeader(api_key, version, corr, client_id, pos, tagged)


def client_id(frame: Any) -> str | None:
    """Only the client id (header v1 and v2 agree on its position)."""
    return parse_request_header(frame, flexible=False).client_id


def response_header(correlation_id: int, version: int) -> bytes:
    """Response header bytes: v0 is the correlation id, v1 adds an empty tagged-field section."""
    if version == 0:
        return _CORR.pack(correlation_id)
    if version == 1:
        return _CORR.pack(correlation_id) + b"\x00"
    raise CodecError(f"unknown response header version {version}")


def response_header_for(api_key: int, api_version: int, correlation_id: int) -> bytes:
    return response_header(correlation_id, messages.response_header_version(api_key, api_version))


def encode_request_header(api_key: int, api_version: int, correlation_id: int,
                          client_id: str | None, flexible: bool | None = None) -> bytes:
    """Header bytes for a request the proxy sends itself (e.g. to the broker)."""
    if flexible is None:
        flexible = messages.request_header_version(api_key, api_version) == 2
    if client_id is None:
        cid = b"\xff\xff"
    else:
        b = client_id.encode("utf-8")
        cid = struct.pack(">h", len(b)) + b
    out = _FIXED.pack(api_key, api_version, correlation_id) + cid
    return out + b"\x00" if flexible else out


def response_correlation_id(frame: Any) -> int:
    """Correlation id of a response frame body (first 4 bytes, any header version)."""
    if len(frame) < 4:
        raise CodecError("response frame shorter than its correlation id")
    return _CORR.unpack_from(frame, 0)[0]  # type: ignore[no-any-return]
