"""``groupgate run``: start the proxy with settings from flags, environment and file."""

from __future__ import annotations

import argparse
import logging
import sys

import trio

from proxy import config as config_module
from proxy.logs import setup_logging


def configure(parser: argparse.ArgumentParser) -> None:
    config_module.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        config = config_module.load(args)
    except config_module.ConfigError as exc:
        print(f"groupgate: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.log_level)
    logging.getLogger("groupgate").info("starting: %s", config_module.describe(config))
    from proxy.app import serve

    interrupted = False
    try:
        trio.run(serve, config)
    except* KeyboardInterrupt:  # a second SIGTERM/SIGINT: exit at once
        interrupted = True
    return 130 if interrupted else 0
