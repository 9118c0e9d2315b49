"""Micro-benchmarks behind docs/decisions/0001-message-codec.md.

Run: ``python -m tests.benchmarks.codec [--quick]``. Measures, on this machine, the schema-driven
codec against kafka-python 3.0.12's codec and construct 2.10 (both optional, test extras) on a
MetadataResponse v12 of about 54 KB, plus the costs that sit on the forwarding path: the
brokers-array splice, the request-header peek, the Fetch NodeEndpoints check on 1 MB responses
and the frame reader. Prints one line per measurement (best of several repeats, per operation).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import timeit
import uuid
from collections.abc import Callable
from typing import Any

from proxy.codec import header, messages
from proxy.frames import FrameSplitter, encode_frame
from proxy.rewrite import DictAddressMap, rewrite_response


def metadata_value(topics: int = 100, partitions: int = 12, brokers: int = 3) -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "brokers": [{"node_id": i, "host": f"kafka-{i}.kafka.svc.cluster.local", "port": 9092,
                     "rack": f"zone-{i}"} for i in range(brokers)],
        "cluster_id": "Zq9lN3bSQ1u8vI3K2QJw1A",
        "controller_id": 0,
        "topics": [{
            "error_code": 0, "name": f"orders.events.{t:04d}", "topic_id": uuid.UUID(int=t + 1),
            "is_internal": False, "topic_authorized_operations": -2147483648,
            "partitions": [{
                "error_code": 0, "partition_index": p, "leader_id": p % brokers,
                "leader_epoch": 3, "replica_nodes": [(p + i) % brokers for i in range(3)],
                "isr_nodes": [(p + i) % brokers for i in range(3)], "offline_replicas": [],
            } for p in range(partitions)],
        } for t in range(topics)],
    }


def fetch_value(topics: int, partitions: int, total_bytes: int) -> dict[str, Any]:
    per = total_bytes // (topics * partitions)
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 1, "responses": [
        {"topic_id": uuid.UUID(int=t + 1), "partitions": [
            {"partition_index": p, "high_watermark": 10**6, "last_stable_offset": 10**6,
             "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1,
             "records": os.urandom(per)} for p in range(partitions)]}
        for t in range(topics)]}


def bench(fn: Callable[[], object] | str, quick: bool, env: dict[str, Any] | None = None
          ) -> float:
    """Best per-call time in seconds over several repeats (auto-sized loops).

    ``fn`` may be a statement string run with ``env`` as globals, which avoids the cost of a
    lambda call in nanosecond-scale measurements.
    """
    t = timeit.Timer(fn, globals=env) if isinstance(fn, str) else timeit.Timer(fn)
    n, _ = t.autorange()
    n = max(1, n // (4 if quick else 1))
    runs = t.repeat(repeat=3 if quick else 7, number=n)
    return min(runs) / n


def fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:8.2f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:8.2f} us"
    return f"{seconds * 1e9:8.0f} ns"


def machine() -> str:
    model = "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return (f"{model}; {os.cpu_count()} cores; Python {platform.python_version()} "
            f"({platform.python_implementation()}); {platform.system()} {platform.release()}")


def construct_metadata_v12() -> Any:
    """A construct (2.10) description of MetadataResponse v12, for comparison only."""
    import construct as c  # type: ignore[import-untyped]

    uv = c.VarInt  # unsigned LEB128, which is Kafka's unsigned varint
    cstr = c.ExprAdapter(c.Prefixed(c.ExprAdapter(uv, lambda o, _: o - 1, lambda o, _: o + 1),
                                    c.GreedyBytes),
                         lambda o, _: o.decode(), lambda o, _: o.encode())
    ncstr = c.Struct("n" / c.Rebuild(uv, lambda ctx: 0 if ctx.v is None else len(ctx.v) + 1),
                     "v" / c.If(c.this.n > 0, c.Bytes(c.this.n - 1)))

    def carray(sub: Any) -> Any:
        return c.PrefixedArray(c.ExprAdapter(uv, lambda o, _: o - 1, lambda o, _: o + 1), sub)

    tags = c.PrefixedArray(uv, c.Struct("tag" / uv, "data" / c.Prefixed(uv, c.GreedyBytes)))
    broker = c.Struct("node_id" / c.Int32sb, "host" / cstr, "port" / c.Int32sb, "rack" / ncstr,
                      "_tags" / tags)
    partition = c.Struct("error_code" / c.Int16sb, "partition_index" / c.Int32sb,
                         "leader_id" / c.Int32sb, "leader_epoch" / c.Int32sb,
                         "replica_nodes" / carray(c.Int32sb), "isr_nodes" / carray(c.Int32sb),
                         "offline_replicas" / carray(c.Int32sb), "_tags" / tags)
    topic = c.Struct("error_code" / c.Int16sb, "name" / ncstr, "topic_id" / c.Bytes(16),
                     "is_internal" / c.Flag, "partitions" / carray(partition),
                     "topic_authorized_operations" / c.Int32sb, "_tags" / tags)
    return c.Struct("throttle_time_ms" / c.Int32sb, "brokers" / carray(broker),
                    "cluster_id" / ncstr, "controller_id" / c.Int32sb,
                    "topics" / carray(topic), "_tags" / tags)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="codec micro-benchmarks")
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    args = ap.parse_args(argv)
    q = args.quick
    rows: list[tuple[str, str]] = []

    def row(name: str, seconds: float | str) -> None:
        text = seconds if isinstance(seconds, str) else fmt(seconds)
        rows.append((name, text))
        print(f"{name:<62} {text}", flush=True)

    print(machine())
    value = metadata_value()
    body = messages.encode_response(3, 12, value)
    print(f"MetadataResponse v12: {len(body)} bytes, {len(value['topics'])} topics x "
          f"{len(value['topics'][0]['partitions'])} partitions, {len(value['brokers'])} brokers")

    messages._CACHE.clear()
    row("groupgate codec: compile Metadata v12 response (first use)",
        timeit.timeit(lambda: messages.compiled(3, 12, True), number=1))
    row("groupgate codec: decode Metadata v12",
        bench(lambda: messages.decode_response(3, 12, body), q))
    decoded, _ = messages.decode_response(3, 12, body)
    row("groupgate codec: encode Metadata v12",
        bench(lambda: messages.encode_response(3, 12, decoded), q))

    try:
        from kafka.protocol.metadata import MetadataResponse
    except ImportError:
        row("kafka-python: not installed", "-")
    else:
        obj = MetadataResponse.decode(body, version=12)
        if not hasattr(obj, "_header"):
            obj._header = None
        assert bytes(obj.encode(version=12)) == body
        row("kafka-python 3.0.12: decode Metadata v12",
            bench(lambda: MetadataResponse.decode(body, version=12), q))
        row("kafka-python 3.0.12: encode Metadata v12",
            bench(lambda: obj.encode(version=12), q))

    try:
        import construct
    except ImportError:
        row("construct: not installed", "-")
    else:
        cm = construct_metadata_v12()
        parsed = cm.parse(body)
        assert len(parsed.topics) == len(value["topics"])
        assert cm.build(parsed) == body
        row(f"construct {construct.__version__} (interpreted): parse Metadata v12",
            bench(lambda: cm.parse(body), True))
        row(f"construct {construct.__version__} (interpreted): build Metadata v12",
            bench(lambda: cm.build(parsed), True))
        try:
            compiled = cm.compile()
            compiled.parse(body)
            row("construct compiled: parse Metadata v12", bench(lambda: compiled.parse(body), q))
        except Exception as e:  # construct raises for constructs it cannot compile
            row(f"construct compiled: fails ({type(e).__name__}: {str(e)[:40]})", "-")

    amap = DictAddressMap({i: ("localhost", 19092 + i) for i in range(3)})
    row("splice Metadata v12 brokers (3 brokers, 54 KB body)",
        bench(lambda: rewrite_response(3, 12, body, amap), q))
    same = DictAddressMap({b["node_id"]: (b["host"], b["port"]) for b in value["brokers"]})
    row("Metadata v12 brokers check, nothing to change",
        bench(lambda: rewrite_response(3, 12, body, same), q))

    req = header.encode_request_header(3, 12, 12345, "consumer-1-my-app") + b"\x00" * 20
    env = {"unpack": header.peek_unpack, "peek": header.peek, "req": req}
    row("header peek: struct unpack_from (api key, version, corr id)",
        bench("unpack(req, 0)", q, env))
    row("header peek: header.peek() with length check", bench("peek(req)", q, env))
    row("header parse: client id + tagged fields",
        bench(lambda: header.parse_request_header(req), q))

    for topics, parts in ((1, 1), (1, 10), (10, 10), (50, 20)):
        fb = messages.encode_response(1, 17, fetch_value(topics, parts, 1 << 20))
        assert rewrite_response(1, 17, fb, amap) is fb
        fenv = {"rewrite": rewrite_response, "fb": fb, "amap": amap}
        row(f"Fetch v17 NodeEndpoints check, 1 MB, {topics} topic(s) x {parts} partitions",
            bench("rewrite(1, 17, fb, amap)", q, fenv))
    fv = fetch_value(1, 10, 1 << 20)
    fv["node_endpoints"] = [{"node_id": 1, "host": "kafka-1", "port": 9092, "rack": None}]
    fb = messages.encode_response(1, 17, fv)
    row("Fetch v17 NodeEndpoints rewrite, 1 MB, 10 partitions",
        bench(lambda: rewrite_response(1, 17, fb, amap), q))

    stream = b"".join(encode_frame(b"x" * 1000) for _ in range(1000))
    chunks = [stream[i:i + 65536] for i in range(0, len(stream), 65536)]

    def frames() -> int:
        splitter = FrameSplitter(1 << 20)
        n = 0
        for ch in chunks:
            n += len(splitter.feed(ch)[1])
        return n

    t = bench(frames, q)
    row("FrameSplitter: 1000 x 1 KB frames in 64 KB chunks (per frame)", t / 1000)
    big = encode_frame(os.urandom(1 << 20))
    big_chunks = [big[i:i + 65536] for i in range(0, len(big), 65536)]

    def one_big() -> None:
        splitter = FrameSplitter(2 << 20)
        spans: list[tuple[int, int]] = []
        for ch in big_chunks:
            spans += splitter.feed(ch)[1]
        assert len(spans) == 1

    row("FrameSplitter: one 1 MB frame in 64 KB chunks", bench(one_big, q))
    return 0


if __name__ == "__main__":
    sys.exit(main())
