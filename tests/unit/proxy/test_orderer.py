"""ResponseOrderer: responses leave in request order whatever order they become ready in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.orderer import OrderingError, ResponseOrderer


def test_local_answer_waits_behind_an_outstanding_forwarded_request() -> None:
    orderer = ResponseOrderer()
    orderer.expect_upstream(1, 3, 12)
    local = orderer.reserve(2, 18, 3)
    orderer.fill(local, b"local")
    assert orderer.take_ready() == []
    orderer.fill(orderer.upstream_response(1), b"forwarded")
    assert orderer.take_ready() == [b"forwarded", b"local"]
    assert len(orderer) == 0


def test_out_of_order_upstream_correlation_id_is_an_error() -> None:
    orderer = ResponseOrderer()
    orderer.expect_upstream(7, 0, 9)
    orderer.expect_upstream(8, 0, 9)
    with pytest.raises(OrderingError, match="expected 7"):
        orderer.upstream_response(8)


def test_response_without_request_is_an_error() -> None:
    with pytest.raises(OrderingError, match="no request is outstanding"):
        ResponseOrderer().upstream_response(1)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1000)), min_size=1, max_size=40),
       st.randoms())
def test_release_order_equals_request_order(kinds: list[tuple[bool, int]], rnd) -> None:  # type: ignore[no-untyped-def]
    orderer = ResponseOrderer()
    slots = []
    for corr, (local, _) in enumerate(kinds):
        if local:
            slots.append(orderer.reserve(corr, 0, 0))
        else:
            slots.append(orderer.expect_upstream(corr, 0, 0))
    # Local answers complete in random order; upstream ones in order (brokers answer in order).
    upstream_corrs = [c for c, (local, _) in enumerate(kinds) if not local]
    pending_local = [s for s, (local, _) in zip(slots, kinds, strict=True) if local]
    rnd.shuffle(pending_local)
    released: list[bytes] = []
    while pending_local or upstream_corrs:
        if upstream_corrs and (not pending_local or rnd.random() < 0.5):
            corr = upstream_corrs.pop(0)
            orderer.fill(orderer.upstream_response(corr), str(corr).encode())
        else:
            slot = pending_local.pop()
            orderer.fill(slot, str(slot.correlation_id).encode())
        released.extend(orderer.take_ready())  # type: ignore[arg-type]
    assert released == [str(c).encode() for c in range(len(kinds))]


def test_cut_through_takes_the_head_slot_or_pushes_it_back() -> None:
    orderer = ResponseOrderer()
    local = orderer.reserve(1, 18, 3)
    big = orderer.expect_upstream(2, 1, 15)
    slot = orderer.upstream_response(2)
    assert slot is big and not orderer.is_next(big)
    orderer.push_back(big)  # a local answer is still ahead: not streamed now
    with pytest.raises(OrderingError, match="not next"):
        orderer.release_next(big)
    orderer.fill(local, b"local")
    assert orderer.take_ready() == [b"local"]
    assert orderer.upstream_response(2) is big and orderer.is_next(big)
    orderer.release_next(big)
    assert len(orderer) == 0 and orderer.awaiting_upstream == 0


# -- probes: the proxy's own requests on the client's connection ------------------------------


def test_a_probe_answer_goes_to_the_proxy_and_never_to_the_client() -> None:
    orderer = ResponseOrderer()
    got: list[bytes] = []
    abandoned: list[int] = []
    orderer.expect_upstream(1, 1, 12)  # a fetch before the probe
    orderer.probe(-1, 12, 4, lambda payload: got.append(bytes(payload)),
                  lambda: abandoned.append(-1))
    local = orderer.reserve(2, 68, 0)  # the request the probe was for, answered locally
    assert len(orderer) == 2  # the probe is not in the client's queue
    assert orderer.answering_head is False and not orderer.probe_next
    orderer.fill(orderer.upstream_response(1), b"fetch")
    assert orderer.probe_next
    probe = orderer.upstream_response(-1)
    assert probe.probe and probe.on_response is not None
    probe.on_response(memoryview(b"probe answer"))
    orderer.fill(local, b"heartbeat")
    assert orderer.take_ready() == [b"fetch", b"heartbeat"]
    assert got == [b"probe answer"] and not abandoned
    assert orderer.awaiting_upstream == 0 and len(orderer) == 0


def test_a_probe_waiting_when_the_connection_ends_is_told() -> None:
    orderer = ResponseOrderer()
    told: list[str] = []
    orderer.expect_upstream(1, 1, 12)
    orderer.probe(-1, 3, 10, lambda payload: None, lambda: told.append("probe"))
    orderer.abandon()
    assert told == ["probe"] and orderer.awaiting_upstream == 0


def test_a_probe_answered_out_of_wire_order_is_an_error() -> None:
    orderer = ResponseOrderer()
    orderer.probe(-1, 3, 10, lambda payload: None, lambda: None)
    orderer.expect_upstream(5, 1, 12)
    with pytest.raises(OrderingError, match="expected -1"):
        orderer.upstream_response(5)


@given(st.lists(st.sampled_from(["local", "upstream", "probe"]), min_size=1, max_size=40),
       st.randoms())
def test_probes_anywhere_leave_the_clients_order_and_bytes_unchanged(kinds: list[str], rnd) -> None:  # type: ignore[no-untyped-def]
    """Whatever probes are interleaved with a client's requests on the wire, the client gets
    exactly its own responses in its own order, and each probe exactly its own answer."""
    orderer = ResponseOrderer()
    probe_answers: dict[int, bytes] = {}
    wire: list[int] = []  # correlation ids in the order they went to the broker
    local: list[object] = []
    client_ids: list[int] = []
    for index, kind in enumerate(kinds):
        if kind == "probe":
            cid = -1 - index
            orderer.probe(cid, 3, 10, lambda p, c=cid: probe_answers.__setitem__(c, bytes(p)),
                          lambda: None)
            wire.append(cid)
        elif kind == "upstream":
            orderer.expect_upstream(index, 0, 0)
            wire.append(index)
            client_ids.append(index)
        else:
            local.append(orderer.reserve(index, 0, 0))
            client_ids.append(index)
    rnd.shuffle(local)
    released: list[bytes] = []
    while wire or local:
        if wire and (not local or rnd.random() < 0.5):
            cid = wire.pop(0)
            slot = orderer.upstream_response(cid)
            if slot.probe:
                assert slot.on_response is not None
                slot.on_response(memoryview(f"p{cid}".encode()))
            else:
                orderer.fill(slot, str(cid).encode())
        else:
            slot = local.pop()
            orderer.fill(slot, str(slot.correlation_id).encode())  # type: ignore[attr-defined]
        released.extend(bytes(r) for r in orderer.take_ready())
    assert released == [str(c).encode() for c in client_ids]
    assert probe_answers == {-1 - i: f"p{-1 - i}".encode()
                             for i, k in enumerate(kinds) if k == "probe"}
