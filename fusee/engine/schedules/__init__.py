"""Schedules: a built-in workflow on durable timers (docs/schedules.md). `times` computes
the instants, `flow` is the schedule's workflow, `handle` what `engine.schedule()` and
`engine.schedules` give the application."""

from fusee.engine.schedules.handle import ScheduleHandle, Schedules, ScheduleSpec

__all__ = ["ScheduleHandle", "ScheduleSpec", "Schedules"]
