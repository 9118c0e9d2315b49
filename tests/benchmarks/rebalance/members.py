"""Member and producer processes of the rebalance benchmark (confluent-kafka / librdkafka).

``python -m tests.benchmarks.rebalance.members consumers ...`` hosts several consumer members, each
a real ``confluent_kafka.Consumer`` polled by its own thread, so that 100 members fit in a few
processes on a small machine. It reads commands from stdin (one JSON object a line: ``start``
with an optional ``config`` of the member's own settings, ``stop`` (graceful close), ``slow``
(block in the next rebalance callback), ``quit``) and writes what the members observe to
stdout, one JSON object a line: the timeline events of
:mod:`tests.benchmarks.rebalance.timeline` (``join``, ``assign``, ``revoke``, ``lost``,
``stall``, ``resume``, ``leave``) plus ``closed`` and consumed-record batches (``c``).

``python -m tests.benchmarks.rebalance.members producer ...`` produces at a fixed rate to every
partition and reports the high-water marks (``p``).

Timestamps are ``time.monotonic()``, which on Linux reads ``CLOCK_MONOTONIC``: one clock for the
whole machine, so times from different processes compare directly with the orchestrator's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

_OUT_LOCK = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    line = json.dumps(obj, separators=(",", ":"))
    with _OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _event(member: str, kind: str, partitions: list[int] | None = None) -> None:
    obj: dict[str, Any] = {"t": time.monotonic(), "m": member, "e": kind}
    if partitions is not None:
        obj["p"] = partitions
    emit(obj)


class Member(threading.Thread):
    """One consumer member: subscribe, poll, report callbacks and consumed ranges."""

    def __init__(self, name: str, topic: str, config: dict[str, Any]) -> None:
        super().__init__(name=f"member-{name}", daemon=True)
        self.member = name
        self.topic = topic
        self.config = dict(config)
        self.stopping = threading.Event()
        self.slow_seconds = 0.0

    def _maybe_block(self) -> None:
        if self.slow_seconds > 0:
            seconds, self.slow_seconds = self.slow_seconds, 0.0
            time.sleep(seconds)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        _event(self.member, "stall")
        self._maybe_block()
        _event(self.member, "assign", sorted(tp.partition for tp in partitions))
        _event(self.member, "resume")

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        _event(self.member, "stall")
        _event(self.member, "revoke", sorted(tp.partition for tp in partitions))
        self._maybe_block()
        _event(self.member, "resume")

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        _event(self.member, "stall")
        _event(self.member, "lost", sorted(tp.partition for tp in partitions))
        self._maybe_block()
        _event(self.member, "resume")

    def run(self) -> None:
        from confluent_kafka import Consumer

        conf = dict(self.config)
        conf.setdefault("client.id", self.member)
        conf["error_cb"] = lambda err: emit(
            {"t": time.monotonic(), "m": self.member, "e": "error", "msg": str(err)}
        )
        consumer = Consumer(conf)
        _event(self.member, "join")
        consumer.subscribe(
            [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        while not self.stopping.is_set():
            msgs = consumer.consume(num_messages=1000, timeout=0.2)
            if not msgs:
                continue
            now_ms = time.time() * 1000.0
            ranges: dict[int, list[list[int]]] = {}
            age = 0.0
            for msg in msgs:
                if msg.error():
                    continue
                p, off = msg.partition(), msg.offset()
                runs = ranges.setdefault(p, [])
                if runs and runs[-1][1] + 1 == off:
                    runs[-1][1] = off
                else:
                    runs.append([off, off])
                ts = msg.timestamp()[1]
                if ts > 0:
                    age = max(age, now_ms - ts)
            if ranges:
                emit({
                    "t": time.monotonic(), "m": self.member, "e": "c",
                    "r": [[p, lo, hi] for p, runs in ranges.items() for lo, hi in runs],
                    "a": round(age, 1),
                })
        _event(self.member, "leave")
        consumer.close()
        _event(self.member, "closed")


def run_consumers(args: argparse.Namespace) -> int:
    config = json.loads(args.config)
    members: dict[str, Member] = {}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        cmd = json.loads(line)
        op = cmd.get("cmd")
        name = cmd.get("member", "")
        if op == "start":
            # settings of this member only (a rolling migration restarts a member with
            # another group.protocol); a null value removes a setting
            own = {**config, **cmd.get("config", {})}
            member = Member(name, args.topic, {k: v for k, v in own.items() if v is not None})
            members[name] = member
            member.start()
        elif op == "stop":
            if name in members:
                members[name].stopping.set()
        elif op == "slow":
            if name in members:
                members[name].slow_seconds = float(cmd.get("seconds", 30))
        elif op == "quit":
            break
    sys.stdout.flush()
    os._exit(0)  # no graceful close: the orchestrator is done with this group


def run_producer(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    producer = Producer({
        "bootstrap.servers": args.bootstrap, "linger.ms": 20, "acks": "1",
        "client.id": "bench-producer",
    })
    high: dict[int, int] = {}
    changed: set[int] = set()

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            p = msg.partition()
            nxt = msg.offset() + 1
            if nxt > high.get(p, 0):
                high[p] = nxt
                changed.add(p)

    stop = threading.Event()

    def watch_stdin() -> None:
        for _ in sys.stdin:
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    interval = 1.0 / args.rate_per_partition
    payload = b"x" * args.record_bytes
    next_round = time.monotonic()
    last_report = 0.0
    while not stop.is_set():
        for p in range(args.partitions):
            while True:
                try:
                    producer.produce(args.topic, payload, partition=p, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
        next_round += interval
        while True:
            now = time.monotonic()
            producer.poll(0)
            if now - last_report >= 0.25 and changed:
                emit({"t": now, "e": "p", "o": {str(p): high[p] for p in changed}})
                changed.clear()
                last_report = now
            if now >= next_round or stop.is_set():
                break
            producer.poll(min(0.05, next_round - now))
        if time.monotonic() - next_round > 5 * interval:
            next_round = time.monotonic()  # fell behind: do not burst
    producer.flush(5)
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.benchmarks.rebalance.members")
    sub = parser.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("consumers")
    c.add_argument("--topic", required=True)
    c.add_argument("--config", required=True, help="consumer configuration as JSON")
    p = sub.add_parser("producer")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--rate-per-partition", type=float, default=2.0)
    p.add_argument("--record-bytes", type=int, default=100)
    args = parser.parse_args(argv)
    if args.mode == "consumers":
        return run_consumers(args)
    return run_producer(args)


if __name__ == "__main__":
    sys.exit(main())
