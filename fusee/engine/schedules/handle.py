"""What the application holds: `engine.schedule(name, spec, wf, input)` creates or updates
a schedule and returns its handle; `engine.schedules.get(name)` / `.list()`. The same
class serves an engine and a client: it only starts, signals, updates, queries and
terminates the schedule's run, which both can."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from fusee import _codec as codec
from fusee import _names as names
from fusee._errors import NotFoundError
from fusee.engine.schedules.flow import (
    CONTROL,
    DESCRIBE,
    PREFIX,
    SET_SIGNAL,
    TYPE,
    Starter,
    make_workflow,
    new_state,
    schedule_id,
)
from fusee.engine.schedules.times import check_spec
from fusee.journal import FINAL
from fusee.workflow.definitions import Workflow
from fusee.workflow.durations import Duration, at_ms


class ScheduleSpec(msgspec.Struct, kw_only=True):
    """A schedule's spec: `cron` (five fields or an alias such as `@daily`) or `every`,
    and the options (docs/schedules.md)."""

    cron: str | None = None
    every: Duration | None = None
    timezone: str = "UTC"
    overlap: str = "skip"
    catchup_window: Duration | None = None
    jitter: Duration | None = None
    paused: bool = False


class ScheduleHandle:
    """One schedule, by name; makes no call until a method is awaited."""

    def __init__(self, target: Any, name: str) -> None:
        self._target = target
        self.name = name
        self.id = schedule_id(name)

    def __repr__(self) -> str:
        return f"<fusee.ScheduleHandle {self.name!r}>"

    async def _running(self) -> Any:
        run = self._target.run(self.id)
        try:
            summary = await run.status()
        except NotFoundError:
            summary = None
        if summary is None or summary.status in FINAL:
            raise NotFoundError(f"no schedule '{self.name}' (it was never made, or it was deleted)")
        return run

    async def _control(self, op: str, **arg: Any) -> Any:
        return await (await self._running()).update(CONTROL, {"op": op, **arg})

    async def pause(self) -> None:
        """Times that come while paused are skipped (not caught up after resume)."""
        await self._control("pause")

    async def resume(self) -> None:
        await self._control("resume")

    async def trigger(self) -> Any:
        """Start a run now (`name@<now>`), whatever the overlap policy; its handle."""
        answer = await self._control("trigger")
        return self._target.run(answer["id"])

    async def backfill(self, start: datetime | int, end: datetime | int) -> dict[str, int]:
        """Start the runs of every time in [start, end); a time whose run exists is
        attached to, not run again. Counts of times, started and attached."""
        answer: dict[str, int] = await self._control(
            "backfill", start=at_ms(start, "backfill start"), end=at_ms(end, "backfill end")
        )
        return answer

    async def describe(self) -> dict[str, Any]:
        answer: dict[str, Any] = await (await self._running()).query(DESCRIBE)
        return answer

    async def delete(self) -> None:
        """End the schedule; runs it started keep running."""
        await (await self._running()).terminate("schedule deleted")


class Schedules:
    """`engine.schedules` (and a client's): `get(name)`, `list()`, and what `schedule()`
    calls. An engine's also holds what its schedule runs start with (`workflow()`)."""

    def __init__(self, target: Any) -> None:
        self._target = target
        self._starter: Starter | None = None

    def workflow(self) -> Workflow[Any]:
        """The built-in schedule workflow, bound to this engine (it registers it)."""
        self._starter = Starter(self._target)
        return make_workflow(self._starter)

    async def close(self) -> None:
        """Close the client a worker's schedules reach other shards with, if made."""
        if self._starter is not None:
            await self._starter.close()

    def get(self, name: str) -> ScheduleHandle:
        return ScheduleHandle(self._target, names.name(name, "schedule name"))

    async def list(self) -> list[dict[str, Any]]:
        """Every schedule that exists, described."""
        out = []
        async for row in self._target.list(type=TYPE):
            if row.status in FINAL or not row.id.startswith(PREFIX):
                continue
            try:
                out.append(await ScheduleHandle(self._target, row.id[len(PREFIX) :]).describe())
            except NotFoundError:
                continue  # deleted meanwhile
        return sorted(out, key=lambda d: d["name"])

    async def create(
        self, name: str, spec: Any, wf: Workflow[Any] | str, input: Any = None
    ) -> ScheduleHandle:
        """Make the schedule, or give an existing one this spec, workflow and input."""
        names.name(name, "schedule name")
        checked = check_spec(spec)
        wf_name = names.name(wf if isinstance(wf, str) else getattr(wf, "name", None), "schedule workflow")
        workflow_of = getattr(self._target, "workflow_of", None)
        if workflow_of is not None:
            workflow_of(wf_name)  # an engine refuses a type it has no code for, now
        # Kept as JSON in the schedule's state: the start converts it to the input type.
        value = msgspec.json.decode(codec.encode(input, "the schedule's input"))
        new = {"spec": checked, "workflow": wf_name, "input": value}
        # One call that starts the schedule, or hands a running one its new spec: two
        # processes making the same schedule get one run.
        await self._target.signal_with_start(
            TYPE, schedule_id(name), new_state(name, checked, wf_name, value), SET_SIGNAL, new
        )
        return ScheduleHandle(self._target, name)
