"""``dev/bench records``: building and reading v2 record batches of journal events, with
``proxy.records`` and with kafka-python 3.0.12's ``DefaultRecordBatchBuilder`` /
``DefaultRecordBatch`` (pure-Python CRC-32C unless the ``crc32c`` module is installed), both
uncompressed and gzip. Prints a table, writes JSON; decision record 0011 quotes it."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.commands.machine import machine_info
from proxy.journal.schema import Event, EventType
from proxy.records import Compression, Record, crc32c, decode_batches, encode_batch


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=500, help="events per batch (500)")
    parser.add_argument("--repeat", type=int, default=7, help="runs per figure; median (7)")
    parser.add_argument("--json", type=Path, help="write the figures here")


def journal_records(n: int) -> list[Record]:
    """Events shaped like a rebalance's: assignments, states, joins."""
    out = []
    for i in range(n):
        group = f"payments-consumer-{i % 40}"
        if i % 5 == 0:
            event = Event(EventType.MEMBER_JOINED, group, 1_700_000_000_000 + i, "10.1.2.3:9092",
                          i, {"member": f"m-{i:08x}-4a2b-9c1d-5e6f7a8b9c0d", "protocol": "consumer",
                              "assignor": "uniform", "client_id": "payments-consumer",
                              "client_host": "/10.1.7.23", "software_name": "apache-kafka-java",
                              "software_version": "4.1.0", "member_epoch": 12, "group_epoch": 12,
                              "topics": ["payments", "refunds"], "rebalance_timeout_ms": 300000})
        elif i % 5 == 1:
            event = Event(EventType.GROUP_STATE, group, 1_700_000_000_000 + i, "10.1.2.3:9092",
                          i, {"state": "Reconciling", "group_epoch": 12, "assignment_epoch": 12,
                              "member_count": 8})
        else:
            event = Event(EventType.ASSIGNMENT, group, 1_700_000_000_000 + i, "10.1.2.3:9092", i,
                          {"member": f"m-{i:08x}-4a2b-9c1d-5e6f7a8b9c0d", "member_epoch": 12,
                           "state": "stable", "assigned": {"payments": [i % 24, (i + 7) % 24]},
                           "revoked": {"refunds": [i % 12]}})
        out.append(Record(event.key, event.encode(), event.ts))
    return out


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[len(times) // 2]


def _kafka_python(records: list[Record], compression: Compression) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=int(compression),
                                        is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 24)
    for i, r in enumerate(records):
        builder.append(i, timestamp=r.timestamp_ms, key=r.key, value=r.value, headers=[])
    return bytes(builder.build())


def _kafka_python_read(raw: bytes) -> int:
    from kafka.record.default_records import DefaultRecordBatch

    batch = DefaultRecordBatch(raw)
    assert batch.validate_crc()
    return sum(1 for _ in batch)


def run(args: argparse.Namespace) -> int:
    from kafka.record import util as kafka_util

    recs = journal_records(args.batch)
    raw_bytes = sum(len(r.value or b"") + len(r.key or b"") for r in recs)
    rows: list[dict[str, Any]] = []
    for compression in (Compression.NONE, Compression.GZIP):
        ours = encode_batch(recs, compression=compression)
        theirs = _kafka_python(recs, compression)
        assert len(decode_batches(theirs)[0].records) == len(recs)
        assert _kafka_python_read(ours) == len(recs)
        for impl, build, read, raw in (
            ("proxy.records", lambda c=compression: encode_batch(recs, compression=c),
             lambda r=ours: decode_batches(r), ours),
            ("kafka-python", lambda c=compression: _kafka_python(recs, c),
             lambda r=theirs: _kafka_python_read(r), theirs),
        ):
            build_ms = _median_ms(build, args.repeat)
            read_ms = _median_ms(read, args.repeat)
            rows.append({"implementation": impl, "compression": compression.name.lower(),
                         "events": len(recs), "batch_bytes": len(raw),
                         "build_ms": round(build_ms, 2), "read_ms": round(read_ms, 2),
                         "build_us_per_event": round(build_ms * 1e3 / len(recs), 1),
                         "read_us_per_event": round(read_ms * 1e3 / len(recs), 1)})
    blob = b"".join(r.value or b"" for r in recs)
    crc = {"proxy.records": _median_ms(lambda: crc32c(blob), args.repeat),
           "kafka-python": _median_ms(lambda: kafka_util.calc_crc32c(memoryview(blob)),
                                      args.repeat)}
    crc_mb_s = {k: round(len(blob) / (v / 1e3) / 1e6, 1) for k, v in crc.items()}
    print(f"{args.batch} journal events, {raw_bytes} bytes of keys and values")
    print(f"{'implementation':15} {'codec':5} {'bytes':>7} {'build ms':>9} {'us/event':>9} "
          f"{'read ms':>8} {'us/event':>9}")
    for r in rows:
        print(f"{r['implementation']:15} {r['compression']:5} {r['batch_bytes']:7d} "
              f"{r['build_ms']:9.2f} {r['build_us_per_event']:9.1f} {r['read_ms']:8.2f} "
              f"{r['read_us_per_event']:9.1f}")
    print("CRC-32C MB/s: " + ", ".join(f"{k} {v}" for k, v in crc_mb_s.items()))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "rows": rows,
                                         "crc32c_mb_per_s": crc_mb_s,
                                         "events": args.batch}, indent=2))
    return 0
