""":class:`proxy.process.ProxyProcess` children end with the process that started them: a test
run killed with SIGKILL must not leave sidecars running (``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from proxy.process import exit_with_parent

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from proxy.process import exit_with_parent
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                             start_new_session=True, preexec_fn=exit_with_parent())
    print(child.pid, flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_ends_when_its_parent_is_sigkilled() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.kill()
    parent.wait()
    for _ in range(200):  # the kernel sends the signal at once; allow a loaded machine 10 s
        if not _alive(child):
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        pytest.fail("the child outlived its SIGKILLed parent")


def test_no_request_from_another_thread() -> None:
    import threading

    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(exit_with_parent()))
    thread.start()
    thread.join()
    assert found == [None]
    assert exit_with_parent() is not None
