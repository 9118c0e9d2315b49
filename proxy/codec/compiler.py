"""Compile one (message schema, version) into specialised decode / encode / skip functions.

For every struct reachable from the message the compiler emits Python source with the version
already resolved: absent fields become constants, consecutive fixed-width fields are read and
written with a single ``struct.Struct``, and flexible versions get compact lengths and a
tagged-field section. The source is ``exec``-ed once and cached per version (the approach
kafka-python 3 takes; measured in ``docs/decisions/0001-message-codec.md``).

Values are plain dicts keyed by snake_case field names. Unknown tagged fields are kept under
``"_unknown_tagged"`` (``{tag: raw bytes}``) and written back on encode. Besides whole-message
functions, each top-level field gets its own decode/encode/skip function so that rewriters can
splice one field (Metadata's brokers array) or reach the top-level tagged fields (KIP-951
NodeEndpoints) without touching the rest of the message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.codec._runtime import RUNTIME
from proxy.codec.schema import FIXED_TYPES, FieldSchema, MessageSchema, StructSchema

UNKNOWN_TAGGED = "_unknown_tagged"

Decoder = Callable[[Any, int], tuple[Any, int]]
Encoder = Callable[[Any, bytearray], None]
Skipper = Callable[[Any, int], int]


@dataclass(frozen=True, slots=True)
class TopField:
    """One top-level field of a compiled message version."""

    key: str
    tag: int | None  # None for untagged fields
    decode: Decoder
    encode: Encoder
    skip: Skipper | None  # untagged fields only


@dataclass(frozen=True, slots=True)
class Compiled:
    """The functions for one (message, version)."""

    name: str
    version: int
    flexible: bool
    decode: Decoder
    encode_into: Encoder
    skip: Skipper
    tagged_start: Skipper  # position of the top-level tagged section (or the end if not flexible)
    fields: tuple[TopField, ...]
    source: str

    def encode(self, value: Any) -> bytes:
        out = bytearray()
        self.encode_into(value, out)
        return bytes(out)

    def field(self, key: str) -> TopField:
        for f in self.fields:
            if f.key == key:
                return f
        raise KeyError(key)


class _Gen:
    def __init__(self, msg: MessageSchema, version: int) -> None:
        self.msg = msg
        self.v = version
        self.flex = msg.is_flexible(version)
        self.globs: dict[str, Any] = dict(RUNTIME)
        self.src: list[str] = []
        self.n = 0
        self.done: dict[int, str] = {}

    # -- helpers ---------------------------------------------------------------------------

    def const(self, value: Any, hint: str = "K") -> str:
        self.n += 1
        name = f"_{hint}{self.n}"
        self.globs[name] = value
        return name

    def active(self, s: StructSchema) -> list[FieldSchema]:
        return [f for f in s.fields if self.v in f.versions]

    def is_tagged(self, f: FieldSchema) -> bool:
        return self.flex and self.v in f.tagged and f.tag is not None

    def fflex(self, f: FieldSchema) -> bool:
        return self.flex and (f.flexible is None or self.v in f.flexible)

    def nullable(self, f: FieldSchema) -> bool:
        return self.v in f.nullable

    def fixed(self, f: FieldSchema) -> bool:
        return not f.is_array and f.struct is None and f.type in FIXED_TYPES

    # -- structs ---------------------------------------------------------------------------

    def struct_fns(self, s: StructSchema) -> str:
        """Emit d_/e_/s_ functions for ``s``; return their common suffix."""
        if id(s) in self.done:
            return self.done[id(s)]
        self.n += 1
        sfx = f"{s.name}_{self.n}"
        self.done[id(s)] = sfx
        fields = self.active(s)
        untagged = [f for f in fields if not self.is_tagged(f)]
        tagged = [f for f in fields if self.is_tagged(f)]
        self._emit_decode(s, sfx, untagged, tagged)
        self._emit_encode(sfx, untagged, tagged)
        self._emit_skip(sfx, untagged)
        return sfx

    def _runs(self, fields: list[FieldSchema]) -> list[list[FieldSchema]]:
        runs: list[list[FieldSchema]] = []
        for f in fields:
            if self.fixed(f) and runs and self.fixed(runs[-1][0]):
                runs[-1].append(f)
            else:
                runs.append([f])
        return runs

    def _emit_decode(self, s: StructSchema, sfx: str, untagged: list[FieldSchema],
                     tagged: list[FieldSchema]) -> None:
        L = [f"def d_{sfx}(buf, pos):"]
        var: dict[str, str] = {}
        for i, f in enumerate(untagged + tagged):
            var[f.key] = f"x{i}"
        for run in self._runs(untagged):
            if self.fixed(run[0]):
                st = struct.Struct(">" + "".join(FIXED_TYPES[f.type][0] for f in run))
                sn = self.const(st, "S")
                names = ", ".join(var[f.key] for f in run)
                L.append(f"    {names}, = {sn}.unpack_from(buf, pos)")
                L.append(f"    pos += {st.size}")
                for f in run:
                    if f.type == "uuid":
                        L.append(f"    {var[f.key]} = mk_uuid({var[f.key]})")
            else:
                L.extend(self.read(run[0], var[run[0].key], "    "))
        if self.flex:
            for f in tagged:
                L.append(f"    {var[f.key]} = {self.default_expr(f)}")
            L.append("    u = None")
            L.append("    if buf[pos]:")
            if tagged:
                L.append("        ents, pos = tag_entries(buf, pos)")
                L.append("        for tag, pos, end in ents:")
                kw = "if"
                for f in tagged:
                    L.append(f"            {kw} tag == {f.tag}:")
                    L.extend(self.read(f, var[f.key], "                "))
                    L.append("                if pos != end:")
                    L.append(f"                    raise CodecError('tagged field {f.name} "
                             "size does not match its content')")
                    kw = "elif"
                L.append("            else:")
                L.append("                if u is None:")
                L.append("                    u = {}")
                L.append("                u[tag] = bytes(buf[pos:end])")
                L.append("        pos = ents[-1][2] if ents else pos")
            else:
                L.append("        u, pos = r_unknown_tags(buf, pos)")
            L.append("    else:")
            L.append("        pos += 1")
        items = []
        for f in s.fields:
            if f.key in var:
                items.append(f"{f.key!r}: {var[f.key]}")
            else:
                items.append(f"{f.key!r}: {self.default_expr(f)}")
        L.append("    r = {" + ", ".join(items) + "}")
        if self.flex:
            L.append("    if u is not None:")
            L.append(f"        r[{UNKNOWN_TAGGED!r}] = u")
        L.append("    return r, pos")
        self.src.append("\n".join(L))

    def default_expr(self, f: FieldSchema) -> str:
        d = f.default(self.v)
        if f.is_array:
            return "None" if d is None else "[]"
        if isinstance(d, dict):
            return f"{self.const(lambda d=d: _deep_copy(d), 'DF')}()"
        if isinstance(d, int | float | str | bool | type(None)) :
            return repr(d)
        return self.const(d, "D")

    def read(self, f: FieldSchema, x: str, ind: str) -> list[str]:
        """Lines that read field ``f`` at ``pos`` into ``x`` and advance ``pos``."""
        flex = self.fflex(f)
        nul = self.nullable(f)
        if f.is_array:
            L = [f"{ind}n, pos = {'r_ccnt' if flex else 'r_cnt'}(buf, pos)",
                 f"{ind}if n < 0:"]
            L.append(f"{ind}    {x} = None" if nul else f"{ind}    raise null_error({f.name!r})")
            L.append(f"{ind}else:")
            i2 = ind + "    "
            if f.struct is None and f.type in FIXED_TYPES and f.type != "uuid":
                code, size = FIXED_TYPES[f.type]
                L.append(f"{i2}{x} = list(_unpack_from('>%d{code}' % n, buf, pos))")
                L.append(f"{i2}pos += n * {size}")
            else:
                L.append(f"{i2}{x} = []")
                L.append(f"{i2}ap = {x}.append")
                L.append(f"{i2}for _ in range(n):")
                L.extend(self.read_elem(f, "e", i2 + "    "))
                L.append(f"{i2}    ap(e)")
            return L
        if f.struct is not None:
            sfx = self.struct_fns(f.struct)
            if nul:
                return [f"{ind}if buf[pos] >= 128:",
                        f"{ind}    {x} = None",
                        f"{ind}    pos += 1",
                        f"{ind}else:",
                        f"{ind}    {x}, pos = d_{sfx}(buf, pos + 1)"]
            return [f"{ind}{x}, pos = d_{sfx}(buf, pos)"]
        return self.read_elem(f, x, ind, nullable=nul)

    def read_elem(self, f: FieldSchema, x: str, ind: str, nullable: bool = False) -> list[str]:
        flex = self.fflex(f)
        t = f.type
        if f.struct is not None:
            return [f"{ind}{x}, pos = d_{self.struct_fns(f.struct)}(buf, pos)"]
        if t in FIXED_TYPES:
            code, size = FIXED_TYPES[t]
            sn = self.const(struct.Struct(">" + code), "S")
            L = [f"{ind}{x}, = {sn}.unpack_from(buf, pos)", f"{ind}pos += {size}"]
            if t == "uuid":
                L.append(f"{ind}{x} = mk_uuid({x})")
            return L
        if t == "string":
            fn = ("r_ncstr" if nullable else "r_cstr") if flex else (
                "r_nstr" if nullable else "r_str")
        else:  # bytes, records
            fn = ("r_ncbytes" if nullable else "r_cbytes") if flex else (
                "r_nbytes" if nullable else "r_bytes")
        return [f"{ind}{x}, pos = {fn}(buf, pos)"]

    # -- encode ----------------------------------------------------------------------------

    def _emit_encode(self, sfx: str, untagged: list[FieldSchema],
                     tagged: list[FieldSchema]) -> None:
        L = [f"def e_{sfx}(v, out):", "    g = v.get"]
        for run in self._runs(untagged):
            if self.fixed(run[0]):
                st = struct.Struct(">" + "".join(FIXED_TYPES[f.type][0] for f in run))
                sn = self.const(st, "S")
                args = []
                for f in run:
                    a = f"g({f.key!r}, {self.enc_default(f)})"
                    args.append(f"uuid_bytes({a})" if f.type == "uuid" else a)
                L.append(f"    out += {sn}.pack({', '.join(args)})")
            else:
                f = run[0]
                L.append(f"    x = g({f.key!r}, {self.enc_default(f)})")
                L.extend(self.write(f, "x", "out", "    "))
        if self.flex:
            L.append(f"    u = g({UNKNOWN_TAGGED!r})")
            if tagged:
                L.append("    tg = []")
                for f in tagged:
                    if f.is_array:
                        L.append(f"    x = g({f.key!r}, {self.enc_default(f)})")
                        cond = "x is not None" if f.default(self.v) is None else "x"
                    else:
                        dn = self.const(f.default(self.v), "D")
                        L.append(f"    x = g({f.key!r}, {dn})")
                        cond = f"x != {dn}"
                    L.append(f"    if {cond}:")
                    L.append("        tb = bytearray()")
                    L.extend(self.write(f, "x", "tb", "        "))
                    L.append(f"        tg.append(({f.tag}, tb))")
                L.append("    if u:")
                L.append("        tg.extend(u.items())")
                L.append("    if tg:")
                L.append("        w_tags(out, tg)")
                L.append("    else:")
                L.append("        out.append(0)")
            else:
                L.append("    if u:")
                L.append("        w_tags(out, list(u.items()))")
                L.append("    else:")
                L.append("        out.append(0)")
        self.src.append("\n".join(L))

    def enc_default(self, f: FieldSchema) -> str:
        d = f.default(self.v)
        if f.is_array:
            return "None" if d is None else "()"
        if isinstance(d, dict):
            return self.const({}, "E")  # an empty struct encodes as all defaults
        if isinstance(d, int | float | str | bool | type(None)):
            return repr(d)
        return self.const(d, "D")

    def write(self, f: FieldSchema, x: str, out: str, ind: str) -> list[str]:
        flex = self.fflex(f)
        nul = self.nullable(f)
        if f.is_array:
            L = [f"{ind}{'w_ccnt' if flex else 'w_cnt'}({out}, {x}, {f.name!r}, {nul})",
                 f"{ind}if {x}:"]
            i2 = ind + "    "
            if f.struct is None and f.type in FIXED_TYPES and f.type != "uuid":
                code = FIXED_TYPES[f.type][0]
                L.append(f"{i2}{out} += _pack('>%d{code}' % len({x}), *{x})")
            else:
                L.append(f"{i2}for e in {x}:")
                L.extend(self.write_elem(f, "e", out, i2 + "    "))
            return L
        if f.struct is not None:
            sfx = self.struct_fns(f.struct)
            if nul:
                return [f"{ind}if {x} is None:",
                        f"{ind}    {out}.append(255)",
                        f"{ind}else:",
                        f"{ind}    {out}.append(1)",
                        f"{ind}    e_{sfx}({x}, {out})"]
            return [f"{ind}if {x} is None:",
                    f"{ind}    raise null_error({f.name!r})",
                    f"{ind}e_{sfx}({x}, {out})"]
        return self.write_elem(f, x, out, ind, nullable=nul)

    def write_elem(self, f: FieldSchema, x: str, out: str, ind: str,
                   nullable: bool = False) -> list[str]:
        flex = self.fflex(f)
        t = f.type
        if f.struct is not None:
            return [f"{ind}e_{self.struct_fns(f.struct)}({x}, {out})"]
        if t in FIXED_TYPES:
            code = FIXED_TYPES[t][0]
            sn = self.const(struct.Struct(">" + code), "S")
            val = f"uuid_bytes({x})" if t == "uuid" else x
            return [f"{ind}{out} += {sn}.pack({val})"]
        if t == "string":
            fn = ("w_ncstr" if nullable else "w_cstr") if flex else (
                "w_nstr" if nullable else "w_str")
        else:
            fn = ("w_ncbytes" if nullable else "w_cbytes") if flex else (
                "w_nbytes" if nullable else "w_bytes")
        return [f"{ind}{fn}({out}, {x}, {f.name!r})"]

    # -- skip ------------------------------------------------------------------------------

    def _emit_skip(self, sfx: str, untagged: list[FieldSchema]) -> None:
        L = [f"def s_{sfx}(buf, pos):"]
        for run in self._runs(untagged):
            if self.fixed(run[0]):
                L.append(f"    pos += {sum(FIXED_TYPES[f.type][1] for f in run)}")
            else:
                L.extend(self.skip(run[0], "    "))
        if self.flex:
            L.append("    pos = s_tags(buf, pos)")
        L.append("    return pos")
        self.src.append("\n".join(L))

    # Skipping is the hot path of the Fetch NodeEndpoints check, so nested structs, counts,
    # compact lengths and empty tagged sections are inlined instead of calling helpers.
    MAX_INLINE_DEPTH = 4

    def skip(self, f: FieldSchema, ind: str, depth: int = 0) -> list[str]:
        flex = self.fflex(f)
        if f.is_array:
            n = f"n{depth}"
            if flex:
                L = [f"{ind}{n} = buf[pos]",
                     f"{ind}if {n} < 128:",
                     f"{ind}    pos += 1",
                     f"{ind}else:",
                     f"{ind}    {n}, pos = r_uv(buf, pos)",
                     f"{ind}{n} -= 1",
                     f"{ind}if {n} > len(buf) - pos:",
                     f"{ind}    raise CodecError('array count exceeds the bytes remaining')"]
            else:
                L = [f"{ind}{n}, pos = r_cnt(buf, pos)"]
            if f.struct is None and f.type in FIXED_TYPES:
                size = FIXED_TYPES[f.type][1]
                L.append(f"{ind}if {n} > 0:")
                L.append(f"{ind}    pos += {n} * {size}")
            else:
                L.append(f"{ind}for _ in range({n}):")
                L.extend(self.skip_elem(f, ind + "    ", depth + 1))
            return L
        if f.struct is not None and self.nullable(f):
            return [f"{ind}if buf[pos] >= 128:",
                    f"{ind}    pos += 1",
                    f"{ind}else:",
                    f"{ind}    pos += 1",
                    *self.skip_elem(f, ind + "    ", depth + 1)]
        return self.skip_elem(f, ind, depth)

    def skip_struct_inline(self, st: StructSchema, ind: str, depth: int) -> list[str]:
        fields = [f for f in self.active(st) if not self.is_tagged(f)]
        L: list[str] = []
        for run in self._runs(fields):
            if self.fixed(run[0]):
                L.append(f"{ind}pos += {sum(FIXED_TYPES[f.type][1] for f in run)}")
            else:
                L.extend(self.skip(run[0], ind, depth))
        if self.flex:
            L += [f"{ind}if buf[pos]:",
                  f"{ind}    pos = s_tags(buf, pos)",
                  f"{ind}else:",
                  f"{ind}    pos += 1"]
        return L or [f"{ind}pass"]

    def skip_elem(self, f: FieldSchema, ind: str, depth: int = 0) -> list[str]:
        if f.struct is not None:
            if depth <= self.MAX_INLINE_DEPTH:
                return self.skip_struct_inline(f.struct, ind, depth)
            return [f"{ind}pos = s_{self.struct_fns(f.struct)}(buf, pos)"]
        if f.type in FIXED_TYPES:
            return [f"{ind}pos += {FIXED_TYPES[f.type][1]}"]
        if self.fflex(f):
            return [f"{ind}k = buf[pos]",
                    f"{ind}if k < 128:",
                    f"{ind}    pos += 1",
                    f"{ind}elif buf[pos + 1] < 128:",
                    f"{ind}    k = (k & 127) | (buf[pos + 1] << 7)",
                    f"{ind}    pos += 2",
                    f"{ind}else:",
                    f"{ind}    k, pos = r_uv(buf, pos)",
                    f"{ind}if k > 1:",
                    f"{ind}    pos += k - 1"]
        return [f"{ind}pos = {'s_str' if f.type == 'string' else 's_bytes'}(buf, pos)"]

    # -- top level -------------------------------------------------------------------------

    def top_fields(self) -> list[str]:
        """Per top-level field functions: fd_i / fe_i / fs_i."""
        s = self.msg.struct
        names = []
        for i, f in enumerate(self.active(s)):
            names.append(f.key)
            L = [f"def fd_{i}(buf, pos):"]
            L.extend(self.read(f, "x", "    "))
            L.append("    return x, pos")
            L.append(f"def fe_{i}(x, out):")
            L.extend(self.write(f, "x", "out", "    ") or ["    pass"])
            if not self.is_tagged(f):
                L.append(f"def fs_{i}(buf, pos):")
                L.extend(self.skip(f, "    "))
                L.append("    return check_end(buf, pos)")
            self.src.append("\n".join(L))
        return names

    def tagged_start(self) -> None:
        s = self.msg.struct
        L = ["def tagged_start(buf, pos):"]
        for run in self._runs([f for f in self.active(s) if not self.is_tagged(f)]):
            if self.fixed(run[0]):
                L.append(f"    pos += {sum(FIXED_TYPES[f.type][1] for f in run)}")
            else:
                L.extend(self.skip(run[0], "    "))
        L.append("    return check_end(buf, pos)")
        self.src.append("\n".join(L))


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def compile_message(msg: MessageSchema, version: int) -> Compiled:
    g = _Gen(msg, version)
    top = g.struct_fns(msg.struct)
    names = g.top_fields()
    g.tagged_start()
    source = "\n\n".join(g.src) + "\n"
    globs = g.globs
    exec(compile(source, f"<kafka:{msg.name}v{version}>", "exec"), globs)
    active = g.active(msg.struct)
    fields = tuple(
        TopField(
            key=names[i],
            tag=f.tag if g.is_tagged(f) else None,
            decode=globs[f"fd_{i}"],
            encode=globs[f"fe_{i}"],
            skip=globs.get(f"fs_{i}"),
        )
        for i, f in enumerate(active)
    )
    return Compiled(
        name=msg.name,
        version=version,
        flexible=g.flex,
        decode=globs[f"d_{top}"],
        encode_into=globs[f"e_{top}"],
        skip=globs[f"s_{top}"],
        tagged_start=globs["tagged_start"],
        fields=fields,
        source=source,
    )
