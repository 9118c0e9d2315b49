"""Pods for the sidecar topology: one Linux network namespace per pod, joined by a bridge.

In Kubernetes every pod has its own loopback, where the application reaches its sidecar at
``127.0.0.1:9092``, and a pod address on the cluster network. :class:`PodNetwork` reproduces
that on one machine: a bridge in the root namespace (address ``10.233.N.1``, where the test
bed's brokers listen) and, per :class:`Pod`, a network namespace with its own ``lo`` and an
``eth0`` (``10.233.N.k``) on the bridge through a veth pair. Processes run in a pod with
``ip netns exec``: a sidecar started there listens on the pod's own loopback, and clients
started there see only that loopback and the bridge.

Needs root and iproute2 (CI runs as root); :func:`available` says whether this machine can.
Everything created carries the network's prefix and is removed by :meth:`PodNetwork.close`,
including after a crash of an earlier run with the same prefix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from types import TracebackType
from typing import Any

SUBNET_BASE = "10.233"


def available() -> tuple[bool, str]:
    """Whether pods can be made here, and why not."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which("ip") is None:
        return False, "iproute2 ('ip') is not installed"
    return True, ""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


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
