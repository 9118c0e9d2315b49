"""The groupgate proxy: trio listeners, frame forwarding, address rewriting, the coordinator
service that drives the engine in ``translation/``, configuration, CLI and tooling.
"""

__version__ = "0.2.0"
"""The release (pyproject.toml's version); other sidecars read it from this one's fleet card."""
