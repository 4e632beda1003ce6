"""What `engine.debounce(...)` / `engine.batch(...)` (and a client's) call: an update with
start on the key's coordinator (flow.py). The same class serves an engine and a client:
it only sends update-with-start, which both can, so no remote call of its own exists."""

from __future__ import annotations

from typing import Any

import msgspec

from fusee import _codec as codec
from fusee import _names as names
from fusee._errors import RejectedError
from fusee.engine.coordinators import concurrency
from fusee.engine.coordinators.calls import Reaching, send
from fusee.engine.coordinators.concurrency import enqueue
from fusee.engine.coordinators.flow import (
    BATCH,
    DEBOUNCE,
    EVENT,
    MAX_EVENTS,
    coordinator_id,
    make_workflow,
    new_state,
)
from fusee.workflow.definitions import Workflow
from fusee.workflow.durations import Duration, to_ms


class Coordinators(Reaching):
    """`debounce` and `batch` for an engine or a client (`target`)."""

    def workflows(self) -> list[Workflow[Any]]:
        return [make_workflow(DEBOUNCE), make_workflow(BATCH), *concurrency.workflows()]

    async def debounce(
        self,
        wf: Workflow[Any] | str,
        key: str,
        input: Any = None,
        *,
        window: Duration,
        max_wait: Duration | None = None,
        dedup_window: Duration | None = None,
        event_id: str | None = None,
    ) -> Any:
        """Starts of `wf` with `key` inside the window collapse into one run with the
        latest input; the handle of that run, once this start is durable."""
        arg: dict[str, Any] = {"window_ms": _positive(window, "window")}
        if max_wait is not None:
            arg["max_wait_ms"] = _positive(max_wait, "max_wait")
        return await self._send(DEBOUNCE, wf, key, input, arg, dedup_window, event_id)

    async def batch(
        self,
        wf: Workflow[Any] | str,
        key: str,
        event: Any = None,
        *,
        max_events: int = 100,
        max_wait: Duration = "1s",
        dedup_window: Duration | None = None,
        event_id: str | None = None,
    ) -> Any:
        """Events of `wf` with `key` accumulate until `max_events` or `max_wait` after
        the first; one run then starts with the list. The handle of that run."""
        if type(max_events) is not int or not 0 < max_events <= MAX_EVENTS:
            raise RejectedError(f"max_events={max_events!r}: expected an int from 1 to {MAX_EVENTS}")
        arg = {"max_events": max_events, "max_wait_ms": _positive(max_wait, "max_wait")}
        return await self._send(BATCH, wf, key, event, arg, dedup_window, event_id)

    async def _send(
        self,
        kind: str,
        wf: Workflow[Any] | str,
        key: str,
        input: Any,
        arg: dict[str, Any],
        dedup_window: Duration | None,
        event_id: str | None,
    ) -> Any:
        wf_name = names.name(wf if isinstance(wf, str) else getattr(wf, "name", None), f"{kind} workflow")
        names.name(key, f"{kind} key")
        workflow_of = getattr(self._target, "workflow_of", None)
        if workflow_of is not None:
            # An engine refuses now a type it has no code for, and a debounced input that
            # does not fit it (a batch's input is the list its events make).
            definition = workflow_of(wf_name)
            if kind == DEBOUNCE:
                codec.convert(input, definition.input_type, f"the {kind} input")
        # Kept as JSON in the coordinator's state; the run's start converts it.
        arg["input"] = msgspec.json.decode(codec.encode(input, f"the {kind} input"))
        if dedup_window is not None:
            arg["dedup_window_ms"] = _positive(dedup_window, "dedup_window")
        if event_id is not None:
            arg["event_id"] = names.name(event_id, "event_id")
        receipt = await send(
            await self.via(),
            kind,
            coordinator_id(kind, wf_name, key),
            new_state(kind, wf_name, key),
            EVENT,
            arg,
        )
        return self._target.run(receipt["id"], wf if isinstance(wf, Workflow) else None)

    async def enqueue(self, definition: Workflow[Any], id: str, input: Any) -> Any:
        """A start of a type with `concurrency=`, from outside a workflow: queued."""
        names.name(id, "workflow ID")
        codec.convert(input, definition.input_type, "the workflow's input")
        value = msgspec.json.decode(codec.encode(input, "the workflow's input"))
        await enqueue(await self.via(), definition, id, input, value)
        return self._target.run(id, definition)


def _positive(value: Duration, what: str) -> int:
    ms = to_ms(value, what)
    if ms <= 0:
        raise RejectedError(f"{what}={value!r}: expected a positive duration")
    return ms
