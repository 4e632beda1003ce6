"""The logging shared by the handler of invocations and the server: the invocation trace
and the rate limit of refusal lines. A base module: it imports nothing of fusee's, so any
module of fusee or fusee_server may use it.

The trace (`FUSEE_INVOKE_TRACE`) is one line per invocation event, on standard error, as
it is (the application's log format does not wrap it, so scripts and tests can read its
`key=value` fields): docs/invoke.md, *In an application*, and docs/server.md, *Invoking
workers*, **Trace**. It is on unless the variable is unset, empty or `0`, the one rule
both sides read it with.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

TRACE_ENV = "FUSEE_INVOKE_TRACE"


def trace_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether FUSEE_INVOKE_TRACE asks for the trace: on unless unset, empty or `0`."""
    return (os.environ if environ is None else environ).get(TRACE_ENV, "").strip() not in ("", "0")


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is when a line is written (a test's capture, a
    redirection made after the logger was set up), not the one it was created with."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def trace_logger(name: str) -> logging.Logger:
    """The trace's logger: its records are the trace's lines as they are, on standard
    error, and go nowhere else (not propagated: the application's handlers would format
    them again). Whether to write them is the caller's (`trace_enabled`, or an explicit
    `trace=`), so this logger itself is always on."""
    logger = logging.getLogger(name)
    if not any(isinstance(handler, _Stderr) for handler in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        logger.setLevel(logging.INFO)
    return logger


class RateLimit(logging.Filter):
    """Lets one record through every `every_s` seconds and drops the others, so that a
    flood (a scanner's connections, bad requests) does not flood the log; the next record
    let through says how many were dropped meanwhile (`({n} more {dropped} since the last
    line)`)."""

    def __init__(self, every_s: float, dropped: str, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s = every_s
        self.dropped = dropped
        self.clock = clock
        self.last = -math.inf  # the first record passes
        self.quiet = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        if now - self.last < self.every_s:
            self.quiet += 1
            return False
        if self.quiet:
            record.msg = f"{record.msg} ({self.quiet} more {self.dropped} since the last line)"
        self.last, self.quiet = now, 0
        return True


class _Limited(logging.Logger):
    """A logger behind a `RateLimit`, writing through `parent` as if it were it."""

    def __init__(self, parent: logging.Logger, limit: RateLimit) -> None:
        super().__init__(parent.name)
        self.parent = parent
        self.addFilter(limit)

    def isEnabledFor(self, level: int) -> bool:
        # Asked of the parent each time: this logger is not registered, so a level set
        # later (logging.config, a test's caplog) would not clear a cache of its own.
        assert self.parent is not None
        return self.parent.isEnabledFor(level)


def rate_limited(logger: logging.Logger, limit: RateLimit) -> logging.Logger:
    """A logger of its own behind `limit`, writing as `logger` (same name, same level and
    handlers, through it). It is not registered with `logging`, so it goes with its owner:
    each owner has its own limit (an invocation handler's refusals are its own)."""
    return _Limited(logger, limit)
