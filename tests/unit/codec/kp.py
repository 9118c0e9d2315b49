"""Bridge to kafka-python 3.0.12's protocol classes, used as an independent implementation.

kafka-python names some fields differently and represents values as objects, so values are
compared as the sequence of leaves in wire order (untagged fields, then tagged fields by tag).
"""

from __future__ import annotations

import uuid
import warnings
from typing import Any

with warnings.catch_warnings():
    # kafka-python 3.0.12 loads its schemas with a deprecated importlib.resources call
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka.protocol.admin
    import kafka.protocol.consumer
    import kafka.protocol.metadata
    import kafka.protocol.producer  # noqa: F401  (registers the classes)
    from kafka.protocol.api_header import RequestHeader as KpRequestHeader
    from kafka.protocol.api_message import ApiMessage
    from kafka.protocol.metadata import ApiVersionsResponse as KpApiVersionsResponse
    from kafka.protocol.metadata import MetadataResponse as KpMetadataResponse

__all__ = ["KpApiVersionsResponse", "KpMetadataResponse", "KpRequestHeader"]

from proxy.codec.compiler import UNKNOWN_TAGGED
from proxy.codec.schema import StructSchema


def _subclasses(c: type) -> Any:
    s: type
    for s in c.__subclasses__():
        yield s
        yield from _subclasses(s)


CLASSES: dict[tuple[int, bool], Any] = {}
for _c in _subclasses(ApiMessage):
    try:
        _key, _typ = _c.API_KEY, _c.type
    except Exception:  # abstract helpers without a schema
        continue
    if getattr(_c, "_class_version", None) is None:
        CLASSES[(_key, _typ == "response")] = _c


def kp_max_version(api_key: int, response: bool) -> int | None:
    c = CLASSES.get((api_key, response))
    return None if c is None else int(c.max_version)


def _norm(x: Any) -> Any:
    if isinstance(x, bytes | bytearray | memoryview):
        return bytes(x)
    if isinstance(x, uuid.UUID):
        return None if x.int == 0 else x  # kafka-python reads the zero uuid as None
    if isinstance(x, list | tuple):
        return tuple(_norm(e) for e in x)
    return x


def kp_leaves(obj: Any, sf: Any, version: int, flexible: bool, out: list[Any]) -> None:
    fields = list(sf.untagged_fields(version))
    if flexible:
        fields += sorted(sf.tagged_fields(version)._fields, key=lambda f: f.tag)
    for f in fields:
        x = getattr(obj, f.name)
        if f.is_struct() and not f.is_struct_array() and x == f.default:
            x = None
        if f.is_struct_array():
            if x is None:
                out.append(None)
            else:
                out.append(("n", len(x)))
                for e in x:
                    kp_leaves(e, f, version, flexible, out)
        elif f.is_struct():
            if x is None:
                out.append(None)
            else:
                out.append("s")
                kp_leaves(x, f, version, flexible, out)
        elif isinstance(x, set | frozenset) or (x is None and "authorized_operations" in f.name):
            out.append("ops")  # kafka-python turns authorized-operation bitfields into sets
        else:
            out.append(_norm(x))


def my_leaves(value: Any, s: StructSchema, version: int, flexible: bool, out: list[Any]) -> None:
    active = [f for f in s.fields if version in f.versions]
    untagged = [f for f in active if not (flexible and version in f.tagged)]
    tagged = sorted((f for f in active if flexible and version in f.tagged),
                    key=lambda f: f.tag or 0)
    for f in untagged + tagged:
        x = value[f.key]
        if f.struct is not None and f.is_array:
            if x is None:
                out.append(None)
            else:
                out.append(("n", len(x)))
                for e in x:
                    my_leaves(e, f.struct, version, flexible, out)
        elif f.struct is not None:
            if x is None or (f in tagged and x == f.default(version)):
                out.append(None)  # kafka-python leaves an absent tagged struct as None
            else:
                out.append("s")
                my_leaves(x, f.struct, version, flexible, out)
        elif f.name.endswith("AuthorizedOperations") and f.type == "int32":
            out.append("ops")
        else:
            out.append(_norm(x))


def kp_decode(api_key: int, response: bool, version: int, data: bytes) -> Any:
    return CLASSES[(api_key, response)].decode(data, version=version)


def kp_encode(obj: Any, version: int) -> bytes:
    if not hasattr(obj, "_header"):
        obj._header = None  # decoded objects lack it; encode() reads it
    return bytes(obj.encode(version=version))


def strip_unknown(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: strip_unknown(v) for k, v in value.items() if k != UNKNOWN_TAGGED}
    if isinstance(value, list):
        return [strip_unknown(v) for v in value]
    return value
