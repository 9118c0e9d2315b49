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
