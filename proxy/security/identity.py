"""The proxy's own SASL identity: mechanism, user name and password.

Each value comes from a setting (flag, ``GROUPGATE_*`` environment variable or the TOML file)
or from a file (``sasl-username-file``, ``sasl-password-file``: a mounted Kubernetes Secret).
Files are read again for every new authentication, so a rotated Secret applies to the next
connection without a restart; surrounding whitespace (the newline ``kubectl create secret``
leaves) is stripped. The password is never logged and never part of an error message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""What the proxy's own connections can authenticate with."""


class CredentialsError(Exception):
    """The proxy's credentials cannot be read (a missing or empty file)."""


@dataclass(frozen=True)
class Identity:
    mechanism: str
    username: str = ""
    password: str = field(default="", repr=False)
    username_file: Path | None = None
    password_file: Path | None = None

    def credentials(self) -> tuple[str, str]:
        """(user name, password) as they are now (files read again)."""
        return (_value(self.username, self.username_file, "sasl-username"),
                _value(self.password, self.password_file, "sasl-password"))

    def username_now(self) -> str:
        return _value(self.username, self.username_file, "sasl-username")


def _value(direct: str, path: Path | None, setting: str) -> str:
    if path is None:
        if not direct:
            raise CredentialsError(f"{setting} is empty")
        return direct
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialsError(f"{setting}-file {path}: {exc.__class__.__name__}: "
                               f"{getattr(exc, 'strerror', None) or 'unreadable'}") from None
    if not text:
        raise CredentialsError(f"{setting}-file {path} is empty")
    return text
