"""Checks on the strings an application hands the engine: workflow IDs, update IDs, and the
names of workflow types, steps, timers, signals, queries and updates.

Each is recorded in the journal, keyed on and compared on replay, so it must be a real
`str` (an int or None would encode, then decode differently from disk than from memory)
that UTF-8 can hold (a lone surrogate would fail inside the log's encoder, after the call
was accepted). Refused here, where it enters, before anything is recorded.
"""

from __future__ import annotations

from typing import Any

from fusee._errors import RejectedError

NAME_BYTES_MAX = 1024
TEXT_BYTES_MAX = 64 * 1024


def name(value: Any, what: str) -> str:
    """A non-empty name or ID of at most 1 KiB of UTF-8."""
    if type(value) is not str:
        raise RejectedError(f"{what}: expected a str, got {type(value).__name__} {_short(value)}")
    if value.isascii():
        if 0 < len(value) <= NAME_BYTES_MAX:
            return value
    else:
        size = len(_utf8(value, what))
        if 0 < size <= NAME_BYTES_MAX:
            return value
    if not value:
        raise RejectedError(f"{what}: must not be empty")
    raise RejectedError(f"{what}: {_short(value)} is longer than {NAME_BYTES_MAX} bytes")


def text(value: Any, what: str) -> str | None:
    """Free text (a cancel or terminate reason): None, or at most 64 KiB of UTF-8."""
    if value is None:
        return None
    if type(value) is not str:
        raise RejectedError(f"{what}: expected a str, got {type(value).__name__}")
    if len(_utf8(value, what)) > TEXT_BYTES_MAX:
        raise RejectedError(f"{what}: longer than {TEXT_BYTES_MAX} bytes")
    return value


def _utf8(value: str, what: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RejectedError(
            f"{what}: {_short(value)} is not valid Unicode text ({error.reason} at index {error.start})"
        ) from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
