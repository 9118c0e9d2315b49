"""The hand-back's bookkeeping (sans-I/O: times passed in) and the release command's shape."""

from __future__ import annotations

from proxy.coordination.release import (
    GROUP_RESOURCE,
    RELEASE_CONFIG,
    ReleaseBook,
    ReleasePhase,
    release_bound_s,
    release_groups,
)


def started(book: ReleaseBook, now: float = 0.0, bound: float = 3.0) -> None:
    release = book.start("g", "groupgate release", ["c1", "c2"], ["n1"], now, bound)
    assert not isinstance(release, str)


def test_releasing_ends_once_every_member_gave_up() -> None:
    book = ReleaseBook()
    started(book)
    assert book.phase("g", 0.0) is ReleasePhase.RELEASING
    assert not book.ready("g", 1.0)
    book.gave_up("g", "c1", 1.0)  # its JoinGroup arrived
    book.gave_up("g", "n1", 1.0)  # it reported owning nothing
    assert not book.ready("g", 1.0)
    book.gave_up("g", "c2", 1.5)
    assert book.ready("g", 1.5)


def test_releasing_ends_at_its_bound_whoever_is_silent() -> None:
    book = ReleaseBook()
    started(book, bound=3.0)
    book.gave_up("g", "c1", 1.0)
    assert not book.ready("g", 2.9)
    assert book.ready("g", 3.0)
    release = book.get("g", 3.0)
    assert release is not None and release.unreleased == {"c2", "n1"}


def test_who_is_answered_what() -> None:
    book = ReleaseBook()
    started(book)
    assert book.classic_member("g", "c1", 0.0) and not book.classic_member("g", "n1", 0.0)
    assert book.consumer_member("g", "n1", 0.0) and not book.consumer_member("g", "c1", 0.0)
    assert not book.classic_member("other", "c1", 0.0)
    book.released("g", 1.0, ["c3"])
    # after the hand-back: classic members (those the engine still had too) are told to
    # rejoin; KIP-848 members are the bridged members' from now on
    assert book.classic_member("g", "c3", 1.0)
    assert not book.consumer_member("g", "n1", 1.0)


def test_a_member_that_left_is_not_carried_over() -> None:
    book = ReleaseBook()
    started(book)
    book.gave_up("g", "n1", 1.0, left=True)
    release = book.get("g", 1.0)
    assert release is not None and release.left == {"n1"} and "n1" not in release.unreleased


def test_a_released_group_is_remembered_then_forgotten() -> None:
    book = ReleaseBook(remember_s=100.0)
    started(book)
    book.released("g", 5.0)
    assert book.phase("g", 104.9) is ReleasePhase.RELEASED
    assert book.phase("g", 105.0) is None and len(book) == 0


def test_a_second_release_while_one_is_under_way_is_refused() -> None:
    book = ReleaseBook()
    started(book)
    assert isinstance(book.start("g", "again", [], [], 1.0, 3.0), str)
    book.released("g", 2.0)
    assert not isinstance(book.start("g", "again", [], [], 3.0, 3.0), str)


def test_bounded_the_oldest_released_group_goes_first() -> None:
    book = ReleaseBook(max_groups=2)
    for i, group in enumerate(("a", "b")):
        assert not isinstance(book.start(group, "r", [], [], float(i), 1.0), str)
        book.released(group, float(i))
    assert not isinstance(book.start("c", "r", [], [], 5.0, 1.0), str)
    assert book.get("a", 5.0) is None and book.get("b", 5.0) is not None
    assert len(book) == 2


def test_abort_forgets_a_release_under_way_only() -> None:
    book = ReleaseBook()
    started(book)
    book.abort("g")
    assert book.get("g", 0.0) is None
    started(book)
    book.released("g", 1.0)
    book.abort("g")
    assert book.phase("g", 1.0) is ReleasePhase.RELEASED


def test_the_bound_is_half_the_shortest_session() -> None:
    assert release_bound_s([6000, 45_000], 45_000) == 3.0
    assert release_bound_s([], 45_000) == 22.5
    assert release_bound_s([0, 1000], 45_000) == 1.0  # at least a second


def resource(name: str, configs: list[str], kind: int = GROUP_RESOURCE) -> dict[str, object]:
    return {"resource_type": kind, "resource_name": name,
            "configs": [{"name": c, "config_operation": 0, "value": "true"} for c in configs]}


def test_the_command_is_a_group_resource_setting_only_the_release_config() -> None:
    assert release_groups({"resources": [resource("g", [RELEASE_CONFIG])]}) == ["g"]
    assert release_groups({"resources": [resource("g", [RELEASE_CONFIG, "x"])]}) == []
    assert release_groups({"resources": [resource("g", ["consumer.session.timeout.ms"])]}) == []
    assert release_groups({"resources": [resource("t", [RELEASE_CONFIG], kind=2)]}) == []
    assert release_groups({"resources": []}) == []
