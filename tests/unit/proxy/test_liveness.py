"""The pod-local liveness signal (docs/decisions/0020-pod-local-liveness.md): a process that
dies closes all its connections at once and none come back; anything else stays silent."""

from __future__ import annotations

from proxy.liveness import Identity, LivenessTracker, Outcome, SeenMember

APP = Identity("/127.0.0.1", "rdkafka", "librdkafka/2.6.1")
OTHER = Identity("/127.0.0.1", "rdkafka", "librdkafka/2.6.0")
M = SeenMember("g", "m1", 3)


def client(tracker: LivenessTracker, first: int, n: int, identity: Identity = APP,
           now: int = 0) -> list[int]:
    """``n`` connections of one client; the first carries the member's heartbeats."""
    ids = list(range(first, first + n))
    for conn_id in ids:
        tracker.opened(conn_id)
        tracker.identified(conn_id, identity, now)
    tracker.member_seen(ids[0], M)
    return ids


def test_a_process_that_dies_is_declared_after_the_grace() -> None:
    t = LivenessTracker(window_ms=200, grace_ms=400)
    ids = client(t, 1, 3)
    assert t.closed(ids[1], 10_000, by_client=True) == []
    assert t.closed(ids[2], 10_001, by_client=True) == []
    assert t.closed(ids[0], 10_002, by_client=True) == [M]
    assert t.next_deadline() == 10_402
    assert t.due(10_401) == []
    (declared,) = t.due(10_402)
    assert declared.member == M and declared.observed_at_ms == 10_002
    assert t.counts[Outcome.DECLARED] == 1 and t.next_deadline() is None


def test_a_client_that_reconnects_within_the_grace_comes_back() -> None:
    t = LivenessTracker(window_ms=200, grace_ms=400)
    ids = client(t, 1, 3)
    for conn_id in ids:
        t.closed(conn_id, 1000, by_client=True)
    t.opened(9)
    t.identified(9, APP, 1300)
    assert t.due(10_000) == []
    assert t.counts[Outcome.RETURNED] == 1


def test_a_request_of_the_member_within_the_grace_is_a_return() -> None:
    t = LivenessTracker()
    ids = client(t, 1, 2)
    for conn_id in ids:
        t.closed(conn_id, 1000, by_client=True)
    t.member_seen(42, M)  # e.g. relayed from elsewhere: the member is alive
    assert t.due(10_000) == [] and t.counts[Outcome.RETURNED] == 1


def test_a_reconnect_after_the_grace_is_too_late() -> None:
    t = LivenessTracker(window_ms=200, grace_ms=400)
    ids = client(t, 1, 2)
    for conn_id in ids:
        t.closed(conn_id, 1000, by_client=True)
    assert [d.member for d in t.due(1400)] == [M]
    t.opened(9)
    t.identified(9, APP, 1500)
    assert t.counts[Outcome.RETURNED] == 0


def test_the_group_connection_closing_alone_is_silent() -> None:
    """Reaped by connections.max.idle.ms, or reset: the client's other connections stay."""
    t = LivenessTracker()
    ids = client(t, 1, 3)
    assert t.closed(ids[0], 1000, by_client=True) == []
    assert t.due(100_000) == [] and t.counts[Outcome.SUSPECTED] == 0


def test_closes_spread_over_time_are_not_a_death() -> None:
    t = LivenessTracker(window_ms=200)
    ids = client(t, 1, 3)
    t.closed(ids[1], 1000, by_client=True)
    t.closed(ids[2], 5000, by_client=True)
    assert t.closed(ids[0], 9000, by_client=True) == []  # alone in its window
    assert t.due(100_000) == []


def test_a_client_with_one_connection_is_never_declared() -> None:
    t = LivenessTracker()
    (only,) = client(t, 1, 1)
    assert t.closed(only, 1000, by_client=True) == []


def test_closes_the_proxy_made_are_silent() -> None:
    """A broker restart passed on, max-connections, hostile input: the proxy closed one of
    the burst's connections."""
    t = LivenessTracker()
    ids = client(t, 1, 3)
    t.closed(ids[1], 1000, by_client=False)
    t.closed(ids[2], 1001, by_client=True)
    assert t.closed(ids[0], 1002, by_client=True) == []
    assert t.due(100_000) == []


def test_a_draining_sidecar_is_silent() -> None:
    t = LivenessTracker()
    ids = client(t, 1, 2)
    t.closed(ids[0], 1000, by_client=True)
    t.silence()
    assert t.closed(ids[1], 1001, by_client=True) == []
    assert t.due(100_000) == []


def test_draining_after_a_suspicion_drops_it() -> None:
    t = LivenessTracker()
    ids = client(t, 1, 2)
    for conn_id in ids:
        t.closed(conn_id, 1000, by_client=True)
    t.silence()
    assert t.due(100_000) == []


def test_static_members_are_never_declared() -> None:
    t = LivenessTracker()
    ids = client(t, 1, 2)
    t.member_seen(ids[0], M, static=True)
    for conn_id in ids:
        t.closed(conn_id, 1000, by_client=True)
    assert t.due(100_000) == [] and t.counts[Outcome.SUSPECTED] == 0


def test_a_live_process_with_the_same_identity_keeps_the_dead_one_silent() -> None:
    """Two processes, one client id and software: the live one's connections stay open."""
    t = LivenessTracker()
    dead = client(t, 1, 2)
    for conn_id in (10, 11):
        t.opened(conn_id)
        t.identified(conn_id, APP, 0)
    for conn_id in dead:
        t.closed(conn_id, 1000, by_client=True)
    assert t.due(100_000) == []


def test_another_identity_does_not_count_as_a_return() -> None:
    t = LivenessTracker()
    ids = client(t, 1, 2)
    for conn_id in ids:
        t.closed(conn_id, 1000, by_client=True)
    t.opened(9)
    t.identified(9, OTHER, 1100)
    assert [d.member for d in t.due(1400)] == [M]


def test_peers_off_loopback_are_silent() -> None:
    """A mesh proxy between application and sidecar, or another pod's client."""
    t = LivenessTracker()
    client(t, 1, 2, Identity("/10.0.0.7", "rdkafka", "librdkafka/2.6.1"))
    assert t.closed(1, 1000, by_client=True) == [] and t.closed(2, 1000, by_client=True) == []
    assert t.due(100_000) == [] and len(t) == 0


def test_a_member_moves_with_its_requests_and_a_left_member_is_forgotten() -> None:
    t = LivenessTracker()
    ids = client(t, 1, 3)
    t.member_seen(ids[1], SeenMember("g", "m1", 4))  # a new group connection
    t.closed(ids[0], 500, by_client=True)  # the old one reaped: nothing to say
    t.closed(ids[2], 1000, by_client=True)
    assert t.closed(ids[1], 1001, by_client=True) == [SeenMember("g", "m1", 4)]
    t.member_left("g", "m1")
    assert t.due(100_000) == []


def test_state_is_released_when_connections_close() -> None:
    t = LivenessTracker()
    for round_ in range(50):
        ids = client(t, round_ * 10, 3)
        for conn_id in ids:
            t.closed(conn_id, round_ * 1000, by_client=True)
        t.due(round_ * 1000 + 10_000)
    assert len(t) == 0 and not t._clients and not t._ties and not t._suspects


def test_a_connection_the_proxy_refused_drops_every_suspect() -> None:
    """max-connections, or no broker: the suspect's client may have been the one refused."""
    t = LivenessTracker()
    ids = client(t, 1, 2)
    for conn_id in ids:
        t.closed(conn_id, 1000, by_client=True)
    t.proxy_refused()
    assert t.due(100_000) == [] and t.counts[Outcome.RETURNED] == 1
