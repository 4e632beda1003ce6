"""Limits: named concurrency and rate bounds that steps take permits of (docs/limits.md).
`queue` orders the waiters, `local` grants one process's permits, `handle` is what the
engine's `limit()`, `limits()` and `limit_usage()` do and where definitions are kept."""

from fusee.engine.limits.handle import Limits

__all__ = ["Limits"]
