"""`crash_everywhere`: find the steps that are not idempotent.

A step's function runs again when the process dies after the function ran and before its
result was durable. This runs a workflow once without a crash, then once per step it
recorded with exactly that crash (the process dies the instant the step's result is
recorded, before anything after it reaches storage), and requires the same result and the
same outside effects every time. A step that charges a card twice is named, with both
sets of effects.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fusee import journal as R
from fusee._errors import FuseeError
from fusee.storage import MemoryShardStore, MemoryStorage
from fusee.workflow.definitions import Workflow

if TYPE_CHECKING:
    from fusee.testing import TestEngine


@dataclass
class Case:
    """One workflow run to check, built afresh (with fresh fakes) for every attempt."""

    workflows: Sequence[Workflow[Any]]
    workflow: Workflow[Any] | str
    id: str
    input: Any = None
    effects: Callable[[], Any] = field(default=lambda: None)
    """What the run did outside (a fake's calls, say), compared between runs."""


class _Store(MemoryShardStore):
    """A memory shard whose records become durable a turn after they are made (so a step's
    function waits for the records before it, as on a disk), that reports each recorded
    step result to `watch`, and that stops making anything durable once the crash point
    is reached: the process is dead from that instant, so nothing it did afterwards may be
    acknowledged or released (a step after it must not run on a record the crash loses)."""

    watch: Callable[[_Store, bytes], None] | None = None
    frozen: bool = False

    def append(self, entry: bytes) -> int:
        position = MemoryShardStore.append(self, entry)
        if self.watch is not None:
            self.watch(self, entry)
        return position

    async def flush(self) -> int:
        if self.frozen:
            await asyncio.sleep(0)
            return self.durable
        return await MemoryShardStore.flush(self)

    async def checkpoint(self, position: int, data: bytes) -> None:
        if not self.frozen:
            await MemoryShardStore.checkpoint(self, position, data)


class _Watch:
    """Counts recorded step results across every shard; at the `crash_at`-th, notes where
    each shard's log stands (the crash's cut) and sets `reached`."""

    def __init__(self, storage: MemoryStorage, crash_at: int | None) -> None:
        self.stores: list[_Store] = [s for s in storage.stores if isinstance(s, _Store)]
        self.crash_at = crash_at
        self.steps: list[str] = []
        self.reached = asyncio.Event()
        for store in self.stores:
            store.watch = self.saw

    def saw(self, store: _Store, entry: bytes) -> None:
        rec = R.decode_entry(entry).rec
        if not isinstance(rec, R.StepDone) or self.reached.is_set():
            return
        if len(self.steps) == self.crash_at:
            # The instant this result is recorded (not yet durable): the process dies, and
            # what was not durable then is lost, this result with it.
            for s in self.stores:
                s.frozen = True
            self.reached.set()
        self.steps.append(rec.name)

    def thaw(self) -> None:
        for store in self.stores:
            store.frozen = False


async def crash_everywhere(build: Callable[[], Case | Awaitable[Case]], *, shards: int = 4) -> list[str]:
    """Run the case once, then once per recorded step with a crash right after that step's
    function ran; raise AssertionError naming the first step whose rerun changed the
    result or the effects. Returns the steps it crashed after, in order."""
    case, t, watch = await _open(build, shards, None)
    try:
        await t.start(case.workflow, case.id, case.input)
        expected = await _outcome(t, case.id)
        expected_effects = case.effects()
        steps = list(watch.steps)
    finally:
        await t.close()
    for k, step in enumerate(steps):
        case, t, watch = await _open(build, shards, k)
        try:
            await t.start(case.workflow, case.id, case.input)
            running = asyncio.ensure_future(_outcome(t, case.id))
            reached = asyncio.ensure_future(watch.reached.wait())
            await asyncio.wait({running, reached}, return_when=asyncio.FIRST_COMPLETED)
            reached.cancel()
            if not watch.reached.is_set():
                running.cancel()
                raise AssertionError(
                    f"step '{step}' (step {k + 1} of {len(steps)}) was not recorded again in a second "
                    "run: the workflow does not take the same steps every time it runs"
                )
            running.cancel()
            watch.thaw()
            await t.crash(settle=False)
            got = await _outcome(t, case.id)
            got_effects = case.effects()
        finally:
            await t.close()
        changed = []
        if got != expected:
            changed.append(f"the result: without a crash {expected!r}, with one {got!r}")
        if got_effects != expected_effects:
            changed.append(f"the effects: without a crash {expected_effects!r}, with one {got_effects!r}")
        if changed:
            raise AssertionError(
                f"step '{step}' (step {k + 1} of {len(steps)}), run again after a crash, changed "
                + "; and ".join(changed)
                + ". Make the step idempotent: pass ctx.key() (or the step context's s.key) to the "
                "service it calls as an idempotency key"
            )
    return steps


async def _open(
    build: Callable[[], Case | Awaitable[Case]], shards: int, crash_at: int | None
) -> tuple[Case, TestEngine, _Watch]:
    from fusee.testing import TestEngine

    built = build()
    case = await built if inspect.isawaitable(built) else built
    assert isinstance(case, Case), f"build() must return a fusee.testing.Case, not {type(case).__name__}"
    storage = MemoryStorage(shards)
    storage.stores = [_Store(instant=False) for _ in range(shards)]
    t = await TestEngine.open(case.workflows, shards=shards, storage=storage)
    return case, t, _Watch(storage, crash_at)


async def _outcome(t: TestEngine, wid: str) -> tuple[str, Any]:
    try:
        return ("ok", await t.result(wid))
    except FuseeError as error:
        return (error.code, str(error))
