"""The workflow code an engine has, by type name: what `register` adds (a type registered
twice with different code is refused, naming both places) and what a start or a call
names (an unknown one is refused with the nearest registered name)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from fusee._errors import RejectedError, UnknownWorkflowError
from fusee.workflow.definitions import Workflow


def added(known: dict[str, Workflow[Any]], workflows: Iterable[Workflow[Any]]) -> list[Workflow[Any]]:
    """`workflows` checked against `known` and each other, one per type name; refused
    whole (nothing added) if one is not a workflow or a type has two different codes."""
    adding: dict[str, Workflow[Any]] = {}
    for wf in workflows:
        if not isinstance(wf, Workflow):
            raise TypeError(f"register takes workflows made with @fusee.workflow, not {wf!r}")
        other = adding.get(wf.name) or known.get(wf.name)
        if other is not None and other.fn is not wf.fn:
            raise RejectedError(
                f"workflow type '{wf.name}' is registered twice: {_where(other.fn)} and {_where(wf.fn)}"
            )
        adding[wf.name] = wf
    return list(adding.values())


def registered(known: dict[str, Workflow[Any]], wf: Workflow[Any] | str) -> Workflow[Any]:
    """The registered workflow `wf` (or its type name) names."""
    if not isinstance(wf, (str, Workflow)):
        raise RejectedError(
            f"expected a workflow made with @fusee.workflow or its type name, got {type(wf).__name__}"
        )
    name = wf if isinstance(wf, str) else wf.name
    found = known.get(name)
    if found is None:
        names = sorted(known)
        import difflib  # only for this error's hint: kept off the import path

        near = difflib.get_close_matches(name, names, n=1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        raise UnknownWorkflowError(
            f"no code is registered for workflow type '{name}' (registered: {', '.join(names) or 'none'}){hint}",
            workflow_type=name,
        )
    return found


def _where(fn: Callable[..., Any]) -> str:
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))
