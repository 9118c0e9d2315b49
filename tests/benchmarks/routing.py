"""``dev/bench routing``: what the per-API routing costs per request, in process.

Times the coordinating router the way a connection drives it (``classify``, then ``decide``
for the APIs it examines), with no socket and no broker: a forwarded Produce (classified only),
an OffsetCommit and a classic Heartbeat of a group the proxy does not coordinate (decoded,
handed to their handler, passed to the broker), a ListGroups (decoded, its handler rewrites
it), and the construction of a router (once per client connection). Prints microseconds per
call, median of ``--repeat`` runs; ``--json`` writes them with the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.commands import machine
from tests.unit.coordination.helpers import make_service, request, router


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--json", metavar="FILE", type=Path)


def cases() -> dict[str, Callable[[], object]]:
    service = make_service()
    r = router(service)
    produce = request(0, 9, {"transactional_id": None, "acks": 1, "timeout_ms": 1000,
                             "topic_data": []})
    commit = request(8, 9, {"group_id": "broker-group", "generation_id_or_member_epoch": 3,
                            "member_id": "m", "group_instance_id": None, "topics": [
                                {"name": "orders", "partitions": [
                                    {"partition_index": 0, "committed_offset": 42,
                                     "committed_leader_epoch": -1,
                                     "committed_metadata": None}]}]})
    heartbeat = request(12, 4, {"group_id": "broker-group", "generation_id": 3,
                                "member_id": "m", "group_instance_id": None})
    listing = request(16, 4, {"states_filter": []})

    def routed(info: Any) -> Callable[[], object]:
        def call() -> object:
            r.classify(info)
            return r.decide(info)
        return call

    return {
        "forwarded Produce (classify)": lambda: r.classify(produce),
        "OffsetCommit of a broker group (classify + decide)": routed(commit),
        "classic Heartbeat of a broker group (classify + decide)": routed(heartbeat),
        "ListGroups (classify + decide, rewritten)": routed(listing),
        "router for a new connection": lambda: router(service),
    }


def run(args: argparse.Namespace) -> int:
    results: dict[str, float] = {}
    for name, call in cases().items():
        call()
        runs = timeit.repeat(call, number=args.number, repeat=args.repeat)
        results[name] = statistics.median(runs) / args.number * 1e6
        print(f"{name:<58} {results[name]:8.2f} us")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "routing", "machine": machine.machine_info(),
                                         "us_per_call": results, "number": args.number,
                                         "repeat": args.repeat}, indent=2) + "\n")
    return 0
