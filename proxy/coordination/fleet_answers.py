"""The answers of the FleetControl types that carry a body (``CommitTicket``, ``Remainder``,
``Heartbeat``; :mod:`.fleet_control`): a big-endian int16 error code, then a JSON object.

An answer with no bytes after the error code comes from a sidecar (or a part of it) that does
not take the type at all: INVALID_REQUEST or UNSUPPORTED_VERSION there means "send the request
the old way" (relay it), which :func:`read` tells apart for its callers. The modules of each
type (:mod:`.tickets`, :mod:`.remainders`, :mod:`.regex_rights`) read and check their own
fields; this module only frames them.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any, Final

from translation.errors import ErrorCode

_ERROR: Final = struct.Struct(">h")

NOT_TAKEN: Final = frozenset({int(ErrorCode.INVALID_REQUEST),
                              int(ErrorCode.UNSUPPORTED_VERSION)})
"""Error codes of a bodiless answer that mean the type is not taken there."""


def encode(error: int, body: Mapping[str, Any]) -> bytes:
    """An answer: ``error``, then ``body`` as compact JSON (``{}`` for an empty one)."""
    return _ERROR.pack(error) + json.dumps(body, separators=(",", ":")).encode()


def read(raw: bytes, what: str) -> tuple[int, dict[str, Any] | None]:
    """An answer's error code and body (None when it has none). ValueError when it cannot
    be read: too short, not JSON, or not an object (``what`` names what was expected, for the
    message)."""
    try:
        (error,) = _ERROR.unpack_from(raw, 0)
    except struct.error as exc:
        raise ValueError(f"short answer: {exc}") from exc
    rest = raw[_ERROR.size:]
    if not rest:
        return error, None
    body = json.loads(rest)
    if not isinstance(body, dict):
        raise ValueError(f"not {what}")
    return error, body
