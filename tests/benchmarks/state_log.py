"""``dev/bench state-log``: the group state log's write latency, write rate and load time.

In process first (``codec``): building a transactional record batch of 1, 10 and 100 records
and reading 100,000 records back, with this project's batch code
(:mod:`proxy.records`, google-crc32c's CRC-32C; building includes making the writer's
:class:`~proxy.records.Record` objects) and with kafka-python 3.0.12's
``DefaultRecordBatchBuilder`` / ``MemoryRecords`` (its CRC-32C is pure Python unless the
``crc32c`` package is installed; which one ran is reported).

Then against test-bed Kafka 3.9 (``--targets single,three``: one node, replication 1; three
nodes, replication 3 and min.insync.replicas 2), through :class:`~proxy.state_log.log.
StateLog` with its defaults unless a figure says otherwise; records are a 40-byte key and a
``--value-bytes`` value:

* ``write_latency``: one writer, one write at a time, batches of 1, 10 and 100 records:
  p50/p99 of the time until the commit is answered.
* ``one_group``: ``--callers`` tasks writing one record each to one group's writer as fast as
  they can, group commit on and off: writes/s and transactions/s.
* ``ten_groups``: 10 groups' writers, one writing task each: writes/s with
  ``connections_per_broker`` 1 and 4.
* ``load``: one group holding 1,000 / 10,000 / 100,000 live records (written 100 per
  transaction) in a partition of its own: time of ``load_group`` (after a new writer opened),
  and for 100,000 records with ``fetch_max_bytes`` of 1, 4 and 16 MiB.

Prints each figure; ``--json FILE`` writes them all with the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from proxy.commands import machine
from proxy.records import Record, crc32c, encode_batch, read_committed
from proxy.state_log.log import KeyValue, StateLog, StateLogSettings
from tests.testbed.artifacts import java_executable
from tests.testbed.broker import BENCH_JVM_FLAGS, KafkaBroker, KafkaCluster

KEY_BYTES = 40


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--targets", default="single,three",
                        help="comma separated: single (1 node), three (3 nodes), none")
    parser.add_argument("--writes", type=int, default=300,
                        help="writes per latency figure")
    parser.add_argument("--seconds", type=float, default=5.0,
                        help="duration of each writes/s figure")
    parser.add_argument("--callers", type=int, default=16,
                        help="concurrent callers of one group's writer")
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument("--loads", default="1000,10000,100000",
                        help="live record counts of the load figures")
    parser.add_argument("--repeat", type=int, default=3, help="loads per figure (median)")
    parser.add_argument("--json", metavar="FILE", type=Path)
    parser.add_argument("--workdir", type=Path, default=None)


def group_of(key: bytes) -> str:
    return key.split(b"\x00", 1)[0].decode()


def records(group: str, count: int, value_bytes: int, start: int = 0) -> list[KeyValue]:
    pad = KEY_BYTES - len(group) - 1
    return [((group.encode() + b"\x00" + b"%0*d" % (pad, i)), b"v" * value_bytes)
            for i in range(start, start + count)]


def _best(fn: Callable[[], object], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# -- in process ------------------------------------------------------------------------------

def codec_figures(value_bytes: int) -> dict[str, Any]:
    from kafka.record import util
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

    def kp_build(batch: list[KeyValue]) -> bytes:
        builder = DefaultRecordBatchBuilder(2, 0, True, 1, 0, 0, 1 << 24)
        for offset, (k, v) in enumerate(batch):
            builder.append(offset, 1_700_000_000_000, k, v, [])
        return bytes(builder.build())

    def ours_build(batch: list[KeyValue]) -> bytes:
        # as the state writer does it; leader epoch 0 as kafka-python writes it (brokers set it)
        return encode_batch([Record(k, v, 1_700_000_000_000) for k, v in batch],
                            transactional=True, producer_id=1, producer_epoch=0,
                            base_sequence=0, partition_leader_epoch=0)

    out: dict[str, Any] = {"kafka_python_crc32c": "c (crc32c package)"
                           if util.crc32c_c is not None else "pure Python"}
    for n in (1, 10, 100):
        batch = records("g", n, value_bytes)
        assert kp_build(batch) == ours_build(batch)
        out[f"build_{n}_us"] = {
            "groupgate": round(_best(lambda b=batch: ours_build(b), 50) * 1e6, 1),
            "kafka_python": round(_best(lambda b=batch: kp_build(b), 20) * 1e6, 1)}
    blob = b"".join(struct_at(ours_build(records("g", 100, value_bytes, i * 100)), i * 100)
                    for i in range(1000))

    def kp_read() -> int:
        count = 0
        batches = MemoryRecords(blob)
        while batches.has_next():
            batch = batches.next_batch()
            batch.validate_crc()
            for _record in batch:
                count += 1
        return count

    def ours_read() -> int:
        return len(read_committed(blob, []).records)

    assert kp_read() == ours_read() == 100_000
    out["read_100000_s"] = {"groupgate": round(_best(ours_read, 3), 3),
                            "kafka_python": round(_best(kp_read, 1), 3),
                            "groupgate_without_crc": round(_best(
                                lambda: read_committed(blob, [], check_crc=False), 3), 3)}
    # kafka-python again with the same C CRC-32C as ours, to compare the rest of the code
    from kafka.record import default_records

    pure = default_records.calc_crc32c
    default_records.calc_crc32c = lambda view: crc32c(view)
    try:
        for n in (1, 10, 100):
            batch = records("g", n, value_bytes)
            out[f"build_{n}_us"]["kafka_python_c_crc"] = round(
                _best(lambda b=batch: kp_build(b), 50) * 1e6, 1)
        out["read_100000_s"]["kafka_python_c_crc"] = round(_best(kp_read, 3), 3)
    finally:
        default_records.calc_crc32c = pure
    out["read_bytes"] = len(blob)
    return out


def struct_at(batch: bytes, offset: int) -> bytes:
    return offset.to_bytes(8, "big") + batch[8:]


# -- against a broker ------------------------------------------------------------------------

def _address(cluster: KafkaCluster) -> list[tuple[str, int]]:
    return [(h, int(p)) for h, _, p in (a.rpartition(":") for a in cluster.bootstrap.split(","))]


def _pcts(samples: list[float]) -> dict[str, float]:
    return {"p50_ms": round(machine.percentile(samples, 0.5) * 1000, 2),
            "p99_ms": round(machine.percentile(samples, 0.99) * 1000, 2),
            "n": len(samples)}


async def _log(cluster: KafkaCluster, rf: int, partitions: int = 16, **kw: Any) -> StateLog:
    settings = StateLogSettings(topic=f"bench-state-{uuid.uuid4().hex[:8]}",
                                partitions=partitions, replication_factor=rf, **kw)
    log = StateLog(_address(cluster), settings, group_of=group_of)
    await log.start()
    return log


async def write_latency(cluster: KafkaCluster, rf: int, args: argparse.Namespace
                        ) -> dict[str, Any]:
    log = await _log(cluster, rf)
    out: dict[str, Any] = {}
    try:
        writer = await log.open_writer("latency")
        for n in (1, 10, 100):
            for i in range(10):  # warm-up
                await writer.write(records("latency", n, args.value_bytes, i * n))
            samples = []
            for i in range(args.writes):
                batch = records("latency", n, args.value_bytes, i * n)
                t0 = trio.current_time()
                await writer.write(batch)
                samples.append(trio.current_time() - t0)
            out[f"batch_{n}"] = _pcts(samples)
            print(f"  write of {n:>3} record(s): p50 {out[f'batch_{n}']['p50_ms']} ms, "
                  f"p99 {out[f'batch_{n}']['p99_ms']} ms", flush=True)
    finally:
        await log.aclose()
    return out


async def _rate(writers: list[Any], tasks_per_writer: int, seconds: float, value_bytes: int
                ) -> tuple[float, float]:
    done = 0
    before = sum(w.transactions for w in writers)

    async def caller(writer: Any, index: int) -> None:
        nonlocal done
        i = 0
        while True:
            await writer.write(records(writer.group_id, 1, value_bytes, index * 1_000_000 + i))
            done += 1
            i += 1

    async with trio.open_nursery() as nursery:
        for writer in writers:
            for t in range(tasks_per_writer):
                nursery.start_soon(caller, writer, t)
        await trio.sleep(1.0)  # warm-up
        done, before = 0, sum(w.transactions for w in writers)
        t0 = trio.current_time()
        await trio.sleep(seconds)
        elapsed = trio.current_time() - t0
        count, transactions = done, sum(w.transactions for w in writers) - before
        nursery.cancel_scope.cancel()
    return count / elapsed, transactions / elapsed


async def write_rates(cluster: KafkaCluster, rf: int, args: argparse.Namespace
                      ) -> dict[str, Any]:
    out: dict[str, Any] = {"one_group": {}, "ten_groups": {}}
    for coalesce in (True, False):
        log = await _log(cluster, rf, coalesce_writes=coalesce)
        try:
            writer = await log.open_writer("rate")
            writes, txns = await _rate([writer], args.callers, args.seconds, args.value_bytes)
            name = "group_commit" if coalesce else "one_transaction_per_write"
            out["one_group"][name] = {"writes_per_s": round(writes), "transactions_per_s":
                                      round(txns), "callers": args.callers}
            print(f"  one group, {args.callers} callers, {name}: {writes:.0f} writes/s "
                  f"({txns:.0f} transactions/s)", flush=True)
            if coalesce:
                writes, txns = await _rate([writer], 1, args.seconds, args.value_bytes)
                out["one_group"]["one_caller"] = {"writes_per_s": round(writes)}
                print(f"  one group, one caller: {writes:.0f} writes/s", flush=True)
        finally:
            await log.aclose()
    for connections in (1, 4):
        log = await _log(cluster, rf, connections_per_broker=connections)
        try:
            writers = [await log.open_writer(f"group-{i}") for i in range(10)]
            writes, _ = await _rate(writers, 1, args.seconds, args.value_bytes)
            out["ten_groups"][f"connections_per_broker_{connections}"] = {
                "writes_per_s": round(writes)}
            print(f"  ten groups, one caller each, {connections} connection(s) per broker: "
                  f"{writes:.0f} writes/s", flush=True)
        finally:
            await log.aclose()
    return out


async def loads(cluster: KafkaCluster, rf: int, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    counts = [int(c) for c in args.loads.split(",") if c]
    for count in counts:
        log = await _log(cluster, rf, partitions=1)
        try:
            writer = await log.open_writer("loaded")
            for start in range(0, count, 100):
                await writer.write(records("loaded", min(100, count - start), args.value_bytes,
                                           start))
            await log.open_writer("loaded")
            sizes = [1 << 20, 4 << 20, 16 << 20] if count == max(counts) else [4 << 20]
            figure: dict[str, Any] = {}
            for size in sizes:
                reader = StateLog(_address(cluster), StateLogSettings(
                    topic=log.settings.topic, partitions=1, replication_factor=rf,
                    fetch_max_bytes=size), group_of=group_of)
                await reader.start()
                times = []
                try:
                    for _ in range(args.repeat):
                        t0 = trio.current_time()
                        loaded = await reader.load_group("loaded")
                        times.append(trio.current_time() - t0)
                        assert len(loaded.records) == count
                finally:
                    await reader.aclose()
                figure[f"fetch_max_bytes_{size >> 20}MiB"] = {
                    "median_s": round(statistics.median(times), 3),
                    "fetches": loaded.fetches, "bytes": loaded.bytes_read}
                print(f"  load of {count:>6} records, fetch_max_bytes {size >> 20} MiB: "
                      f"{statistics.median(times):.3f} s ({loaded.fetches} fetches, "
                      f"{loaded.bytes_read / 2**20:.1f} MiB)", flush=True)
            out[f"records_{count}"] = figure
        finally:
            await log.aclose()
    return out


async def broker_figures(cluster: KafkaCluster, rf: int, args: argparse.Namespace
                         ) -> dict[str, Any]:
    return {"write_latency": await write_latency(cluster, rf, args),
            **(await write_rates(cluster, rf, args)),
            "load": await loads(cluster, rf, args)}


def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="groupgate-state-log-"))
    info = machine.machine_info(java_executable())
    print(f"machine: {machine.describe_machine(info)}")
    result: dict[str, Any] = {"benchmark": "state-log", "machine": info,
                              "value_bytes": args.value_bytes, "key_bytes": KEY_BYTES}
    print("record batches, in process:")
    result["codec"] = codec_figures(args.value_bytes)
    for name, figure in result["codec"].items():
        print(f"  {name}: {figure}")
    targets = [t for t in args.targets.split(",") if t and t != "none"]
    for target in targets:
        if target == "single":
            print("Kafka 3.9, one node, replication 1:", flush=True)
            cluster: KafkaCluster = KafkaBroker.start("3.9", workdir / "single",
                                                      jvm_flags=BENCH_JVM_FLAGS)
            rf = 1
        elif target == "three":
            print("Kafka 3.9, three nodes, replication 3, min.insync.replicas 2:", flush=True)
            cluster = KafkaCluster.start("3.9", workdir / "three", size=3, heap="384m",
                                         jvm_flags=BENCH_JVM_FLAGS)
            rf = 3
        else:
            raise SystemExit(f"unknown target {target!r}")
        try:
            result[target] = trio.run(broker_figures, cluster, rf, args)
        finally:
            cluster.stop(timeout=20)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
