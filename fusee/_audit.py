"""Who asked: the requester a signal, a cancel, a termination, a reset or a resume records
in its journal record (`by`; docs/run-operations.md, *Audit*).

A context variable, so `with fusee.as_requester("job:nightly"):` names the requester of
every call made inside it, in the engine and through a client (which sends the name with
the call), and nested or concurrent tasks each keep their own. A call made outside any
names nobody and writes its record as before (`by` absent).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_requester: ContextVar[str | None] = ContextVar("fusee_requester", default=None)


@contextmanager
def as_requester(name: str | None) -> Iterator[None]:
    """Name the requester of the run operations called inside the block."""
    if name is not None:
        from fusee import _names as names

        names.text(name, "requester")
    token = _requester.set(name)
    try:
        yield
    finally:
        _requester.reset(token)


def requester() -> str | None:
    """The requester named by the innermost `as_requester` around this call, if any."""
    return _requester.get()
