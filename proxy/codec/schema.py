"""Kafka JSON message schemas as a small typed model.

Kafka describes every message in ``common/message/*.json`` (JSON with ``//`` comments): fields,
their types, the versions they exist in, nullability, tagged fields and defaults. This module
loads the vendored copies in ``proxy/codec/schemas/`` into :class:`MessageSchema` objects; the
compiler in :mod:`proxy.codec.compiler` turns one (message, version) into decode/encode/skip
functions. Nothing here knows about any particular API: per-version rules come from the files.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from proxy.codec.errors import CodecError

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"

MAX_VERSION = 0x7FFF

FIXED_TYPES: dict[str, tuple[str, int]] = {
    "int8": ("b", 1),
    "int16": ("h", 2),
    "int32": ("i", 4),
    "int64": ("q", 8),
    "uint16": ("H", 2),
    "uint32": ("I", 4),
    "float64": ("d", 8),
    "bool": ("?", 1),
    "uuid": ("16s", 16),
}
VAR_TYPES = frozenset({"string", "bytes", "records"})
ZERO_UUID = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class Versions:
    """An inclusive version range; ``lo > hi`` means no version."""

    lo: int
    hi: int

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.lo <= version <= self.hi

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    @staticmethod
    def parse(text: str | None) -> Versions:
        if text is None or text.strip() == "none":
            return NO_VERSIONS
        t = text.strip()
        if t.endswith("+"):
            return Versions(int(t[:-1]), MAX_VERSION)
        if "-" in t:
            lo, hi = t.split("-", 1)
            return Versions(int(lo), int(hi))
        v = int(t)
        return Versions(v, v)


NO_VERSIONS = Versions(1, 0)


def snake_case(name: str) -> str:
    """``ProtocolType`` -> ``protocol_type``; ``KRaftVersion`` -> ``k_raft_version``."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


@dataclass(slots=True)
class StructSchema:
    name: str
    fields: list[FieldSchema]


@dataclass(slots=True)
class FieldSchema:
    name: str
    key: str
    type: str  # element type for arrays; struct name for structs
    is_array: bool
    versions: Versions
    nullable: Versions
    tagged: Versions
    tag: int | None
    flexible: Versions | None  # per-field override of the message's flexible versions
    default_text: str | None
    struct: StructSchema | None = None
    ignorable: bool = False

    @property
    def is_struct(self) -> bool:
        return self.struct is not None

    def default(self, version: int) -> Any:
        """The value a missing field takes (Kafka's rules: 0, false, "", empty, or ``default``)."""
        if self.is_array:
            if self.default_text == "null" and (
                    version in self.nullable or version not in self.versions):
                return None
            return []
        if self.struct is not None:
            if version in self.nullable and self.default_text in (None, "null"):
                return None
            return struct_default(self.struct, version)
        t = self.type
        d = self.default_text
        if d == "null":
            if version in self.nullable or version not in self.versions:
                return None
            d = None
        if t == "string":
            return "" if d is None else d
        if t == "records":
            return None if version in self.nullable else b""
        if t == "bytes":
            return b""
        if t == "bool":
            return d is not None and d.strip() == "true"
        if t == "uuid":
            return ZERO_UUID if d is None else uuid.UUID(d)
        if t == "float64":
            return 0.0 if d is None else float(d)
        if d is None or d.strip() == "":
            return 0
        d = d.strip()
        return int(d, 16) if d.lower().startswith(("0x", "-0x")) else int(d)


def struct_default(struct: StructSchema, version: int) -> dict[str, Any]:
    return {f.key: f.default(version) for f in struct.fields}


@dataclass(slots=True)
class MessageSchema:
    name: str
    type: str  # request | response | header | data
    api_key: int | None
    valid: Versions
    flexible: Versions
    struct: StructSchema
    raw: dict[str, Any] = field(repr=False, default_factory=dict)

    def is_flexible(self, version: int) -> bool:
        return version in self.flexible


_COMMENT = re.compile(r'"(?:\\.|[^"\\])*"|//[^\n]*|/\*.*?\*/', re.S)


def strip_comments(text: str) -> str:
    """Remove ``//`` and ``/* */`` comments that are not inside JSON strings."""
    return _COMMENT.sub(lambda m: m.group(0) if m.group(0).startswith('"') else "", text)


def _default_text(d: Any) -> str | None:
    if d is None or isinstance(d, str):
        return d
    if isinstance(d, bool):
        return "true" if d else "false"
    return str(d)


def _parse_field(obj: dict[str, Any], common: dict[str, dict[str, Any]]) -> FieldSchema:
    try:
        name = obj["name"]
        typ = obj["type"]
    except KeyError as e:
        raise CodecError(f"schema field without {e.args[0]}: {obj!r}") from None
    is_array = typ.startswith("[]")
    elem = typ[2:] if is_array else typ
    tagged = Versions.parse(obj.get("taggedVersions"))
    f = FieldSchema(
        name=name,
        key=snake_case(name),
        type=elem,
        is_array=is_array,
        versions=Versions.parse(obj.get("versions")),
        nullable=Versions.parse(obj.get("nullableVersions")),
        tagged=tagged,
        tag=obj.get("tag"),
        flexible=Versions.parse(obj["flexibleVersions"]) if "flexibleVersions" in obj else None,
        default_text=_default_text(obj.get("default")),
        ignorable=bool(obj.get("ignorable", False)),
    )
    if elem not in FIXED_TYPES and elem not in VAR_TYPES:
        sub = obj.get("fields")
        if sub is None:
            ref = common.get(elem)
            if ref is None:
                raise CodecError(f"field {name}: unknown type {elem}")
            sub = ref["fields"]
        f.struct = StructSchema(elem, [_parse_field(s, common) for s in sub])
    return f


def parse_schema(text: str) -> MessageSchema:
    raw = json.loads(strip_comments(text))
    common = {c["name"]: c for c in raw.get("commonStructs", [])}
    fields = [_parse_field(f, common) for f in raw["fields"]]
    return MessageSchema(
        name=raw["name"],
        type=raw["type"],
        api_key=raw.get("apiKey"),
        valid=Versions.parse(raw["validVersions"]),
        flexible=Versions.parse(raw.get("flexibleVersions")),
        struct=StructSchema(raw["name"], fields),
        raw=raw,
    )


@cache
def load(name: str) -> MessageSchema:
    """Load the vendored schema ``name`` (e.g. ``"MetadataResponse"``)."""
    path = SCHEMA_DIR / f"{name}.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CodecError(f"no vendored schema {name}") from None
    return parse_schema(text)


@cache
def all_messages() -> dict[tuple[int, str], MessageSchema]:
    """Every vendored request/response schema, keyed by (api_key, "request"|"response")."""
    out: dict[tuple[int, str], MessageSchema] = {}
    paths = [*SCHEMA_DIR.glob("*Request.json"), *SCHEMA_DIR.glob("*Response.json")]
    for path in sorted(paths):
        m = load(path.stem)
        if m.api_key is not None and m.type in ("request", "response"):
            out[(m.api_key, m.type)] = m
    return out
