"""Completion tokens: what a step that completes outside its run (a webhook, another
process) is handed, and how the engine reads one back (docs/engine.md, *Completion
tokens*)."""

from __future__ import annotations

import base64
from _blake2 import blake2b  # hashlib's own BLAKE2, without loading OpenSSL's (cold path)

import msgspec

from fusee import _names as names
from fusee._errors import RejectedError


def make_token(wid: str, run: int, seq: int, attempt: int, seed: int) -> str:
    """A completion token names the run, the step and the attempt; its MAC, keyed by
    the run's recorded seed (63 bits from `os.urandom`), makes it hard to forge and lets a
    stale one be refused. docs/engine.md, *Completion tokens*, says what that rests on."""
    body = msgspec.json.encode([wid, run, seq, attempt])
    mac = blake2b(body, key=seed.to_bytes(8, "big"), digest_size=12).digest()
    return base64.urlsafe_b64encode(body).decode().rstrip("=") + "." + base64.urlsafe_b64encode(mac).decode()


def parse_token(token: str) -> tuple[str, int, int, int, str]:
    try:
        if type(token) is not str:
            raise TypeError
        body, mac = token.split(".", 1)
        wid, run, seq, attempt = msgspec.json.decode(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        if not (type(wid) is str and type(run) is int and type(seq) is int and type(attempt) is int):
            raise TypeError
        return names.name(wid, "workflow ID"), run, seq, attempt, mac
    except (ValueError, TypeError, msgspec.DecodeError, RejectedError):
        raise RejectedError("not a completion token") from None
