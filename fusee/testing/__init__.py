"""The test kit: a memory engine on a virtual clock, with step mocks, crashes and strict
replay. The virtual clock is the process's: one test engine at a time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fusee import journal as R
from fusee._clock import VirtualClock
from fusee._errors import DeterminismError, NotFoundError
from fusee.engine.engine import Engine
from fusee.engine.replay import Replayer, journal_to_json
from fusee.engine.run_handle import Run
from fusee.storage import MemoryStorage, Storage
from fusee.testing.crash_everywhere import Case, crash_everywhere
from fusee.workflow.definitions import Workflow
from fusee.workflow.durations import Duration, to_ms

__all__ = ["Case", "TestEngine", "crash_everywhere"]


class TestEngine:
    """`TestEngine.open(workflows=[...])`: an engine under the dev profile on a virtual
    clock; memory storage, or a data directory (`dir=`, local mode) whose `crash()` is a
    real recovery from disk."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        workflows: Sequence[Workflow[Any]],
        shards: int,
        park_after: Duration,
        flush_on_turn: bool = False,
        dir: str | Path | None = None,
        storage: Storage | None = None,
    ) -> None:
        self.workflows = list(workflows)
        self.dir = dir
        self.shards = shards
        self.park_after = park_after
        self.clock = VirtualClock()
        self.on_exhausted = "fail"  # Engine.open(on_exhausted=), kept across reopens
        # flush_on_turn: records become durable a loop turn after they are made, and a
        # crash loses what was not flushed (see MemoryShardStore).
        self.storage: Any = storage or (
            MemoryStorage(shards, instant=not flush_on_turn) if dir is None else None
        )
        self.mocks: dict[tuple[str, str], Callable[[int], Any]] = {}
        self.telemetry: Any = None
        self.codec: Any = None
        self.engine: Engine

    @classmethod
    async def open(
        cls,
        workflows: Sequence[Workflow[Any]] = (),
        *,
        shards: int = 4,
        park_after: Duration = "1s",
        flush_on_turn: bool = False,
        dir: str | Path | None = None,
        storage: Storage | None = None,
        on_exhausted: str = "fail",
        telemetry: Any = None,
        codec: Any = None,
    ) -> TestEngine:
        t = cls(workflows, shards, park_after, flush_on_turn, dir, storage)
        t.on_exhausted = on_exhausted
        t.telemetry = telemetry  # fusee.open_telemetry(provider): kept across crash()
        t.codec = codec  # fusee.aes_gcm(keys): payloads sealed in storage, kept across crash()
        await t._open()
        return t

    async def _open(self) -> None:
        if self.dir is not None:
            from fusee_server.store import LocalStorage

            self.storage = await LocalStorage.open(self.dir, self.shards)
        self.engine = await Engine.open(
            workflows=self.workflows,
            shards=self.shards,
            park_after=self.park_after,
            profile="dev",
            clock=self.clock,
            storage=self.storage,
            on_exhausted=self.on_exhausted,
            telemetry=self.telemetry,
            codec=self.codec,
        )
        self.engine.step_mocks = self.mocks

    def mock_step(self, wf: Workflow[Any] | str, step: str, fn: Callable[[int], Any]) -> None:
        """Replace a step's function: `fn(attempt)` returns its result or raises."""
        self.mocks[(wf if isinstance(wf, str) else wf.name, step)] = fn

    async def start(self, wf: Workflow[Any] | str, id: str, input: Any = None, **options: Any) -> Run[Any]:
        return await self.engine.start(wf, id, input, **options)

    def now_ms(self) -> int:
        return self.clock.now_ms()

    async def settle(self, timeout_s: float = 5.0) -> None:
        """Let every turn that is ready run (messages between shards take several), and on
        a data directory wait for the flushes under way, until nothing moves but time and
        step functions waiting on outside work."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            # Done after a whole round of turns that began and ended with no flush under
            # way: what a flush released got its turns too.
            busy_before = self._storage_busy()
            for _ in range(64):
                await asyncio.sleep(0)
            busy = self._storage_busy()
            if (not busy_before and not busy) or loop.time() > deadline:
                return
            if busy:
                await asyncio.sleep(0.0005)

    def _storage_busy(self) -> bool:
        return any(
            shard.appended > shard.durable or shard.ready or shard.loading
            for shard in self.engine.shards
            if not shard.closed
        )

    async def advance(self, duration: Duration) -> None:
        """Move the clock; timers that fall due fire, in order."""
        target = self.clock.now_ms() + to_ms(duration)
        await self.settle()
        # Step from one due time to the next, letting the work each one starts finish
        # before time moves on (a parked run woken by its timer loads asynchronously).
        while True:
            due = self.clock.next_due_ms()
            if due is None or due > target:
                break
            self.clock.set(max(due, self.clock.now_ms()))
            await self.settle()
        self.clock.set(target)
        await self.settle()

    async def result(self, id: str, wait_real_s: float = 10.0) -> Any:
        """The run's result. While every run waits on a timer, time skips to the next one;
        while a step function awaits outside work, real time passes (up to `wait_real_s`)."""
        task: asyncio.Future[Any] = asyncio.ensure_future(self.engine.run(id).result())
        waited = 0.0
        idle_checks = 0
        try:
            while True:
                await self.settle()
                if task.done():
                    return task.result()
                if self._steps_running():
                    await asyncio.sleep(0.002)
                    waited += 0.002
                    if waited > wait_real_s:
                        raise TimeoutError(f"run '{id}': a step function still runs after {wait_real_s} s")
                    continue
                due = min((d for d in (s.next_due_ms() for s in self.engine.shards) if d), default=0)
                if not due:
                    # Nothing is due: what just resolved may still need a few turns (a
                    # waiter woken by a flush); give it those before giving up.
                    idle_checks += 1
                    if idle_checks <= 3:
                        await asyncio.sleep(0.001)
                        continue
                    raise TimeoutError(
                        f"run '{id}' waits on something no timer brings (a signal, an update, a completion)"
                    )
                idle_checks = 0
                self.clock.set(max(due, self.clock.now_ms()))
        finally:
            if not task.done():
                task.cancel()

    def _steps_running(self) -> bool:
        """Work under way in real time: a step function, a load, or a flush."""
        return any(run.in_flight() for shard in self.engine.shards for run in shard.runs.values()) or any(
            shard.ready or shard.loading or shard.appended > shard.durable for shard in self.engine.shards
        )

    async def journal(self, id: str) -> list[dict[str, Any]]:
        return journal_to_json((await self.engine.run(id).describe()).journal)

    async def steps(self, id: str) -> list[str]:
        """The names of the steps the run recorded as done, in order."""
        return [r.name for r in (await self.engine.run(id).describe()).journal if isinstance(r, R.StepDone)]

    async def snapshot(self, id: str) -> str:
        rows = await self.journal(id)
        for row in rows:
            for volatile in ("now", "seed", "due", "deadline", "retry_at", "stack"):
                row.pop(volatile, None)
        return json.dumps(rows, indent=1, sort_keys=True, default=str)

    async def crash(self, settle: bool = True, down: Duration = 0) -> None:
        """Drop the engine's memory and recover every run from storage: the code replays,
        recorded steps do not run again. `settle=False` crashes before any ready turn runs
        (records not yet flushed are lost, as a process kill would lose them). `down=`
        keeps the engine down that long (an outage): the clock moves with nothing open."""
        if settle:
            await self.settle()
        self.engine.abandon()
        abandon = getattr(self.storage, "abandon", None)
        if abandon is not None:
            await abandon()  # a directory: its writer stops, its lock is released
        if to_ms(down, "down"):
            # A new clock: the dropped engine's timers stay on the old one and never fire.
            self.clock = VirtualClock(self.clock.now_ms() + to_ms(down, "down"))
        await self._open()
        await self.settle()

    async def restart(self, workflows: Sequence[Workflow[Any]] | None = None, clean: bool = True) -> None:
        """Reopen on the same storage, with other workflow code if given (a deploy): after
        a clean close (flush, then checkpoint), or after a crash (`clean=False`)."""
        if workflows is not None:
            self.workflows = list(workflows)
        if not clean:
            await self.crash()
            return
        await self.close()
        await self._open()
        await self.settle()

    async def check(self) -> None:
        """Replay every run against the registered code; the error names each run and
        the first difference of each."""
        # The kit's code (a test may swap it) and the engine's built-in types (schedules).
        builtins = [wf for name, wf in self.engine.workflows.items() if name.startswith("fusee.")]
        replayer = Replayer([*self.workflows, *builtins])
        problems = []
        for shard in self.engine.shards:
            for wid in list(shard.runs) + [wid for wid, _ in await shard.indexed()]:
                try:
                    described = await self.engine.run(wid).describe()
                except NotFoundError:
                    continue
                try:
                    replayer.replay(described.journal, wid, described.summary.run)
                except DeterminismError as error:
                    problems.append(str(error))
        if problems:
            raise DeterminismError("; ".join(problems))

    async def close(self) -> None:
        await self.engine.close()

    async def __aenter__(self) -> TestEngine:
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.close()
