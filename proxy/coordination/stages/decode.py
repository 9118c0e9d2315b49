"""Decoding, the head of both stage lists: a request's frame to the value the stages pass on.

A request of an examined API is decoded whole, once, at its version, with what the connection
knows of its client (client id, address, the listener's broker, the principal). On the
client-facing list a KIP-848 heartbeat carrying the epoch of an answer its client has not read
goes on with the epoch that answer gave (:mod:`..heartbeat_answers`), and every heartbeat answer
is noted on its way out. On the fleet listener, the relay mark in the client id says who the
application is, believed only from a peer that proved it is a sidecar. A request that cannot be
decoded closes the connection (``RejectRequest``), as a broker would.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from proxy.codec import messages
from proxy.codec.api_keys import ApiKey
from proxy.codec.errors import CodecError
from proxy.codec.header import RequestHeader, parse_request_header
from proxy.connection import RejectRequest, RequestInfo
from proxy.coordination.fleet import OLD_FOLLOWER, unmark
from proxy.coordination.handler import ApiHandler, GroupRequest, Value
from proxy.coordination.heartbeat_answers import HeartbeatAnswers
from proxy.coordination.stages.stage import Decoder

if TYPE_CHECKING:
    from proxy.journal.clients import ClientSoftwareDirectory
    from proxy.security.session import Session

log = logging.getLogger("groupgate.coordination")

_HEARTBEAT = ApiKey.CONSUMER_GROUP_HEARTBEAT


def _decoded(request: RequestInfo) -> tuple[RequestHeader, Value]:
    key, version = request.api_key, request.api_version
    frame = request.frame
    try:
        header = parse_request_header(frame)
        value, _ = messages.decode_request(key, version, frame, header.header_length)
    except CodecError as exc:
        raise RejectRequest(_malformed(key, version, exc)) from exc
    return header, value


def _malformed(key: int, version: int, exc: CodecError) -> str:
    return f"malformed request (api key {key} v{version}): {exc}"


class ClientDecoder(Decoder):
    """An application's own connection: its requests as its client sent them, KIP-848
    heartbeats caught up with the answers their client has not read."""

    __slots__ = ("_caught_up", "_client_host", "_node_id", "_session", "answers")

    apis = frozenset({_HEARTBEAT})
    """The answers it notes (it decodes every examined API)."""

    def __init__(self, node_id: int | None, client_host: str, session: Session) -> None:
        self._node_id = node_id
        self._client_host = client_host
        self._session = session
        self.answers = HeartbeatAnswers()
        """The epochs this connection's KIP-848 members were last given."""
        self._caught_up: dict[int, int] = {}
        """By correlation id: the epoch a heartbeat carried as its client sent it, where it
        goes on with the epoch the client was last given; dropped when it is answered."""

    def decode(self, handler: ApiHandler, request: RequestInfo) -> GroupRequest:
        key, version = request.api_key, request.api_version
        frame = request.frame
        try:
            header = parse_request_header(frame)
            value, _ = messages.decode_request(key, version, frame, header.header_length)
        except CodecError as exc:
            raise RejectRequest(_malformed(key, version, exc)) from exc
        if key == _HEARTBEAT:
            given = self.answers.catch_up(value)
            if given is not None:
                log.debug("member %s carries epoch %d whose answer it has not read: it goes "
                          "on with epoch %d", value.get("member_id"), value["member_epoch"],
                          given)
                self._caught_up[request.correlation_id] = value["member_epoch"]
                value = dict(value, member_epoch=given)
        return GroupRequest(handler.api_key, version, request.correlation_id, header.client_id,
                            self._client_host, self._node_id,
                            bytes(frame[:header.header_length]), value, self._session.principal)

    def answer(self, request: GroupRequest, value: Value) -> Value:
        carried = self._caught_up.pop(request.correlation_id,
                                      request.value.get("member_epoch", 0))
        self.answers.answered(carried, request.value, value)
        return value


class RelayedDecoder(Decoder):
    """A connection on the fleet listener: what a peer sidecar's relay mark says of the
    application (client id, address, listener, software, principal) and of the sidecar that
    relayed it (its fleet address, protocol 3)."""

    __slots__ = ("_client_host", "_node_id", "_session", "_software")

    def __init__(self, node_id: int | None, client_host: str, session: Session,
                 software: ClientSoftwareDirectory | None) -> None:
        self._node_id = node_id
        self._client_host = client_host
        self._session = session
        self._software = software

    def decode(self, handler: ApiHandler, request: RequestInfo) -> GroupRequest:
        header, value = _decoded(request)
        session = self._session
        client_id, client_host, node_id = header.client_id, self._client_host, self._node_id
        principal = session.principal
        relayed = unmark(client_id) if session.fleet_peer else None
        relayed_by = None
        if relayed is not None:
            relayed_by = relayed.follower or f"{OLD_FOLLOWER}{client_host}"
            client_id, client_host, node_id, principal = (
                relayed.client_id, relayed.client_host, relayed.node_id, relayed.principal)
            if relayed.software is not None and self._software is not None:
                self._software.note(client_host, client_id, *relayed.software)
        return GroupRequest(handler.api_key, request.api_version, request.correlation_id,
                            client_id, client_host, node_id,
                            bytes(request.frame[:header.header_length]), value, principal,
                            relayed_by=relayed_by)
