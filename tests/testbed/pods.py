"""Pods for the sidecar topology: one Linux network namespace per pod, joined by a bridge.

In Kubernetes every pod has its own loopback, where the application reaches its sidecar at
``127.0.0.1:9092``, and a pod address on the cluster network. :class:`PodNetwork` reproduces
that on one machine: a bridge in the root namespace (address ``10.233.N.1``, where the test
bed's brokers listen) and, per :class:`Pod`, a network namespace with its own ``lo`` and an
``eth0`` (``10.233.N.k``) on the bridge through a veth pair. Processes run in a pod with
``ip netns exec``: a sidecar started there listens on the pod's own loopback, and clients
started there see only that loopback and the bridge.

Faults, each undone by its pair (or a context manager around both):

* :meth:`Pod.cut_off` / :meth:`Pod.reconnect` (:meth:`Pod.partitioned`): the pod loses the
  brokers only, as over a network partition: its packets to the brokers' address and theirs to
  the pod go to a next hop nobody answers (a route on each side via ``10.233.N.254``, whose
  neighbour entry is a MAC no interface has). Nothing comes back: a connect times out, an
  established connection stops getting data (no RST, no ICMP; it resumes after
  :meth:`Pod.reconnect` if neither side gave up), while the pod's loopback and the other pods'
  addresses (the fleet listeners) stay reachable. A ``blackhole`` (or ``unreachable``,
  ``prohibit``) route in the pod would not do: the pod's own connects would fail at once
  (EINVAL, EHOSTUNREACH, EACCES) instead of timing out.
* :func:`frozen` (:func:`pause` / :func:`resume`): SIGSTOP and SIGCONT of a sidecar or a
  member process; the kernel still completes TCP handshakes on a frozen sidecar's listener,
  but nothing answers.
* :meth:`Pod.slow_link` / :meth:`Pod.fast_link` (:meth:`Pod.slowed`): ``netem`` delay (and
  loss) on everything the pod sends; needs the kernel's ``sch_netem``
  (:func:`netem_available`).

Needs root and iproute2 (CI runs as root); :func:`available` says whether this machine can.
Everything created carries the network's prefix and is removed by :meth:`PodNetwork.close`,
including after a crash of an earlier run with the same prefix.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

from proxy.process import ProxyProcess

SUBNET_BASE = "10.233"
NOWHERE = 254
"""The host part of the pod network's address that nothing answers (a partition's next hop);
pods take addresses from ``.2`` below it."""
NOWHERE_MAC = "02:00:00:00:00:fe"
"""The link-layer address of :data:`NOWHERE`: locally administered, on no interface."""


def available() -> tuple[bool, str]:
    """Whether pods can be made here, and why not."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which("ip") is None:
        return False, "iproute2 ('ip') is not installed"
    return True, ""


def netem_available() -> tuple[bool, str]:
    """Whether :meth:`Pod.slow_link` can work here (the kernel has ``sch_netem``), and why
    not: tried on the loopback of a namespace of its own."""
    ok, why = available()
    if not ok:
        return ok, why
    if shutil.which("tc") is None:
        return False, "iproute2's 'tc' is not installed"
    probe = f"ggnetem{os.getpid()}"
    _ip("netns", "add", probe)
    try:
        done = _run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root",
                     "netem", "delay", "1ms"], check=False)
    finally:
        _ip("netns", "del", probe, check=False)
    if done.returncode != 0:
        return False, f"the kernel has no netem qdisc ({done.stderr.strip()})"
    return True, ""


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip()}")
    return result


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


_CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    """setns(2) into a network namespace, for the calling thread only (``os.setns`` is 3.12)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


Frozen = int | subprocess.Popen[Any] | ProxyProcess
"""What :func:`pause` and :func:`resume` take: a pid, a child process or a sidecar."""


def _pid(target: Frozen) -> int:
    if isinstance(target, int):
        return target
    if isinstance(target, ProxyProcess):
        if target.process is None:
            raise ValueError("the sidecar was never started")
        return target.process.pid
    return target.pid


def pause(target: Frozen) -> None:
    """SIGSTOP: the process stops running (its sockets stay open; the kernel still accepts
    connections to its listeners and buffers what arrives, but nothing answers)."""
    os.kill(_pid(target), signal.SIGSTOP)


def resume(target: Frozen) -> None:
    """SIGCONT: a paused process runs on, its timers suddenly late."""
    os.kill(_pid(target), signal.SIGCONT)


@contextlib.contextmanager
def frozen(*targets: Frozen) -> Iterator[None]:
    """Every target paused for the duration of the block (a sidecar whose node stalls, a
    member in a long GC pause), resumed on the way out even when the block raises."""
    paused: list[Frozen] = []
    try:
        for target in targets:
            pause(target)
            paused.append(target)
        yield
    finally:
        for target in paused:
            with contextlib.suppress(ProcessLookupError):
                resume(target)


class Pod:
    """One network namespace: its own loopback and an address on the pod network."""

    def __init__(self, network: PodNetwork, name: str, index: int) -> None:
        self.network = network
        self.name = name
        self.netns = f"{network.prefix}-{name}"
        self.ip = f"{network.subnet}.{index}"
        self._host_veth = f"{network.prefix}v{index}"
        peer = f"{network.prefix}p{index}"
        _ip("netns", "add", self.netns)
        _ip("link", "add", self._host_veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", self._host_veth, "master", network.bridge)
        _ip("link", "set", self._host_veth, "up")
        _ip("link", "set", peer, "netns", self.netns)
        inside = ("netns", "exec", self.netns, "ip")
        _ip(*inside, "link", "set", peer, "name", "eth0")
        _ip(*inside, "addr", "add", f"{self.ip}/24", "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "route", "add", "default", "via", network.host_ip)

    def __repr__(self) -> str:
        return f"Pod({self.name!r}, {self.ip})"

    def _inside(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(self.command(args), check=check)

    def socket(self, kind: socket.SocketKind = socket.SOCK_STREAM) -> socket.socket:
        """An IPv4 socket in this pod's namespace (made on a thread that enters the namespace
        and ends with it), for probes from inside the pod without a process there."""
        made: list[socket.socket] = []
        failed: list[BaseException] = []

        def enter_and_make() -> None:
            try:
                with open(f"/run/netns/{self.netns}") as namespace:
                    _setns(namespace.fileno())
                made.append(socket.socket(socket.AF_INET, kind))
            except BaseException as exc:  # handed to the caller below
                failed.append(exc)

        thread = threading.Thread(target=enter_and_make, name=f"netns-{self.name}")
        thread.start()
        thread.join()
        if failed:
            raise failed[0]
        return made[0]

    def cut_off(self) -> None:
        """Partition this pod from the brokers (everything at the network's host address):
        its packets there and the brokers' packets to it go to :data:`NOWHERE`. Connects time
        out, established connections hear nothing more; the pod's loopback and the other pods
        stay reachable. :meth:`reconnect` undoes it."""
        network = self.network
        _ip("neigh", "replace", network.nowhere, "lladdr", NOWHERE_MAC, "dev", network.bridge,
            "nud", "permanent")  # stays until the bridge goes: harmless for an unused address
        self._inside("ip", "neigh", "replace", network.nowhere, "lladdr", NOWHERE_MAC,
                     "dev", "eth0", "nud", "permanent")
        self._inside("ip", "route", "replace", f"{network.host_ip}/32", "via", network.nowhere,
                     "dev", "eth0")
        _ip("route", "replace", f"{self.ip}/32", "via", network.nowhere, "dev", network.bridge)

    def reconnect(self) -> None:
        """Undo :meth:`cut_off` (nothing to do if the pod was not cut off)."""
        network = self.network
        _ip("route", "del", f"{self.ip}/32", "via", network.nowhere, "dev", network.bridge,
            check=False)
        self._inside("ip", "route", "del", f"{network.host_ip}/32", "via", network.nowhere,
                     "dev", "eth0", check=False)
        self._inside("ip", "neigh", "del", network.nowhere, "dev", "eth0", check=False)

    @contextlib.contextmanager
    def partitioned(self) -> Iterator[None]:
        """Cut off from the brokers for the duration of the block."""
        self.cut_off()
        try:
            yield
        finally:
            self.reconnect()

    def slow_link(self, delay_ms: float, loss_percent: float = 0.0) -> None:
        """Delay everything the pod sends by ``delay_ms`` (``netem`` on its ``eth0``), and drop
        ``loss_percent`` of it; a round trip to the brokers or another pod grows by the delay.
        Raises RuntimeError where the kernel has no netem (:func:`netem_available`)."""
        args = ["netem", "delay", f"{delay_ms}ms"]
        if loss_percent:
            args += ["loss", f"{loss_percent}%"]
        self._inside("tc", "qdisc", "replace", "dev", "eth0", "root", *args)

    def fast_link(self) -> None:
        """Undo :meth:`slow_link` (the pod's ``eth0`` gets its default qdisc back)."""
        self._inside("tc", "qdisc", "del", "dev", "eth0", "root", check=False)

    @contextlib.contextmanager
    def slowed(self, delay_ms: float, loss_percent: float = 0.0) -> Iterator[None]:
        """:meth:`slow_link` for the duration of the block."""
        self.slow_link(delay_ms, loss_percent)
        try:
            yield
        finally:
            self.fast_link()

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this pod."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        return subprocess.run(self.command(argv), **kwargs)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.command(argv), **kwargs)

    def delete(self) -> None:
        _ip("link", "del", self._host_veth, check=False)
        _ip("netns", "del", self.netns, check=False)


class PodNetwork:
    """A bridge and the pods on it; also a context manager that removes everything."""

    def __init__(self, index: int | None = None) -> None:
        ok, why = available()
        if not ok:
            raise RuntimeError(f"pods are not available here: {why}")
        self.index = index if index is not None else os.getpid() % 200 + 20
        self.prefix = f"gg{self.index}"
        self.subnet = f"{SUBNET_BASE}.{self.index}"
        self.host_ip = f"{self.subnet}.1"
        self.nowhere = f"{self.subnet}.{NOWHERE}"
        self.bridge = f"{self.prefix}br"
        self.pods: dict[str, Pod] = {}
        self.remove_leftovers()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def pod(self, name: str) -> Pod:
        """A new pod on this network (addresses from ``.2`` on)."""
        if name in self.pods:
            raise ValueError(f"pod {name!r} exists")
        if len(self.pods) + 2 >= NOWHERE:
            raise ValueError(f"at most {NOWHERE - 2} pods on one network")
        pod = Pod(self, name, len(self.pods) + 2)
        self.pods[name] = pod
        return pod

    def close(self) -> None:
        for pod in self.pods.values():
            pod.delete()
        self.pods.clear()
        _ip("link", "del", self.bridge, check=False)

    def remove_leftovers(self) -> None:
        """Namespaces, veths and the bridge of an earlier run with this prefix."""
        listing = _ip("netns", "list", check=False).stdout
        for line in listing.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(f"{self.prefix}-"):
                _ip("netns", "del", name, check=False)
        links = _ip("-o", "link", "show", check=False).stdout
        for line in links.splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                name = parts[1].strip().split("@")[0]
                if name.startswith(self.prefix):
                    _ip("link", "del", name, check=False)

    def __enter__(self) -> PodNetwork:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with contextlib.suppress(Exception):
            self.close()
