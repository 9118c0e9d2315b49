"""Logging setup: one line per event, timestamped, to stderr.

Lifecycle lines (listeners opened, ready, stopping) go to ``groupgate.lifecycle``, which logs at
INFO whatever ``log-level`` says: scripts and operators wait for them.
"""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("groupgate")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    logging.getLogger(LIFECYCLE).setLevel(logging.INFO)


LIFECYCLE = "groupgate.lifecycle"
