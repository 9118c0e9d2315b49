"""The group id of a group request, read from its first bytes without decoding the rest.

The proxy decodes the group requests it examines, and decoding is bounded
(``max-examined-request-bytes``): a decoded request takes many times its wire size, and
decoding holds the event loop. A request over the bound may still be passed to the broker
untouched when it concerns a group the proxy does not coordinate; for the requests whose body
opens with the group id, that id sits in the first bytes, which is all :func:`group_id_of`
reads. For the others (DescribeGroups, DeleteGroups, OffsetFetch v8+, TxnOffsetCommit) it
answers None and the request is refused.
"""

from __future__ import annotations

import struct

from proxy.codec import messages
from proxy.codec._runtime import r_uv
from proxy.codec.api_keys import ApiKey
from proxy.codec.errors import CodecError
from proxy.codec.header import parse_request_header

_INT16 = struct.Struct(">h")


def opens_with_group_id(api_key: int, version: int) -> bool:
    if api_key == ApiKey.OFFSET_FETCH:
        return version < 8  # v8+ carries an array of groups
    return api_key in (ApiKey.OFFSET_COMMIT, ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT,
                       ApiKey.LEAVE_GROUP, ApiKey.SYNC_GROUP)


def group_id_of(frame: memoryview, api_key: int, version: int) -> str | None:
    """The group id of the request in ``frame`` (header and body, possibly only the first
    bytes), or None when the request does not open with one or ``frame`` is too short."""
    if not opens_with_group_id(api_key, version):
        return None
    try:
        header = parse_request_header(frame)
        pos = header.header_length
        if messages.is_flexible(api_key, version):
            length, pos = r_uv(frame, pos)
            length -= 1
        else:
            (length,) = _INT16.unpack_from(frame, pos)
            pos += 2
    except (CodecError, IndexError, ValueError, struct.error):
        return None
    if length < 0 or pos + length > len(frame):
        return None
    try:
        return str(frame[pos:pos + length], "utf-8")
    except UnicodeDecodeError:
        return None
