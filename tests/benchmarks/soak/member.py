"""One consumer-group member of the soak, in a process of its own (so it can be SIGKILLed).

``python -m tests.benchmarks.soak.member --library confluent|kafka-python ...`` runs a real,
unmodified client (confluent-kafka, either group protocol; kafka-python, classic) and reports
what it does as JSON lines on stdout, in the same format as the Java member
(``tests/testbed/java/CommitConsumer.java``): ``join``, ``stall``/``resume`` around rebalance
callbacks, ``assign``/``revoke``/``lost`` (``p``: partitions), ``c`` (consumed ranges ``r``:
[[partition, first, last]]), ``commit`` (``ok``, ``err``, ``o``: [[partition, offset]]),
``stuck``/``unstuck``, ``blocked`` (a synchronous commit held the poll loop from ``since``
until ``t``), ``leave``, ``closed``. Commit events carry ``sent``, when the commit was sent
(an asynchronous commit's callback may come much later). ``t`` is ``time.monotonic()``
(CLOCK_MONOTONIC, comparable across processes).

Commit styles: ``async`` (a commit of each record's offset right after it, many in flight),
``sync`` (one synchronous commit per batch) and ``auto`` (the client's auto-commit). stdin
takes ``stall SECONDS`` (block the poll loop once, after reading and before committing: a
member overrunning ``max.poll.interval.ms``) and ``stop`` (close gracefully, as SIGTERM does).
``--config KEY=VALUE`` (repeatable) adds a confluent-kafka setting of the member's own (e.g.
``connections.max.idle.ms``). ``GROUPGATE_SOAK_CLIENT_DEBUG`` (e.g. ``cgrp``) sets
confluent-kafka's ``debug`` contexts; the lines go to the member's stderr file in the run's work
directory. kafka-python's own warnings (and its coordinator's information lines) go there too,
stamped with ``time.monotonic()``.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

_OUT = threading.Lock()


def emit(kind: str, **fields: Any) -> None:
    line = json.dumps({"t": time.monotonic(), "e": kind, **fields}, separators=(",", ":"))
    with _OUT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Control:
    """Commands from stdin and signals."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.stall_seconds = 0.0
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["stall"] and len(words) > 1:
                self.stall_seconds = float(words[1])
            elif words[:1] == ["stop"]:
                self.stopping.set()

    def maybe_stall(self) -> None:
        seconds, self.stall_seconds = self.stall_seconds, 0.0
        if seconds > 0:
            emit("stuck", s=seconds)
            time.sleep(seconds)
            emit("unstuck")


BLOCKED_SECONDS = 1.0


def blocked(since: float) -> None:
    """A synchronous commit held the poll loop since ``since``: if that was long, report it
    as the loop being stuck (the member may be fenced meanwhile, and notices only after)."""
    now = time.monotonic()
    if now - since >= BLOCKED_SECONDS:
        emit("blocked", since=since)


def ranges(pairs: list[tuple[int, int]]) -> list[list[int]]:
    """[[partition, first, last]] runs of consecutive offsets."""
    runs: list[list[int]] = []
    last: dict[int, list[int]] = {}
    for partition, offset in pairs:
        run = last.get(partition)
        if run is not None and run[2] + 1 == offset:
            run[2] = offset
        else:
            run = [partition, offset, offset]
            runs.append(run)
            last[partition] = run
    return runs


def run_confluent(args: argparse.Namespace, control: Control) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    sent_at: dict[tuple[int, int], float] = {}
    """(partition, offset) -> when its asynchronous commit was sent."""

    def on_commit(err: Any, partitions: list[Any]) -> None:
        sent = min((sent_at.pop((tp.partition, tp.offset), time.monotonic())
                    for tp in partitions), default=time.monotonic())
        # per partition: an error of its own, or no offset to commit (-1001), is no success
        done = [tp for tp in partitions if err is None and tp.error is None and tp.offset >= 0]
        failed = [tp for tp in partitions if tp not in done and tp.offset >= 0]
        if done:
            emit("commit", ok=True, err=None, o=[[tp.partition, tp.offset] for tp in done],
                 sent=sent)
        if failed:
            emit("commit", ok=False, err=str(err or failed[0].error),
                 o=[[tp.partition, tp.offset] for tp in failed], sent=sent)

    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap, "group.id": args.group, "client.id": args.name,
        "group.protocol": args.protocol, "auto.offset.reset": "earliest",
        "enable.auto.commit": args.commit == "auto", "on_commit": on_commit,
        "max.poll.interval.ms": args.max_poll_interval_ms,
    }
    if args.protocol == "classic":
        config.update({"session.timeout.ms": args.session_timeout_ms,
                       "heartbeat.interval.ms": max(args.session_timeout_ms // 10, 100),
                       "partition.assignment.strategy": args.assignor})
    else:
        config["group.remote.assignor"] = args.assignor
    config.update(item.split("=", 1) for item in args.config)
    if os.environ.get("GROUPGATE_SOAK_CLIENT_DEBUG"):  # librdkafka's debug contexts, to stderr
        config["debug"] = os.environ["GROUPGATE_SOAK_CLIENT_DEBUG"]
    consumer = Consumer(config)

    def callback(kind: str) -> Any:
        def cb(_consumer: Any, partitions: list[Any]) -> None:
            emit("stall")
            emit(kind, p=sorted(tp.partition for tp in partitions))
            emit("resume")
        return cb

    emit("join")
    consumer.subscribe([args.topic], on_assign=callback("assign"),
                       on_revoke=callback("revoke"), on_lost=callback("lost"))
    while not control.stopping.is_set():
        messages = consumer.consume(num_messages=500, timeout=0.2)
        read = [(int(m.partition() or 0), int(m.offset() or 0)) for m in messages
                if m.error() is None]
        if not read:
            continue
        emit("c", r=ranges(read))
        control.maybe_stall()
        if args.commit == "async":
            for m in messages:
                if m.error() is None:
                    try:
                        sent_at[(int(m.partition() or 0), (m.offset() or 0) + 1)] = \
                            time.monotonic()
                        consumer.commit(message=m, asynchronous=True)
                    except KafkaException as exc:
                        emit("commit", ok=False, err=str(exc),
                                             o=[[m.partition(), (m.offset() or 0) + 1]])
        elif args.commit == "sync":
            last: dict[int, int] = {}
            for partition, offset in read:
                last[partition] = offset + 1
            offsets = [TopicPartition(args.topic, p, o) for p, o in last.items()]
            sent = time.monotonic()
            try:
                # a synchronous commit does not call on_commit: report it from the answer
                done = consumer.commit(offsets=offsets, asynchronous=False) or []
            except KafkaException as exc:
                emit("commit", ok=False, err=str(exc), o=[[p, o] for p, o in last.items()],
                     sent=sent)
            else:
                failed = [tp for tp in done if tp.error is not None]
                emit("commit", ok=not failed,
                     err=str(failed[0].error) if failed else None,
                     o=[[tp.partition, tp.offset] for tp in done], sent=sent)
            blocked(sent)
    emit("leave")
    consumer.close()
    emit("closed")


class _MonotonicFormatter(logging.Formatter):
    """Log lines stamped on the soak's clock (``time.monotonic()``), as its events are."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{time.monotonic():.3f} {super().format(record)}"


def _log_kafka_python() -> None:
    """kafka-python's warnings and its group coordinator's progress, to stderr: without a
    handler Python prints only bare warning text, with no time to set against the events."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_MonotonicFormatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("kafka")
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("kafka.coordinator").setLevel(logging.INFO)


def run_kafka_python(args: argparse.Namespace, control: Control) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer, OffsetAndMetadata, TopicPartition
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

    _log_kafka_python()
    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor,
                 "sticky": StickyPartitionAssignor,
                 "cooperative-sticky": CooperativeStickyAssignor}
    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap, group_id=args.group, client_id=args.name,
        auto_offset_reset="earliest", enable_auto_commit=args.commit == "auto",
        auto_commit_interval_ms=1000, session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=max(args.session_timeout_ms // 10, 100),
        max_poll_interval_ms=args.max_poll_interval_ms,
        partition_assignment_strategy=[assignors[args.assignor]])

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            emit("stall")
            emit("revoke", p=sorted(tp.partition for tp in revoked))
            emit("resume")

        def on_partitions_assigned(self, assigned: Any) -> None:
            emit("stall")
            emit("assign", p=sorted(tp.partition for tp in assigned))
            emit("resume")

    def on_commit(offsets: Any, response: Any, sent: float | None = None) -> None:
        ok = not isinstance(response, Exception)
        emit("commit", ok=ok, err=None if ok else repr(response),
             o=[[tp.partition, om.offset] for tp, om in offsets.items()],
             sent=time.monotonic() if sent is None else sent)

    emit("join")
    consumer.subscribe([args.topic], listener=Listener())
    while not control.stopping.is_set():
        batches = consumer.poll(timeout_ms=200, max_records=500)
        read = [(r.partition, r.offset) for records in batches.values() for r in records]
        if not read:
            continue
        emit("c", r=ranges(read))
        control.maybe_stall()
        if args.commit in ("async", "sync"):
            last: dict[int, int] = {}
            for partition, offset in read:
                last[partition] = offset + 1
            offsets = {TopicPartition(args.topic, p): OffsetAndMetadata(o, "", -1)
                       for p, o in last.items()}
            sent = time.monotonic()
            if args.commit == "async":  # its callback runs in a later poll: note the send time
                consumer.commit_async(offsets, callback=functools.partial(
                    lambda sent_at, o, r: on_commit(o, r, sent_at), sent))
            else:
                try:
                    consumer.commit(offsets)
                    on_commit(offsets, None, sent)
                except Exception as exc:  # the client's commit errors, reported as such
                    on_commit(offsets, exc, sent)
                blocked(sent)
    emit("leave")
    consumer.close()
    emit("closed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.benchmarks.soak.member")
    parser.add_argument("--library", choices=["confluent", "kafka-python"], required=True)
    parser.add_argument("--protocol", choices=["classic", "consumer"], default="classic")
    parser.add_argument("--assignor", default="range")
    parser.add_argument("--commit", choices=["async", "sync", "auto"], default="async")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--max-poll-interval-ms", type=int, default=20000)
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a confluent-kafka setting of this member (repeatable)")
    args = parser.parse_args(argv)
    control = Control()
    if args.library == "confluent":
        run_confluent(args, control)
    else:
        run_kafka_python(args, control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
