"""Earlier releases of groupgate itself, for version-skew tests.

A release is the ``proxy/`` and ``translation/`` packages of the commit it was cut from,
exported from this repository's own history with ``git archive`` into the test bed's cache
(``~/.cache/groupgate/releases/<version>``) and run with :class:`~proxy.process.ProxyProcess`
from that directory (``python -m`` imports from the working directory first), with this
checkout's virtualenv: the dependencies of 0.2.0 are this version's. A clone without that
history (shallow) cannot export it: the tests that need it are skipped with that reason.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.testbed.artifacts import cache_root

ROOT = Path(__file__).resolve().parents[2]
RELEASES = {
    "0.2.0": "9a3c3dc7e08b33225086798d22fee358524b1522",
}
"""Version -> the commit it was cut from (the fleet protocol each speaks: 0.2.0 speaks 2)."""


class ReleaseUnavailable(RuntimeError):
    """The release's commit is not in this clone's history."""


def release_tree(version: str) -> Path:
    """A directory holding ``proxy/`` and ``translation/`` of ``version`` (cached)."""
    commit = RELEASES[version]
    target = cache_root() / "releases" / version
    if (target / "proxy" / "cli.py").exists():
        return target
    check = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                           capture_output=True, check=False)
    if check.returncode != 0:
        raise ReleaseUnavailable(f"groupgate {version} ({commit[:10]}) is not in this clone's "
                                 "history (a shallow clone?)")
    staging = Path(tempfile.mkdtemp(prefix=f"groupgate-{version}-", dir=target.parent.parent))
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit,
                                  "proxy", "translation"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(staging)], input=archive.stdout, check=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
