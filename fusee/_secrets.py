"""Every secret Fusee reads from a file goes through here: the worker, client and read
tokens (`--token-file`, `--client-token-file`, `--read-token-file`, `token-file=`), the
invocation secret (`--invoke-secret-file`, `FUSEE_INVOKE_SECRET_FILE`, `secret=`), and
the permission check of TLS private keys (`--tls-key`, `key=`, `--invoke-key`), which
`ssl` itself reads.

- **Length.** A token or a secret is at least 16 bytes once surrounding whitespace is
  stripped (a newline from `echo` is not part of it).
- **Permissions: warned about, not refused.** A file of this process's user that the
  group or other users can read gets one warning per file and process, naming the file
  and the `chmod` to run. It is not refused because the places these files are deployed
  to make them readable on purpose, on a machine with one user: a Kubernetes Secret
  volume mounts them 0644 by default, and a Lambda function's package is extracted
  readable by all. A file another user owns (root's, in both of those) is not warned
  about: its owner chose the mode, and this process could not change it (a chmod 600
  would lock it out). On a shared host the warning says what to fix.
- **Never printed.** A secret is a `Secret`: bytes to every function that takes bytes
  (hmac, ssl), whose `repr` and `str` name only where it came from and its length. A
  settings struct that holds one, a log line or a traceback that shows one, prints
  `<secret from /etc/fusee/token, 64 bytes>`.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from fusee._errors import RejectedError

SECRET_BYTES_MIN = 16
_OTHERS_READ = stat.S_IRGRP | stat.S_IROTH

logger = logging.getLogger("fusee.secrets")
_warned: set[str] = set()  # files warned about in this process (a worker reconnects often)


class Secret(bytes):
    """A secret's bytes, with a redacted `repr` and `str`: printing the struct, the list
    or the exception that holds one never shows it. Take the bytes with `bytes(secret)`
    only to hand them on."""

    source: str

    def __new__(cls, value: bytes, source: str) -> Secret:
        self = super().__new__(cls, value)
        self.source = source
        return self

    def __repr__(self) -> str:
        return f"<secret from {self.source}, {len(self)} bytes>"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)


class SecretError(RejectedError):
    """A secret that cannot be used: missing, unreadable or too short. The message names
    the setting and the file."""


def load(path: str | os.PathLike[str], setting: str) -> Secret:
    """The secret in the file `path`, named `setting` in messages (`--token-file`,
    `token-file=`, `FUSEE_INVOKE_SECRET_FILE`): stripped, at least 16 bytes, its file's
    permissions checked (a warning)."""
    file = Path(path)
    try:
        data = file.read_bytes().strip()
    except OSError as error:
        raise SecretError(f"{setting} {file}: {error.strerror or error}") from None
    check_private(file, setting)
    return _checked(data, f"{setting} {file}")


def given(value: bytes | str, setting: str) -> Secret:
    """A secret handed over as a value (`secret=` of the invocation handler, an
    environment variable): the same length rule as a file's."""
    if not isinstance(value, (bytes, str)):
        raise TypeError(f"{setting}: expected bytes or str, got {type(value).__name__}")
    data = value.encode() if isinstance(value, str) else bytes(value)
    return _checked(data.strip(), setting)


def check_private(path: str | os.PathLike[str], setting: str) -> None:
    """Warn, once per file, when the group or other users can read `path` (a token, a
    secret, a TLS private key) and this process's user owns it. A file that cannot be
    examined is left to its reader."""
    file = str(path)
    try:
        found = os.stat(file)
    except OSError:
        return
    mode = found.st_mode
    if mode & _OTHERS_READ and found.st_uid == os.geteuid() and file not in _warned:
        _warned.add(file)
        logger.warning(
            "%s %s can be read by other users (mode %03o): chmod 600 it",
            setting,
            file,
            stat.S_IMODE(mode),
        )


def _checked(data: bytes, where: str) -> Secret:
    if len(data) < SECRET_BYTES_MIN:
        raise SecretError(
            f"{where}: {len(data)} bytes, at least {SECRET_BYTES_MIN} (use 32 random bytes: "
            "openssl rand -hex 32)"
        )
    return Secret(data, where)
