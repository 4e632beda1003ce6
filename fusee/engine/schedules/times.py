"""A schedule's times: the spec, checked once, and the UTC instants it names.

Pure functions of the spec and a time, with no clock of their own: the schedule's workflow
calls them with recorded times only, so a replay computes the same instants.

Cron expressions are cronsim's (five fields; the `@daily`-style aliases are mapped here,
cronsim has none). Local times go through zoneinfo. Two daylight-saving rules, the ones
docs/schedules.md states: a wall time that does not exist that night (the spring gap) is
skipped, where cronsim would move it to the end of the gap; a wall time that happens
twice (the autumn overlap) runs at its first occurrence only, where cronsim yields both
for an expression that matches every hour.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fusee._errors import RejectedError
from fusee.workflow.durations import to_ms

OVERLAPS = ("skip", "buffer-one", "allow-all", "cancel-other")
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
YEAR_MS = 365 * 86_400_000
SPEC_KEYS = ("cron", "every", "timezone", "overlap", "catchup_window", "jitter", "paused")

# cronsim and zoneinfo are imported by the first schedule's spec or time, not by
# `import fusee`: every engine registers the schedule workflow, and an invoked
# function's cold start imports the engine.
if TYPE_CHECKING:
    from cronsim import CronSim


def check_spec(spec: Any) -> dict[str, Any]:
    """The spec as the schedule keeps it (JSON: durations in milliseconds), or a
    RejectedError naming what is wrong. `spec` is a cron string, or a mapping with
    `cron` or `every` and the options."""
    if isinstance(spec, str):
        spec = {"cron": spec}
    elif hasattr(spec, "__struct_fields__"):  # a ScheduleSpec
        spec = {k: getattr(spec, k) for k in spec.__struct_fields__}
    if not isinstance(spec, dict):
        raise RejectedError(f"schedule spec: expected a cron string or a mapping, got {type(spec).__name__}")
    unknown = set(spec) - set(SPEC_KEYS)
    if unknown:
        raise RejectedError(f"schedule spec: unknown keys {sorted(unknown)} (known: {', '.join(SPEC_KEYS)})")
    cron, every = spec.get("cron"), spec.get("every")
    if (cron is None) == (every is None):
        raise RejectedError("schedule spec: give exactly one of 'cron' and 'every'")
    out: dict[str, Any] = {"cron": None, "every_ms": None}
    if cron is not None:
        out["cron"] = _cron(cron)
    else:
        out["every_ms"] = to_ms(every, "schedule every")  # type: ignore[arg-type]
        if out["every_ms"] < 1:
            raise RejectedError("schedule every: must be at least 1 ms")
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    tz = spec.get("timezone") or "UTC"
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise RejectedError(f"schedule timezone {tz!r}: not a time zone zoneinfo knows") from None
    out["timezone"] = tz
    overlap = spec.get("overlap") or "skip"
    if overlap not in OVERLAPS:
        raise RejectedError(f"schedule overlap {overlap!r}: use one of {', '.join(OVERLAPS)}")
    out["overlap"] = overlap
    window = spec.get("catchup_window")
    out["catchup_window_ms"] = YEAR_MS if window is None else to_ms(window, "schedule catchup_window")
    jitter = spec.get("jitter")
    out["jitter_ms"] = 0 if jitter is None else to_ms(jitter, "schedule jitter")
    out["paused"] = bool(spec.get("paused", False))
    return out


def _cron(expr: Any) -> str:
    from cronsim import CronSim, CronSimError

    if not isinstance(expr, str):
        raise RejectedError(f"schedule cron: expected a string, got {type(expr).__name__}")
    text = ALIASES.get(expr.strip().lower(), expr.strip())
    if len(text.split()) != 5:
        raise RejectedError(
            f"schedule cron {expr!r}: expected five fields or an alias ({', '.join(ALIASES)})"
        )
    try:
        CronSim(text, datetime(2000, 1, 1))
    except CronSimError as error:
        raise RejectedError(f"schedule cron {expr!r}: {error}") from None
    return text


def next_after(spec: dict[str, Any], after_ms: int) -> int:
    """The first scheduled instant strictly after `after_ms` (UTC milliseconds)."""
    every: int | None = spec["every_ms"]
    if every is not None:
        # Anchored at the epoch: the same instants whenever the schedule was made or
        # reopened, so a time's run ID never depends on when it was computed.
        return (after_ms // every + 1) * every
    from zoneinfo import ZoneInfo

    from cronsim import CronSim

    tz = ZoneInfo(spec["timezone"])
    # cronsim steps from a whole second; start at the second holding `after_ms`.
    start = datetime.fromtimestamp(after_ms // 1000, tz=UTC).astimezone(tz)
    it = CronSim(spec["cron"], start)
    for _ in range(100_000):  # a cron matches at least once in a few years
        local = next(it)
        if not _real(it, local):
            continue
        at = int(local.astimezone(UTC).timestamp() * 1000)
        if at > after_ms:
            return at
    raise RejectedError(f"schedule cron {spec['cron']!r}: no time matches")


def _real(it: CronSim, local: datetime) -> bool:
    """The local time cronsim gave is one the expression names, at its first occurrence."""
    if local.hour not in it.hours or local.minute not in it.minutes:
        return False  # moved to the end of a spring gap: the named time did not exist
    if local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset():
        return False  # the second pass of an autumn hour: it ran at the first
    return True


def between(spec: dict[str, Any], after_ms: int, until_ms: int, limit: int = 100_000) -> list[int]:
    """The scheduled instants in (after_ms, until_ms], oldest first, at most `limit`."""
    out: list[int] = []
    at = after_ms
    while len(out) < limit:
        at = next_after(spec, at)
        if at > until_ms:
            break
        out.append(at)
    return out


def count_between(spec: dict[str, Any], after_ms: int, until_ms: int, limit: int = 10_000) -> int:
    """How many instants (after_ms, until_ms] holds: exact for `every`, counted up to
    `limit` for a cron (a year of a minutely cron would take seconds to walk)."""
    every: int | None = spec["every_ms"]
    if every is not None:
        return max(0, until_ms // every - after_ms // every)
    return len(between(spec, after_ms, until_ms, limit))


def run_id(name: str, at_ms: int) -> str:
    """`name@2026-11-09T02:00:00Z`: the run of one scheduled time (milliseconds shown
    only when the time has some, as a trigger's may)."""
    when = datetime.fromtimestamp(at_ms / 1000, tz=UTC)
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if at_ms % 1000:
        text += f".{at_ms % 1000:03d}"
    return f"{name}@{text}Z"


def iso(at_ms: int | None) -> str | None:
    if at_ms is None:
        return None
    return (datetime.fromtimestamp(at_ms / 1000, tz=UTC)).isoformat().replace("+00:00", "Z")
