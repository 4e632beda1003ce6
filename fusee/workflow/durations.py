"""Durations and times as the API takes them, checked where they enter.

Durations are milliseconds, "500ms", "10s", "5m", "2h", "1d" or a timedelta; times are a
datetime or unix milliseconds. Every due time a journal records must fit the record's
integer (msgpack holds 64 bits), so a duration past 10,000 years, a time past the year
9999, NaN and infinity are refused here with the name of the value, before anything is
recorded, rather than overflowing while the record is encoded.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

from fusee._errors import RejectedError

Duration = int | float | str | timedelta
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
DURATION_MS_MAX = 10_000 * 31_557_600_000  # 10,000 Julian years
TIME_MS_MAX = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def to_ms(duration: Duration, what: str = "duration") -> int:
    """Milliseconds for a duration; a negative, malformed or unbounded one is refused."""
    if isinstance(duration, timedelta):
        ms: float = duration.total_seconds() * 1000
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
    if isinstance(ms, float) and not math.isfinite(ms):
        raise RejectedError(f"{what}: {duration!r} is not a finite duration")
    if ms < 0:
        raise RejectedError(f"{what}: {duration!r} is negative")
    if ms > DURATION_MS_MAX:
        raise RejectedError(f"{what}: {duration!r} is longer than 10,000 years")
    return int(ms)


def at_ms(at: datetime | int | float, what: str = "time") -> int:
    """Unix milliseconds for an absolute time (a datetime or unix ms)."""
    if isinstance(at, datetime):
        ms: float = at.timestamp() * 1000
    elif isinstance(at, (int, float)) and not isinstance(at, bool):
        ms = at
    else:
        raise RejectedError(f"{what}: expected a datetime or unix milliseconds, got {type(at).__name__}")
    if isinstance(ms, float) and not math.isfinite(ms):
        raise RejectedError(f"{what}: {at!r} is not a finite time")
    if not 0 <= ms <= TIME_MS_MAX:
        raise RejectedError(f"{what}: {at!r} is outside 1970-01-01 to 9999-12-31")
    return int(ms)
