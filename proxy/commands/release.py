"""``groupgate release --group G [--to classic|native]``: hand a group the engine coordinates
back to the broker's classic coordinator, or (``--to native``, in front of Kafka 4.x) to the
broker's own KIP-848 coordinator (decision record 0018, the hand-back and the exit;
``docs/operations.md``, "Handing a group back (downgrade)" and "Leaving groupgate for Kafka
4.x's own coordinator (exit)").

The command is a Kafka request to the sidecar that holds the group (its client listener, as
an application would connect): an IncrementalAlterConfigs of the GROUP resource ``G`` setting
groupgate's config ``groupgate.release``. The sidecar has the broker authorize it first, as
the caller's principal on the caller's own connection (ALTER_CONFIGS on the group), then
starts the hand-back and answers; a sidecar that does not hold the group answers
NOT_COORDINATOR. With ``--wait`` the command then describes the group through the sidecar
until the broker's classic group is Stable with members behind sidecars (member marks) again,
or with ``--to native`` until the broker's KIP-848 coordinator describes it Stable with a
member other than groupgate's anchor (:mod:`proxy.coordination.native_exit`).

This client speaks plaintext Kafka only (no TLS, no SASL): on a secured listener use any Kafka
admin client instead, e.g. ``kafka-configs.sh --bootstrap-server SIDECAR --alter --entity-type
groups --entity-name G --add-config groupgate.release=true`` (``=native`` for the exit; Kafka
3.8+ tools).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import trio

from proxy.codec.api_keys import ApiKey
from proxy.coordination.native_exit import ANCHOR_CLIENT_ID
from proxy.coordination.release import GROUP_RESOURCE, RELEASE_CONFIG, SET
from proxy.coordination.upgrade import MARK_PREFIX
from proxy.upstream import UpstreamClient, UpstreamError
from translation.errors import ErrorCode

ALTER_VERSION = 1
DESCRIBE_VERSION = 5
CONSUMER_DESCRIBE_VERSION = 1
LOCK_PROTOCOL = "groupgate-coordinated"
MAX_FRAME_BYTES = 16 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--group", required=True, help="the group id to hand back")
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", metavar="HOST:PORT",
                        help="the sidecar holding the group (its client listener; default "
                             "127.0.0.1:9092, the pod's own sidecar)")
    parser.add_argument("--to", choices=("classic", "native"), default="classic",
                        help="the broker's coordinator to hand the group to: classic (any "
                             "Kafka; default) or native (Kafka 4.x's own KIP-848 "
                             "coordinator, the exit from groupgate)")
    parser.add_argument("--wait", action="store_true",
                        help="wait until the broker's coordinator has the group, Stable")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long to wait for an answer, and with --wait for the group "
                             "(default 60)")


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def release_request(group_id: str, to: str = "classic") -> dict[str, Any]:
    return {"resources": [{"resource_type": GROUP_RESOURCE, "resource_name": group_id,
                           "configs": [{"name": RELEASE_CONFIG, "config_operation": SET,
                                        "value": "native" if to == "native" else "true"}]}],
            "validate_only": False}


def describe(value: dict[str, Any]) -> tuple[str, str, list[str]]:
    """(state, protocol, member client ids) of the first group of a DescribeGroups answer."""
    groups = value.get("groups") or [{}]
    group = groups[0]
    return (group.get("group_state") or "", group.get("protocol_data") or "",
            [m.get("client_id") or "" for m in group.get("members") or ()])


def consumer_described(value: dict[str, Any]) -> tuple[int, str, list[str]]:
    """(error code, state, member client ids) of the first group of a ConsumerGroupDescribe
    answer."""
    group = (value.get("groups") or [{}])[0]
    return (int(group.get("error_code") or 0), group.get("group_state") or "",
            [m.get("client_id") or "" for m in group.get("members") or ()])


async def release(group_id: str, where: tuple[str, int], wait: bool, timeout: float,
                  to: str = "classic") -> int:
    deadline = trio.current_time() + timeout
    client = await UpstreamClient.connect(where, timeout=timeout, max_frame_bytes=MAX_FRAME_BYTES)
    try:
        with trio.fail_after(max(deadline - trio.current_time(), 1.0)):
            answer = await client.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, ALTER_VERSION,
                                          release_request(group_id, to),
                                          client_id="groupgate-release")
        resource = (answer.get("responses") or [{}])[0]
        error = resource.get("error_code", -1)
        if error != ErrorCode.NONE:
            name = ErrorCode(error).name if error in ErrorCode._value2member_map_ else error
            print(f"group {group_id}: not released: {name}: "
                  f"{resource.get('error_message') or '-'}", file=sys.stderr)
            return 1
        native = to == "native"
        print(f"group {group_id}: being handed back to the broker's "
              f"{'KIP-848' if native else 'classic'} coordinator")
        if not wait:
            return 0
        if native:
            return await wait_native(client, group_id, deadline, timeout)
        seen = ""
        while trio.current_time() < deadline:
            described = await client.request(ApiKey.DESCRIBE_GROUPS, DESCRIBE_VERSION, {
                "groups": [group_id], "include_authorized_operations": False},
                client_id="groupgate-release")
            state, protocol, members = describe(described)
            now = f"{state} {protocol or '-'} with {len(members)} member(s)"
            if now != seen:
                print(f"{time.strftime('%H:%M:%S')} group {group_id}: {now}")
                seen = now
            if (state == "Stable" and protocol not in ("", LOCK_PROTOCOL)
                    and any(c.startswith(MARK_PREFIX) for c in members)):
                # the broker's own view: it names the members behind sidecars by their member
                # marks (the engine's view, while it still has the group, names none)
                print(f"group {group_id}: the broker's classic coordinator coordinates it")
                return 0
            await trio.sleep(0.5)
        print(f"group {group_id}: not Stable at the broker within {timeout:.0f} s",
              file=sys.stderr)
        return 2
    finally:
        await client.aclose()


async def wait_native(client: UpstreamClient, group_id: str, deadline: float,
                      timeout: float) -> int:
    """Until the broker's KIP-848 coordinator (asked through the sidecar, which passes
    ConsumerGroupDescribe of such a group on) has the group Stable with a member other than
    the anchor."""
    seen = ""
    while trio.current_time() < deadline:
        described = await client.request(ApiKey.CONSUMER_GROUP_DESCRIBE,
                                         CONSUMER_DESCRIBE_VERSION,
                                         {"group_ids": [group_id],
                                          "include_authorized_operations": False},
                                         client_id="groupgate-release")
        error, state, members = consumer_described(described)
        others = [c for c in members if c != ANCHOR_CLIENT_ID]
        now = (f"{state} with {len(members)} member(s)" if error == ErrorCode.NONE
               else f"not described yet (error {error})")
        if now != seen:
            print(f"{time.strftime('%H:%M:%S')} group {group_id}: {now}")
            seen = now
        if error == ErrorCode.NONE and state == "Stable" and others:
            print(f"group {group_id}: the broker's KIP-848 coordinator coordinates it")
            return 0
        await trio.sleep(0.5)
    print(f"group {group_id}: not Stable at the broker's KIP-848 coordinator within "
          f"{timeout:.0f} s", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    try:
        return trio.run(release, args.group, address(args.bootstrap), args.wait, args.timeout,
                        args.to)
    except (UpstreamError, OSError, trio.TooSlowError) as exc:
        print(f"groupgate release: {args.bootstrap}: {exc}", file=sys.stderr)
        return 1
