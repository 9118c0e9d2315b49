"""Watch which TCP endpoints a client process is connected to, from the kernel's tables.

Used to check, independently of the proxy's own logs, that clients only ever talk to proxy
listeners: the remote ports of a process's established sockets come from ``/proc/PID/fd``
(socket inodes) joined with ``/proc/net/tcp`` and ``tcp6``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        entries = list(fd_dir.iterdir())
    except (FileNotFoundError, PermissionError):
        return inodes
    for fd in entries:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def remote_ports(pid: int) -> set[int]:
    """Remote ports of the established TCP connections of process ``pid``."""
    inodes = _socket_inodes(pid)
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "01" or fields[9] not in inodes:  # 01 = ESTABLISHED
                continue
            ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


class PortWatcher:
    """Samples a process's remote ports in the background until stopped."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen |= remote_ports(self.pid)
            self._stop.wait(self.interval)

    def __enter__(self) -> PortWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.seen |= remote_ports(self.pid)
