"""Logging setup: one line per event, timestamped, to stderr."""

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
