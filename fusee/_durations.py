"""Durations as the API takes them: milliseconds, "500ms", "10s", "5m", "2h", "1d", timedelta."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from fusee._errors import RejectedError

Duration = int | float | str | timedelta
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


def to_ms(duration: Duration, what: str = "duration") -> int:
    """Milliseconds for a duration; a negative or malformed one is refused."""
    if isinstance(duration, timedelta):
        ms = duration.total_seconds() * 1000
    elif isinstance(duration, bool):
        raise RejectedError(f"{what}: expected a duration, got {duration!r}")
    elif isinstance(duration, (int, float)):
        ms = duration
    elif isinstance(duration, str):
        match = _PATTERN.match(duration)
        if match is None:
            raise RejectedError(
                f"{what}: {duration!r} is not a duration (use ms, '500ms', '10s', '5m', '2h', '1d')"
            )
        ms = float(match.group(1)) * _UNIT_MS[match.group(2)]
    else:
        raise RejectedError(f"{what}: expected a duration, got {type(duration).__name__}")
    if ms < 0:
        raise RejectedError(f"{what}: {duration!r} is negative")
    return int(ms)


def at_ms(at: datetime | int | float) -> int:
    """Unix milliseconds for an absolute time (a datetime or unix ms)."""
    if isinstance(at, datetime):
        return int(at.timestamp() * 1000)
    return int(at)
