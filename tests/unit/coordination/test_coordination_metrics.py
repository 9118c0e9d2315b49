"""The coordinator's metrics: rebalances and fences by reason, groups by state and protocol,
members by protocol and groups followed (read at scrape time), on trio's mock clock; and the
reasons the engine gives all have a label of their own (the label sets stay bounded and
meaningful)."""

from __future__ import annotations

import ast
from pathlib import Path

import trio
import trio.testing

from proxy import metrics
from proxy.coordination.fleet import Card, Holder

from .helpers import coordinate, make_service
from .helpers import joining_heartbeat as _hb

ENGINE = Path(__file__).resolve().parents[3] / "translation"


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_session_timeout_counts_a_fence_and_a_rebalance_and_the_gauges_follow(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(group_empty_expiry_ms=60_000)
    coordinate(service, "g")
    created = sample("groupgate_rebalances_total", reason="group-created")
    timed_out = sample("groupgate_rebalances_total", reason="session-timeout")
    fenced = sample("groupgate_members_fenced_total", reason="session-timeout")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        assert (await service.heartbeat(_hb("m1", 0))).error_code == 0
        assert sample("groupgate_rebalances_total", reason="group-created") == created + 1
        assert sample("groupgate_coordinated_members", protocol="consumer") == 1
        assert sample("groupgate_coordinated_members", protocol="classic") == 0
        shapes = {(s, p): sample("groupgate_coordinated_groups", state=s, protocol=p)
                  for s in metrics.GROUP_STATES for p in metrics.GROUP_PROTOCOLS}
        assert sum(shapes.values()) == 1
        assert sum(n for (s, p), n in shapes.items() if p == "consumer" and s != "empty") == 1
        await trio.sleep(6.1)  # past the 6 s session timeout: fenced by the timer task
        assert not service.engine.groups["g"].members
        assert sample("groupgate_members_fenced_total", reason="session-timeout") == fenced + 1
        assert sample("groupgate_rebalances_total", reason="session-timeout") == timed_out + 1
        assert sample("groupgate_coordinated_groups", state="empty", protocol="none") == 1
        assert sample("groupgate_coordinated_members", protocol="consumer") == 0
        nursery.cancel_scope.cancel()


async def test_groups_followed_are_those_held_by_another_sidecar_it_can_relay_to(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service(fleet_listen=("10.0.0.5", 9191))
    own = service.routes.own_address
    assert own is not None
    views = {"elsewhere": Holder("sidecar", Card(("10.0.0.9", 9191), "0.3.0"), "m9"),
             "mine-before-a-restart": Holder("sidecar", Card(own, "0.3.0"), "m0"),
             "no-listener": Holder("sidecar", Card(None, "0.3.0"), "m2"),
             "broker": Holder("broker"), "free": Holder("free")}
    for group_id, holder in views.items():
        service.routes.directory._views[group_id] = holder
    assert sample("groupgate_groups_followed") == 1
    await trio.sleep(3600)  # the views age out, and the gauge with them
    assert sample("groupgate_groups_followed") == 0


def test_a_group_s_protocol_label_is_its_members_protocol() -> None:
    assert metrics.group_protocol([]) == "none"
    assert metrics.group_protocol(["consumer", "consumer"]) == "consumer"
    assert metrics.group_protocol(["classic"]) == "classic"
    assert metrics.group_protocol(["classic", "consumer"]) == "mixed"


def test_reason_labels() -> None:
    assert metrics.rebalance_reason("group created; member joined; subscription changed") == (
        "group-created")
    assert metrics.rebalance_reason("subscribed topic metadata changed") == (
        "subscribed-topic-metadata-changed")
    assert metrics.rebalance_reason("member g-17 asked for it") == "other"
    assert metrics.fence_reason("pod-local") == "pod-local"
    assert metrics.fence_reason("anything else") == "other"


def _engine_reasons() -> tuple[set[str], set[str]]:
    """String literals the engine passes as a group epoch bump's reason (directly, through
    ``remove_member`` or a ``reasons`` list) and as a fence's reason."""
    bumps: set[str] = set()
    fences: set[str] = set()
    for path in ENGINE.rglob("*.py"):
        if "simulation" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            position = {"bump_group_epoch": 1, "remove_member": 2, "MemberFenced": 2}.get(name)
            if (name == "append" and isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name) and func.value.id == "reasons"):
                position = 0
            if position is None or len(node.args) <= position:
                continue
            arg = node.args[position]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                (fences if name == "MemberFenced" else bumps).add(arg.value)
    return bumps, fences


def test_every_reason_the_engine_gives_has_its_own_label() -> None:
    bumps, fences = _engine_reasons()
    assert {"member joined", "session timeout", "classic sync timeout"} <= bumps
    assert {"join-timeout", "sync-timeout"} <= fences
    assert bumps <= metrics.REBALANCE_REASONS, bumps - metrics.REBALANCE_REASONS
    assert fences <= metrics.FENCE_REASONS, fences - metrics.FENCE_REASONS
    # fence_member's reasons (the engine's session and rebalance timeouts, the pod-local
    # fence) become epoch-bump reasons with spaces
    for reason in metrics.FENCE_REASONS - {"join-timeout", "sync-timeout"}:
        assert reason.replace("-", " ") in metrics.REBALANCE_REASONS


def test_a_scrape_outside_the_service_s_trio_run_reads_nothing_of_it() -> None:
    make_service()  # its fleet directory keeps time with trio's clock
    assert sample("groupgate_groups_followed") == 0  # no error: the scrape still works
    assert sample("groupgate_coordinated_members", protocol="consumer") == 0


async def test_a_stopped_service_is_no_longer_published(
        autojump_clock: trio.testing.MockClock) -> None:
    service = make_service()
    coordinate(service, "g")
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: service.run(watch_topics=False,
                                                            task_status=task_status))
        assert (await service.heartbeat(_hb("m1", 0))).error_code == 0
        assert sample("groupgate_coordinated_members", protocol="consumer") == 1
        await service.aclose()
        assert sample("groupgate_coordinated_members", protocol="consumer") == 0
        nursery.cancel_scope.cancel()
