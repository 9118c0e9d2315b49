"""Remainders: the broker's part of a relayed member's group request, sent on its own connection.

OffsetFetch, OffsetDelete, DescribeGroups and DeleteGroups of a group the engine coordinates
are answered partly by the engine (a member's epoch, a subscribed topic, a described group, a
forgotten group) and partly by the broker (the offsets, their deletion, the broker's groups,
the broker's deletion). A handler says which part is which with a :class:`Split`: the entries
it answers itself, by their index in the request, and the request to send for the rest (or
none). At the coordinating sidecar the rest goes to the broker on the client's connection,
as the client's own request.

For a client behind a follower sidecar the engine's part is decided by the holder and the
rest must still reach the broker under the client's principal, so it is not relayed (decision
record 0018, section 3; decision record 0019): the follower asks the holder with one
``FleetControl`` request, :data:`REMAINDER` (the request as the client sent it and the relay
mark), on the link it relays that client connection's requests on; the holder splits it with
the API's handler (the same code as for its own clients: the member check, the engine's
descriptions, the engine forgetting a group) and answers its entries and the rest; the
follower sends the rest upstream on the client's own connection, where the broker authorizes
it as the client's (DESCRIBE on the groups and topics, DELETE, READ), and merges the broker's
answer with the holder's entries for the client.

A holder built before remainders answers UNSUPPORTED_VERSION with no body: the follower then
relays the request as before (the holder sends the rest as the proxy). Holders of fleet
protocol 2 are never asked. Nothing is kept between the two steps: a remainder has no state at
either sidecar (decision 0008).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.coordination import fleet_answers
from proxy.coordination.handler import PASS, Answer, Outcome, Upstream, Value
from translation.errors import ErrorCode

REMAINDER: Final = "Remainder"
"""The ``FleetControl`` message type a follower asks the holder with."""

APIS: Final = frozenset({ApiKey.OFFSET_FETCH, ApiKey.OFFSET_DELETE, ApiKey.DESCRIBE_GROUPS,
                         ApiKey.DELETE_GROUPS})
"""The APIs whose relayed requests are split this way."""

_LISTS: Final[dict[int, tuple[str, Callable[[Value], list[str]]]]] = {
    ApiKey.OFFSET_FETCH: ("groups", lambda v: [g["group_id"] for g in v["groups"]]),
    ApiKey.DESCRIBE_GROUPS: ("groups", lambda v: list(v["groups"])),
    ApiKey.DELETE_GROUPS: ("results", lambda v: list(v["groups_names"])),
}
"""Per API answered group by group: the answer's list, and the request's group ids in order
(the answer names each entry's group: entries are matched by it)."""


@dataclass(frozen=True, slots=True)
class Split:
    """A request cut in two: what the engine answers, and what goes to the broker."""

    local: Mapping[int, Value] = field(default_factory=dict)
    """By index in the request's list of groups (OffsetDelete: in the order to add them to the
    broker's topics), the entries the engine answers."""
    rest: Value | None = None
    """The request for the broker, None when the engine answers all of it."""


def merged(api_key: int, value: Value, split: Split, response: Value) -> Value:
    """The broker's ``response`` to ``split.rest`` with the engine's entries put back, for the
    whole request ``value``."""
    if api_key == ApiKey.OFFSET_DELETE:
        if not response.get("error_code"):
            response["topics"] = [*response.get("topics", ()),
                                  *(split.local[i] for i in sorted(split.local))]
        return response
    name, ids = _LISTS[api_key]
    response[name] = merge_in_order(ids(value), response.get(name, ()), split.local,
                                    "group_id")
    return response


def whole(api_key: int, split: Split) -> Value:
    """The answer when the engine answers everything (``split.rest`` is None)."""
    entries = [split.local[i] for i in sorted(split.local)]
    if api_key == ApiKey.OFFSET_DELETE:
        return {"error_code": 0, "throttle_time_ms": 0, "topics": entries}
    return {"throttle_time_ms": 0, _LISTS[api_key][0]: entries}


def outcome(api_key: int, value: Value, split: Split | None,
            observe: Callable[[Value], None] | None = None) -> Outcome:
    """A handler's outcome for ``split`` (None: all the broker's, passed untouched); the
    broker's answer is merged, then shown to ``observe`` (a trace)."""
    if split is None:
        return PASS
    if split.rest is None:
        return Answer(whole(api_key, split))

    def on_response(response: Value) -> Value:
        answer = merged(api_key, value, split, response)
        if observe is not None:
            observe(answer)
        return answer

    return Upstream(split.rest, on_response)


async def later(api_key: int, value: Value, split: Awaitable[Split | None]
                ) -> Value | Upstream:
    """:func:`outcome` for a split decided later (DeleteGroups waits for the engine)."""
    decided = await split
    result = outcome(api_key, value, decided)
    if isinstance(result, Answer):
        assert isinstance(result.value, dict)
        return result.value
    if isinstance(result, Upstream):
        return result
    return Upstream(value, lambda response: response)  # all the broker's


def merge_in_order(requested: list[str], answered: Any, local: Mapping[int, Value],
                   key: str) -> list[Value]:
    """Entries for ``requested`` in request order: ``local[index]`` where the proxy answered,
    else the broker's entry for that id (answers are matched by ``key``, in order)."""
    pending: dict[str, list[Value]] = {}
    for entry in answered:
        pending.setdefault(entry[key], []).append(entry)
    out = []
    for index, name in enumerate(requested):
        if index in local:
            out.append(local[index])
        else:
            out.append(pending[name].pop(0))
    return out


# -- what travels ---------------------------------------------------------------------------

def ask_body(api_key: int, version: int, mark: str, request: bytes) -> bytes:
    """A :data:`REMAINDER` body: the request's API, version, encoded body and relay mark."""
    return json.dumps({"type": REMAINDER, "api_key": api_key, "version": version,
                       "mark": mark, "request": base64.b64encode(request).decode()},
                      separators=(",", ":")).encode()


def read_ask(body: dict[str, Any]) -> tuple[int, int, str, bytes]:
    """(api key, version, mark, encoded request) of a :data:`REMAINDER` body; ValueError if
    it does not say them or names another API."""
    api_key, version, mark = body.get("api_key"), body.get("version"), body.get("mark")
    request = body.get("request")
    if not (isinstance(api_key, int) and isinstance(version, int) and isinstance(mark, str)
            and isinstance(request, str)) or api_key not in APIS:
        raise ValueError("not a Remainder")
    return api_key, version, mark, base64.b64decode(request, validate=True)


@dataclass(frozen=True, slots=True)
class Reply:
    """The holder's answer: an error for the whole request, or its split."""

    error: int = 0
    split: Split | None = None


def reply_body(api_key: int, version: int, reply: Reply) -> bytes:
    """The answer's body after its correlation id: the error code, then the split (JSON: the
    engine's entries as a partial response of the API at ``version``, their indexes, and the
    rest as a request at ``version``, each base64)."""
    split = reply.split
    if split is None:
        return fleet_answers.encode(reply.error, {})
    indexes = sorted(split.local)
    partial = whole(api_key, Split({i: split.local[i] for i in indexes}))
    return fleet_answers.encode(reply.error, {
        "indexes": indexes,
        "local": base64.b64encode(messages.encode_response(api_key, version,
                                                           partial)).decode(),
        "rest": None if split.rest is None else base64.b64encode(
            messages.encode_request(api_key, version, split.rest)).decode(),
    })


def read_reply(api_key: int, version: int, raw: bytes) -> Reply | None:
    """The holder's answer; None when it does not take remainders (UNSUPPORTED_VERSION or
    INVALID_REQUEST, no body: relay the request instead). ValueError (or a codec error) if it
    cannot be read."""
    error, body = fleet_answers.read(raw, "a remainder")
    if body is None:
        return None if error in fleet_answers.NOT_TAKEN else Reply(error)
    if "local" not in body:
        return Reply(error or int(ErrorCode.UNKNOWN_SERVER_ERROR))
    indexes, local, sent = body.get("indexes"), body.get("local"), body.get("rest")
    if not (isinstance(indexes, list) and all(isinstance(i, int) for i in indexes)
            and isinstance(local, str) and (sent is None or isinstance(sent, str))):
        raise ValueError("unreadable remainder")
    partial, _ = messages.decode_response(api_key, version,
                                          base64.b64decode(local, validate=True), 0)
    name = "topics" if api_key == ApiKey.OFFSET_DELETE else _LISTS[api_key][0]
    entries = partial.get(name) or []
    if len(entries) != len(indexes):
        raise ValueError("remainder entries do not match their indexes")
    request = (None if sent is None else messages.decode_request(
        api_key, version, base64.b64decode(sent, validate=True), 0)[0])
    return Reply(error, Split(dict(zip(indexes, entries, strict=True)), request))
