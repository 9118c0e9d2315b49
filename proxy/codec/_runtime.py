"""Primitive readers and writers shared by the generated message functions.

The compiler emits straight-line Python that calls these helpers for the variable-length parts
(strings, bytes, counts, varints, tagged-field sections); fixed-width runs are packed with one
precompiled ``struct.Struct``. Every length is checked against the bytes that remain before
anything is sliced or allocated, so hostile lengths end in :class:`CodecError`.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from proxy.codec.errors import CodecError

_h = struct.Struct(">h")
_i = struct.Struct(">i")
_UUID = uuid.UUID
_new = object.__new__
_set = object.__setattr__
_SAFE = uuid.SafeUUID.unknown


def mk_uuid(b: bytes) -> uuid.UUID:
    u = _new(_UUID)
    _set(u, "int", int.from_bytes(b, "big"))
    _set(u, "is_safe", _SAFE)
    return u


def uuid_bytes(u: Any) -> bytes:
    if isinstance(u, _UUID):
        return u.bytes
    b = bytes(u)
    if len(b) != 16:
        raise CodecError(f"uuid must be 16 bytes, got {len(b)}")
    return b


def r_uv(buf: Any, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise CodecError("unsigned varint longer than 5 bytes")


def w_uv(out: bytearray, n: int) -> None:
    if n < 0:
        raise CodecError(f"negative unsigned varint {n}")
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def uv_bytes(n: int) -> bytes:
    out = bytearray()
    w_uv(out, n)
    return bytes(out)


def _short(what: str, need: int, have: int) -> CodecError:
    return CodecError(f"{what} of {need} bytes exceeds the {have} bytes remaining")


def null_error(name: str) -> CodecError:
    return CodecError(f"non-nullable field {name} was serialized as null")


# ---- counts -------------------------------------------------------------------------------


def r_cnt(buf: Any, pos: int) -> tuple[int, int]:
    """int32 array count; -1 means null. Rejects counts larger than the remaining bytes."""
    (n,) = _i.unpack_from(buf, pos)
    pos += 4
    if n < -1:
        raise CodecError(f"negative array length {n}")
    if n > len(buf) - pos:
        raise _short("array", n, len(buf) - pos)
    return n, pos


def r_ccnt(buf: Any, pos: int) -> tuple[int, int]:
    """Compact (uvarint N+1) array count; -1 means null."""
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = r_uv(buf, pos)
    n -= 1
    if n > len(buf) - pos:
        raise _short("array", n, len(buf) - pos)
    return n, pos


# ---- strings and bytes --------------------------------------------------------------------


def _slice_str(buf: Any, pos: int, n: int) -> tuple[str, int]:
    e = pos + n
    if e > len(buf):
        raise _short("string", n, len(buf) - pos)
    # Kafka decodes with Java's String(bytes, UTF_8), which replaces malformed sequences with
    # U+FFFD instead of failing; do the same so the proxy accepts what the broker accepts.
    return str(buf[pos:e], "utf-8", "replace"), e


def r_str(buf: Any, pos: int) -> tuple[str, int]:
    (n,) = _h.unpack_from(buf, pos)
    if n < 0:
        raise CodecError("non-nullable string was serialized as null" if n == -1
                         else f"negative string length {n}")
    return _slice_str(buf, pos + 2, n)


def r_nstr(buf: Any, pos: int) -> tuple[str | None, int]:
    (n,) = _h.unpack_from(buf, pos)
    if n < 0:
        if n == -1:
            return None, pos + 2
        raise CodecError(f"negative string length {n}")
    return _slice_str(buf, pos + 2, n)


def r_cstr(buf: Any, pos: int) -> tuple[str, int]:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = r_uv(buf, pos)
    if n == 0:
        raise CodecError("non-nullable compact string was serialized as null")
    return _slice_str(buf, pos, n - 1)


def r_ncstr(buf: Any, pos: int) -> tuple[str | None, int]:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = r_uv(buf, pos)
    if n == 0:
        return None, pos
    return _slice_str(buf, pos, n - 1)


def _slice_bytes(buf: Any, pos: int, n: int) -> tuple[bytes, int]:
    e = pos + n
    if e > len(buf):
        raise _short("bytes", n, len(buf) - pos)
    return bytes(buf[pos:e]), e


def r_bytes(buf: Any, pos: int) -> tuple[bytes, int]:
    (n,) = _i.unpack_from(buf, pos)
    if n < 0:
        raise CodecError("non-nullable bytes were serialized as null" if n == -1
                         else f"negative bytes length {n}")
    return _slice_bytes(buf, pos + 4, n)


def r_nbytes(buf: Any, pos: int) -> tuple[bytes | None, int]:
    (n,) = _i.unpack_from(buf, pos)
    if n < 0:
        if n == -1:
            return None, pos + 4
        raise CodecError(f"negative bytes length {n}")
    return _slice_bytes(buf, pos + 4, n)


def r_cbytes(buf: Any, pos: int) -> tuple[bytes, int]:
    n, pos = r_uv(buf, pos)
    if n == 0:
        raise CodecError("non-nullable compact bytes were serialized as null")
    return _slice_bytes(buf, pos, n - 1)


def r_ncbytes(buf: Any, pos: int) -> tuple[bytes | None, int]:
    n, pos = r_uv(buf, pos)
    if n == 0:
        return None, pos
    return _slice_bytes(buf, pos, n - 1)


# skipping: same validation, no copies


def s_str(buf: Any, pos: int) -> int:
    (n,) = _h.unpack_from(buf, pos)
    if n < -1:
        raise CodecError(f"negative string length {n}")
    pos += 2
    if n > 0:
        pos += n
        if pos > len(buf):
            raise _short("string", n, len(buf) - pos + n)
    return pos


def s_bytes(buf: Any, pos: int) -> int:
    (n,) = _i.unpack_from(buf, pos)
    if n < -1:
        raise CodecError(f"negative bytes length {n}")
    pos += 4
    if n > 0:
        pos += n
        if pos > len(buf):
            raise _short("bytes", n, len(buf) - pos + n)
    return pos


def s_compact(buf: Any, pos: int) -> int:
    n = buf[pos]
    if n < 0x80:
        pos += 1
    else:
        n, pos = r_uv(buf, pos)
    if n > 1:
        pos += n - 1
        if pos > len(buf):
            raise _short("field", n - 1, len(buf) - pos + n - 1)
    return pos


def _enc(s: str) -> bytes:
    try:
        return s.encode("utf-8")
    except AttributeError:
        raise CodecError(f"expected a string, got {type(s).__name__}") from None


def w_str(out: bytearray, s: str | None, name: str) -> None:
    if s is None:
        raise null_error(name)
    b = _enc(s)
    if len(b) > 0x7FFF:
        raise CodecError(f"string field {name} longer than 32767 bytes")
    out += _h.pack(len(b))
    out += b


def w_nstr(out: bytearray, s: str | None, name: str) -> None:
    if s is None:
        out += b"\xff\xff"
        return
    w_str(out, s, name)


def w_cstr(out: bytearray, s: str | None, name: str) -> None:
    if s is None:
        raise null_error(name)
    b = _enc(s)
    w_uv(out, len(b) + 1)
    out += b


def w_ncstr(out: bytearray, s: str | None, name: str) -> None:
    if s is None:
        out.append(0)
        return
    b = _enc(s)
    w_uv(out, len(b) + 1)
    out += b


def _buf(b: Any, name: str) -> Any:
    if not isinstance(b, bytes | bytearray | memoryview):
        raise CodecError(f"field {name}: expected bytes, got {type(b).__name__}")
    return b


def w_bytes(out: bytearray, b: Any, name: str) -> None:
    if b is None:
        raise null_error(name)
    b = _buf(b, name)
    out += _i.pack(len(b))
    out += b


def w_nbytes(out: bytearray, b: Any, name: str) -> None:
    if b is None:
        out += b"\xff\xff\xff\xff"
        return
    w_bytes(out, b, name)


def w_cbytes(out: bytearray, b: Any, name: str) -> None:
    if b is None:
        raise null_error(name)
    b = _buf(b, name)
    w_uv(out, len(b) + 1)
    out += b


def w_ncbytes(out: bytearray, b: Any, name: str) -> None:
    if b is None:
        out.append(0)
        return
    w_cbytes(out, b, name)


def w_cnt(out: bytearray, x: Any, name: str, nullable: bool) -> None:
    if x is None:
        if not nullable:
            raise null_error(name)
        out += b"\xff\xff\xff\xff"
    else:
        out += _i.pack(len(x))


def w_ccnt(out: bytearray, x: Any, name: str, nullable: bool) -> None:
    if x is None:
        if not nullable:
            raise null_error(name)
        out.append(0)
    else:
        w_uv(out, len(x) + 1)


# ---- tagged fields ------------------------------------------------------------------------


def tag_entries(buf: Any, pos: int) -> tuple[list[tuple[int, int, int]], int]:
    """Parse a tagged-field section: ``[(tag, data_start, data_end)]`` and the end position."""
    n, pos = r_uv(buf, pos)
    if n > len(buf) - pos:
        raise _short("tagged field section", n, len(buf) - pos)
    out = []
    for _ in range(n):
        tag, pos = r_uv(buf, pos)
        size, pos = r_uv(buf, pos)
        end = pos + size
        if end > len(buf):
            raise _short("tagged field", size, len(buf) - pos)
        out.append((tag, pos, end))
        pos = end
    return out, pos


def r_unknown_tags(buf: Any, pos: int) -> tuple[dict[int, bytes] | None, int]:
    entries, pos = tag_entries(buf, pos)
    if not entries:
        return None, pos
    return {t: bytes(buf[s:e]) for t, s, e in entries}, pos


def s_tags(buf: Any, pos: int) -> int:
    if buf[pos] == 0:
        return pos + 1
    return tag_entries(buf, pos)[1]


def w_tags(out: bytearray, entries: list[tuple[int, Any]]) -> None:
    entries.sort(key=lambda e: e[0])
    w_uv(out, len(entries))
    for tag, data in entries:
        w_uv(out, tag)
        w_uv(out, len(data))
        out += data


def check_end(buf: Any, pos: int) -> int:
    if pos > len(buf):
        raise CodecError(f"message truncated: needs {pos} bytes, has {len(buf)}")
    return pos


RUNTIME: dict[str, Any] = {
    name: obj
    for name, obj in globals().items()
    if callable(obj) and (name.startswith(("r_", "w_", "s_", "mk_", "uuid_", "null_", "check_",
                                            "tag_")))
}
RUNTIME.update(CodecError=CodecError, _unpack_from=struct.unpack_from, _pack=struct.pack)
