"""Hypothesis strategies that build random message values from the vendored schemas.

Values only contain the fields that exist in the requested version (what a peer could send),
so ``decode(encode(v))`` must give back ``v`` plus schema defaults for absent fields.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from hypothesis import strategies as st

from proxy.codec import messages
from proxy.codec.compiler import UNKNOWN_TAGGED
from proxy.codec.schema import FieldSchema, MessageSchema, StructSchema

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}

FUZZ_SCALE = int(os.environ.get("GROUPGATE_FUZZ_SCALE", "1"))


def examples(n: int) -> int:
    """Hypothesis example count, scaled by ``GROUPGATE_FUZZ_SCALE`` for longer fuzzing runs."""
    return n * FUZZ_SCALE


short_text = st.text(max_size=6)  # text() never yields lone surrogates


def _scalar(f: FieldSchema) -> st.SearchStrategy[Any]:
    t = f.type
    if t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, -1 if lo < 0 else 1]))
    if t == "bool":
        return st.booleans()
    if t == "float64":
        return st.floats(allow_nan=False)
    if t == "uuid":
        return st.uuids() | st.just(uuid.UUID(int=0))
    if t == "string":
        return short_text
    if t in ("bytes", "records"):
        return st.binary(max_size=12)
    raise AssertionError(t)


class ValueStrategies:
    def __init__(self, msg: MessageSchema, version: int, unknown_tags: bool = True,
                 max_list: int = 3) -> None:
        self.msg = msg
        self.v = version
        self.flex = msg.is_flexible(version)
        self.unknown_tags = unknown_tags and self.flex
        self.max_list = max_list

    def field(self, f: FieldSchema) -> st.SearchStrategy[Any]:
        nullable = self.v in f.nullable
        if f.is_array:
            elem = self.struct(f.struct) if f.struct is not None else _scalar(f)
            s: st.SearchStrategy[Any] = st.lists(elem, max_size=self.max_list)
        elif f.struct is not None:
            s = self.struct(f.struct)
        else:
            s = _scalar(f)
        return st.none() | s if nullable else s

    def struct(self, s: StructSchema) -> st.SearchStrategy[dict[str, Any]]:
        active = [f for f in s.fields if self.v in f.versions]
        req = {f.key: self.field(f) for f in active}
        strat = st.fixed_dictionaries(req)
        if self.unknown_tags:
            known = {f.tag for f in active if f.tag is not None}
            tags = st.dictionaries(
                st.integers(0, 200).filter(lambda t: t not in known),
                st.binary(max_size=5), max_size=2)
            return st.tuples(strat, tags).map(_with_tags)
        return strat

    def message(self) -> st.SearchStrategy[dict[str, Any]]:
        return self.struct(self.msg.struct)


def _with_tags(pair: tuple[dict[str, Any], dict[int, bytes]]) -> dict[str, Any]:
    value, tags = pair
    if tags:
        value = dict(value)
        value[UNKNOWN_TAGGED] = tags
    return value


def message_values(api_key: int, version: int, response: bool, **kw: Any
                   ) -> st.SearchStrategy[dict[str, Any]]:
    return ValueStrategies(messages.schema(api_key, response), version, **kw).message()


def versions(api_key: int, response: bool = False) -> st.SearchStrategy[int]:
    v = messages.schema(api_key, response).valid
    return st.integers(v.lo, v.hi)


def project(value: Any, s: StructSchema, version: int) -> Any:
    """Keep only the fields of ``s`` that exist in ``version`` (recursively)."""
    if value is None:
        return None
    out: dict[str, Any] = {}
    for f in s.fields:
        if version not in f.versions:
            continue
        x = value.get(f.key)
        if f.struct is not None and x is not None:
            x = [project(e, f.struct, version) for e in x] if f.is_array else project(
                x, f.struct, version)
        out[f.key] = x
    if UNKNOWN_TAGGED in value:
        out[UNKNOWN_TAGGED] = value[UNKNOWN_TAGGED]
    return out


def mutations(data: bytes) -> st.SearchStrategy[bytes]:
    """Truncations, byte flips, insertions and deletions of a valid encoding."""
    n = len(data)
    if n == 0:
        return st.binary(max_size=8)
    idx = st.integers(0, n - 1)
    return st.one_of(
        st.integers(0, n - 1).map(lambda i: data[:i]),
        st.tuples(idx, st.integers(0, 255)).map(lambda p: data[:p[0]] + bytes([p[1]])
                                                + data[p[0] + 1:]),
        st.tuples(idx, st.binary(min_size=1, max_size=4)).map(
            lambda p: data[:p[0]] + p[1] + data[p[0]:]),
        st.tuples(idx, st.integers(1, 4)).map(lambda p: data[:p[0]] + data[p[0] + p[1]:]),
        st.tuples(idx, st.sampled_from([b"\xff\xff\xff\xff", b"\x7f\xff\xff\xff", b"\xff\xff",
                                        b"\x80\x80\x80\x80\x80", b"\xff\xff\xff\xff\x0f"])).map(
            lambda p: data[:p[0]] + p[1] + data[p[0] + len(p[1]):]),
    )


ALL_KEYS = sorted(messages.api_keys())
