"""Several sidecars, one group: which sidecar coordinates a group, and how the others reach it.

Every application pod runs its own groupgate, so the members of one group sit behind several
sidecars. Exactly one of them may coordinate the group. The only thing the sidecars share is
the Kafka cluster, and the lock is the one the proxy already holds: its member in the broker's
classic group of the same id (:mod:`proxy.coordination.membership`).

* **Election.** A sidecar that needs a group nobody holds joins the broker's group. The broker
  makes whoever joined first the leader; a sidecar that finds itself a non-leader leaves at
  once and follows the leader. Every JoinGroup carries the sidecar's :class:`Card` in the
  subscription's user data (the broker keeps it and shows it in DescribeGroups): the fleet
  protocol it speaks, its version, and the address of its fleet listener.
* **Discovery.** A sidecar that gets a request for a group it does not hold asks the broker
  (DescribeGroups) who holds it: :func:`read_holder` turns the answer into a :class:`Holder`.
  The view is cached (:data:`VIEW_SECONDS` for a free group, :data:`SETTLED_VIEW_SECONDS` for
  a held one) and dropped when a relay fails or is refused.
* **Forwarding.** Group requests of a group another sidecar holds are relayed to that
  sidecar's fleet listener, marked (:func:`mark_forwarded`) with the application's client id,
  address, client software and (fleet protocol 2) principal, and the answer goes back to the
  application on its own connection. The coordinating sidecar believes a mark only on a
  connection that proved it comes from a sidecar (``fleet-auth``, docs/security.md) and never
  relays a marked request again: if it does not hold the group (any more), it answers
  NOT_COORDINATOR and the follower looks again.
* **State-log settings.** Sidecars that coordinate a group in turn must read and write the
  same state log (:mod:`proxy.coordination.durability`), or the next one finds no state. The
  card (fleet protocol 3) names the settings that must agree (:class:`StateLogSettingsId`:
  whether the log is on, its topic, a digest of its transactional-id prefix); a sidecar never
  takes over a group held by a sidecar whose card names other ones (it may relay to it,
  :class:`~proxy.coordination.peers.Routes`). A card without them (protocol 1 and 2) says
  nothing of them: never read as a mismatch.
* **Version skew.** A relay carries the mark of the holder's fleet protocol (its card says
  which): a protocol-1 holder gets the mark without the principal, and both marks are read.
  A holder without a card is a groupgate from before the fleet (0.1.0),
  which coordinates on its own: a fleet sidecar never joins next to it and never forwards to
  it; its members are answered COORDINATOR_NOT_AVAILABLE until it is gone (docs/operations.md,
  "Upgrading from 0.1.0").
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.codec import messages
from proxy.coordination.convert import ShapeError, parse_assignment, parse_subscription

log = logging.getLogger("groupgate.coordination")

Address = tuple[str, int]

FLEET_PROTOCOL: Final = 3
"""The version of what sidecars tell each other (the card, the forwarding marker): 1 marks
relays with the application's listener node, host, software and client id; 2 adds its
principal; 3 adds the state-log settings to the card (:class:`StateLogSettingsId`; relays are
marked as for 2)."""
CARD_MAGIC: Final = b"groupgate-fleet:"
FORWARD_MARK: Final = "groupgate-fleet|"
"""Client ids of relayed requests to a protocol-1 holder open with this, then the listener's
node, the application's host, software and client id."""
FORWARD_MARK_2: Final = "groupgate-fleet2|"
"""Client ids of relayed requests to a protocol-2 holder open with this; the principal follows
the software (percent-encoded; empty when the relaying sidecar cannot know it)."""
FORWARD_MARK_3: Final = "groupgate-fleet3|"
"""Client ids of requests relayed to a protocol-3 holder by a sidecar with a fleet address open
with this: as protocol 2, then the relaying sidecar's fleet address and flags (none yet) before
the client id (decision record 0018, section 5). The holder learns from it which sidecars
relay for a group (a hand-back tells them: :mod:`.release`)."""
OLD_FOLLOWER: Final = "0.2.0@"
"""How the sidecar that relayed a request is named when its mark names no fleet address
(fleet protocol 1 or 2): this, then the relaying connection's host."""
VIEW_SECONDS: Final = 3.0
"""How long a follower trusts DescribeGroups saying that nobody holds a group."""
SETTLED_VIEW_SECONDS: Final = 30.0
"""How long it trusts what DescribeGroups said of a group's holder (a sidecar, or the broker's
own members); a relay that fails or is answered NOT_COORDINATOR drops the view at once."""
PROTOCOL_TYPE: Final = "consumer"
PROTOCOL_NAME: Final = "groupgate-coordinated"
"""The classic protocol name the proxy's member offers; no client library uses it."""


@dataclass(frozen=True, slots=True)
class StateLogSettingsId:
    """The state-log settings that must agree between the sidecars of a group, as a card
    carries them: whether the log is on, its topic (readable), and a digest of its
    transactional-id prefix (ids are not advertised)."""

    enabled: bool
    topic: str = ""
    prefix_digest: str = ""

    @classmethod
    def of(cls, enabled: bool, topic: str, transactional_id_prefix: str
           ) -> StateLogSettingsId:
        if not enabled:
            return cls(False)
        digest = hashlib.sha256(transactional_id_prefix.encode()).hexdigest()[:16]
        return cls(True, topic, digest)

    def differences(self, other: StateLogSettingsId) -> tuple[str, ...]:
        """The names of the settings that differ between ``self`` and ``other``."""
        if self.enabled != other.enabled:
            return ("state-log",)
        names: list[str] = []
        if self.topic != other.topic:
            names.append("state-log-topic")
        if self.prefix_digest != other.prefix_digest:
            names.append("state-log-transactional-id-prefix")
        return tuple(names)

    def describe(self) -> str:
        return f"topic {self.topic}" if self.enabled else "state-log off"

    def encode(self) -> dict[str, Any] | bool:
        return {"topic": self.topic, "prefix": self.prefix_digest} if self.enabled else False

    @classmethod
    def decode(cls, body: Any) -> StateLogSettingsId | None:
        if body is False:
            return cls(False)
        if isinstance(body, dict):
            return cls(True, str(body.get("topic", "")), str(body.get("prefix", "")))
        return None  # absent (protocol 1 and 2) or unreadable: unknown


@dataclass(frozen=True, slots=True)
class Card:
    """What a sidecar tells the others through its member in the broker's group."""

    address: Address | None
    """Where peers reach its fleet listener (None: it has none; it cannot be followed)."""
    version: str
    protocol: int = FLEET_PROTOCOL
    state_log: StateLogSettingsId | None = None
    """Its state-log settings (protocol 3; None: not said, unknown)."""

    def encode(self) -> bytes:
        body: dict[str, Any] = {"protocol": self.protocol, "version": self.version,
                                "address": (f"{self.address[0]}:{self.address[1]}"
                                            if self.address is not None else None)}
        if self.state_log is not None:
            body["state_log"] = self.state_log.encode()
        return CARD_MAGIC + json.dumps(body, separators=(",", ":")).encode()

    def state_log_differences(self, other: Card) -> tuple[str, ...]:
        """The state-log settings in which ``other`` differs from this card (none when
        either card does not say)."""
        if self.state_log is None or other.state_log is None:
            return ()
        return self.state_log.differences(other.state_log)

    @classmethod
    def decode(cls, data: bytes | None) -> Card | None:
        """The card in ``data`` (a subscription's user data), or None if there is none."""
        if not data or not data.startswith(CARD_MAGIC):
            return None
        try:
            body = json.loads(data[len(CARD_MAGIC):])
            address = body.get("address")
            parsed: Address | None = None
            if address:
                host, _, port = str(address).rpartition(":")
                parsed = (host, int(port))
            return cls(parsed, str(body.get("version", "")), int(body["protocol"]),
                       StateLogSettingsId.decode(body.get("state_log")))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def subscription_metadata(topics: list[str] | tuple[str, ...], card: Card) -> bytes:
    """The proxy member's JoinGroup metadata: a consumer subscription naming ``topics`` (so
    that the broker keeps their offsets, KIP-211) with the sidecar's card as user data."""
    return messages.encode_data("ConsumerProtocolSubscription", 0,
                                {"topics": list(topics), "user_data": card.encode()})


def card_of(metadata: bytes | bytearray | memoryview | None) -> Card | None:
    """The card in a member's JoinGroup metadata (None: none, or not a subscription)."""
    subscription = parse_subscription(metadata) if metadata else None
    return Card.decode(subscription.user_data) if subscription is not None else None


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a group at the broker, as DescribeGroups shows it."""

    kind: str
    """``free`` (no members now, but members of protocol type ``consumer`` held it before: a
    sidecar's member that left or was dropped, or consumers straight at the broker), ``unused``
    (no members, and none of protocol type ``consumer`` since the broker last kept it: Dead,
    or Empty without that protocol type; no sidecar's state can be in the log for it),
    ``sidecar`` (a fleet sidecar: ``card``),
    ``legacy`` (a groupgate without a card: 0.1.0), ``broker`` (members of another protocol:
    the broker's own group), ``unknown`` (the broker could not say: retry)."""
    card: Card | None = None
    member_id: str = ""
    detail: str = ""
    coordinator: tuple[int, Address] | None = None
    """The broker coordinating the group (node id, address), as the lookup found it."""
    settling: bool = False
    """``unknown`` because the broker's group is rebalancing: worth asking again shortly."""

    @property
    def followable(self) -> bool:
        return self.kind == "sidecar" and self.card is not None and self.card.address is not None


FREE: Final = Holder("free")
UNUSED: Final = Holder("unused")
SETTLED_STATES: Final = frozenset({"Stable"})
"""Group states in which DescribeGroups shows the members' metadata (and so their cards)."""



def read_holder(described: dict[str, Any], own_member_ids: frozenset[str] = frozenset()
                ) -> Holder:
    """The holder of one group from its DescribeGroups entry (any version)."""
    error = described.get("error_code", 0)
    if error:
        return Holder("unknown", detail=f"DescribeGroups error {error}")
    members = described.get("members") or []
    if not members:
        # Kafka keeps an emptied group's protocol type (and its offsets) until the group is
        # cleaned up; a group that never had members, or only offsets committed by tools,
        # shows none (or is Dead)
        held_before = (described.get("group_state") == "Empty"
                       and described.get("protocol_type") == PROTOCOL_TYPE)
        return FREE if held_before else UNUSED
    if described.get("group_state") not in SETTLED_STATES:
        # Kafka describes members' metadata only in a Stable group: while it rebalances no
        # card can be read, and a card-less member is not proof of an old groupgate
        return Holder("unknown", detail=f"the broker's group is {described.get('group_state')}",
                      settling=True)
    if (described.get("protocol_type") != PROTOCOL_TYPE
            or described.get("protocol_data") not in (PROTOCOL_NAME, "")):
        return Holder("broker", detail=f"{len(members)} member(s) of protocol "
                                       f"{described.get('protocol_data') or '-'}")
    others = [m for m in members if m["member_id"] not in own_member_ids]
    cards: list[tuple[str, Card | None]] = [
        (m["member_id"], card_of(m.get("member_metadata"))) for m in others]
    if any(card is None for _, card in cards):
        return Holder("legacy", detail="a groupgate without fleet support (0.1.0) holds it")
    if not cards:
        return FREE
    # Several cards: an election is being settled (a sidecar that joined next to the holder
    # leaves again). The holder is the broker's leader, the one member whose assignment
    # carries its card (it assigns the card to itself only, ``lock_assignment``), in any
    # order DescribeGroups lists them; without one, any of them forwards correctly or answers
    # NOT_COORDINATOR, after which the follower looks again.
    leader = next((i for i, m in enumerate(others)
                   if _assigned_card(m.get("member_assignment"))), 0)
    member_id, card = cards[leader]
    return Holder("sidecar", card=card, member_id=member_id)


def _assigned_card(assignment: bytes | bytearray | memoryview | None) -> bool:
    """Whether a member's assignment carries a card (the lock member that leads the group)."""
    if not assignment:
        return False
    try:
        _assigned, user_data = parse_assignment(assignment)
    except ShapeError:
        return False
    return Card.decode(user_data) is not None


def mark_forwarded(client_id: str | None, client_host: str, node_id: int | None = None,
                   software: tuple[str, str] | None = None, principal: str | None = None,
                   protocol: int = FLEET_PROTOCOL, follower: str | None = None) -> str:
    """The client id a relayed request carries: the mark, the broker node whose listener the
    application sent it to (empty: the bootstrap listener), its host, the client software it
    named in ApiVersions (KIP-511; ``name/version``, empty if unknown), with ``protocol`` 2 or
    later its principal (``User:name``, empty if unknown), with ``protocol`` 3 and a
    ``follower`` (the relaying sidecar's fleet address, ``host:port``) that address and the
    flags, and its client id."""
    node = "" if node_id is None else str(node_id)
    named = f"{software[0]}/{software[1]}" if software is not None else ""
    if protocol < 2:
        return f"{FORWARD_MARK}{node}|{client_host}|{named}|{client_id or ''}"
    who = _escape(principal or "")
    if protocol >= 3 and follower:
        return (f"{FORWARD_MARK_3}{node}|{client_host}|{named}|{who}|{_escape(follower)}||"
                f"{client_id or ''}")
    return f"{FORWARD_MARK_2}{node}|{client_host}|{named}|{who}|{client_id or ''}"


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("|", "%7C")


def _unescape(text: str) -> str:
    return text.replace("%7C", "|").replace("%25", "%")


@dataclass(frozen=True, slots=True)
class Relayed:
    """What a relayed request's mark says of the application behind it."""

    client_id: str
    client_host: str
    node_id: int | None
    software: tuple[str, str] | None
    principal: str | None = None
    """The principal the application authenticated as (None: not said, or not knowable)."""
    follower: str | None = None
    """The relaying sidecar's fleet address (protocol 3; None: not said)."""
    protocol: int = field(default=1, compare=False)
    """The fleet protocol of the mark."""


def is_marked(client_id: str | None) -> bool:
    """Whether ``client_id`` opens with a relay mark of any fleet protocol."""
    return client_id is not None and (client_id.startswith(FORWARD_MARK)
                                      or client_id.startswith(FORWARD_MARK_2)
                                      or client_id.startswith(FORWARD_MARK_3))


def unmark(client_id: str | None) -> Relayed | None:
    """What the mark of a relayed request says (either protocol), None for other requests."""
    if client_id is None:
        return None
    principal: str | None = None
    follower: str | None = None
    protocol = 1
    if client_id.startswith(FORWARD_MARK_3):
        parts = client_id[len(FORWARD_MARK_3):].split("|", 6)
        if len(parts) != 7:
            return None
        node, host, named, who, by, _flags, original = parts
        principal, follower, protocol = _unescape(who) or None, _unescape(by) or None, 3
    elif client_id.startswith(FORWARD_MARK_2):
        parts = client_id[len(FORWARD_MARK_2):].split("|", 4)
        if len(parts) != 5:
            return None
        node, host, named, who, original = parts
        principal, protocol = _unescape(who) or None, 2
    elif client_id.startswith(FORWARD_MARK):
        parts = client_id[len(FORWARD_MARK):].split("|", 3)
        if len(parts) != 4:
            return None
        node, host, named, original = parts
    else:
        return None
    try:
        node_id = int(node) if node else None
    except ValueError:
        return None
    name, _, version = named.partition("/")
    return Relayed(original, host, node_id, (name, version) if name and version else None,
                   principal, follower, protocol)
