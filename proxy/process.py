"""Run ``groupgate run`` as a child process in front of a cluster.

``groupgate bench passthrough``, and the tests, ``dev/up`` and the benchmarks of the test bed,
use the proxy exactly as a user would: a separate process started with command-line settings.
:class:`ProxyProcess` starts it, waits for its ``ready`` log line, reads the bootstrap port and
broker listener ports from its log, and stops it with SIGTERM (then SIGKILL after a bound). The
log file stays for assertions and for a failing test's artefacts. On Linux, a proxy started from
the main thread is sent SIGTERM by the kernel when its parent dies (``PR_SET_PDEATHSIG``), so a
test run that is killed leaves no sidecar behind. (Not from other threads: the signal follows
the thread that forked, and a harness thread may end long before the proxy should.)
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

_READY = re.compile(r"ready: bootstrap (\S+):(\d+)")
_BROKER = re.compile(r"broker (\d+): listening on (\S+):(\d+)")


_PR_SET_PDEATHSIG = 1


def exit_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to send the child ``signum`` when this process's
    main thread ends, or None where that cannot be asked (not Linux, or not called from the
    main thread: the signal follows the thread that forked). The libc function is looked up
    here, before the fork, so the child only calls it."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not \
            threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request took effect
            os.kill(os.getpid(), signum)

    return preexec


class ProxyStartError(RuntimeError):
    pass


class ProxyProcess:
    def __init__(self, upstream: str, log_file: Path, *, listen: str = "127.0.0.1:0",
                 args: Sequence[str] = (), env: dict[str, str] | None = None,
                 wrapper: Sequence[str] = (), cwd: Path | None = None) -> None:
        """``wrapper``: a command prefix the proxy runs under (e.g. ``ip netns exec POD``);
        ``cwd``: the directory it runs in (``python -m`` imports ``proxy`` from there first:
        the test bed runs earlier releases that way)."""
        self.cwd = cwd
        self.upstream = upstream
        self.wrapper = list(wrapper)
        self.log_file = log_file
        self.listen = listen
        self.args = list(args)
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.host = ""
        self.port = 0

    @classmethod
    def start(cls, upstream: str, log_file: Path, *, timeout: float = 30.0,
              **kwargs: object) -> ProxyProcess:
        proxy = cls(upstream, log_file, **kwargs)  # type: ignore[arg-type]
        proxy.launch(timeout)
        return proxy

    def launch(self, timeout: float = 30.0) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        command = [*self.wrapper, sys.executable, "-m", "proxy.cli", "run",
                   "--upstream", self.upstream, "--listen", self.listen, *self.args]
        env = dict(os.environ, **(self.env or {}))
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            env=env, start_new_session=True, cwd=self.cwd,
                                            preexec_fn=exit_with_parent())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = _READY.search(self.log())
            if match:
                self.host, self.port = match.group(1), int(match.group(2))
                return
            if self.process.poll() is not None:
                raise ProxyStartError(f"groupgate exited with {self.process.returncode}:\n"
                                      + self.log()[-3000:])
            time.sleep(0.05)
        self.stop()
        raise ProxyStartError(f"groupgate not ready within {timeout}s:\n" + self.log()[-3000:])

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def log(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def broker_ports(self) -> dict[int, int]:
        """Node id -> proxy listener port, as the proxy logged them."""
        return {int(n): int(p) for n, _, p in _BROKER.findall(self.log())}

    def listener_ports(self) -> set[int]:
        return {self.port, *self.broker_ports().values()}

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive:
            assert self.process is not None
            self.process.send_signal(signum)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL. Returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> ProxyProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
