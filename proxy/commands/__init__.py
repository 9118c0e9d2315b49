"""Subcommands of the ``groupgate`` console script, one module each.

Each module exposes ``configure(parser)`` to declare its arguments and ``run(args) -> int``.
``proxy.cli`` imports them lazily so that ``groupgate run`` does not pay for benchmark code.
"""
