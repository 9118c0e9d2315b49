"""The groupgate proxy: trio listeners, frame forwarding, address rewriting, the coordinator
service that drives the engine in ``translation/``, configuration, CLI and tooling.
"""
