"""Debounce and batch coordinators: built-in workflows on update-with-start and durable
timers (docs/coordinators.md). `flow` is the coordinators' workflow, `handle` what
`engine.debounce()` / `engine.batch()` (and a client's) send."""

from fusee.engine.coordinators.handle import Coordinators

__all__ = ["Coordinators"]
