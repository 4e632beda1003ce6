"""What every directory of tests/server/formats/flows.py runs must hold after a tool
rewrote it (`fusee upgrade`, `fusee reshard`): every run there, in its state, and able to
go on: parked runs still parked, waiting runs finishing once signalled, due timers firing."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fusee
from tests.server.formats.flows import WORKFLOWS


async def check_runs(
    root: Path, *, finished: range, shards: int | None = None, late: bool = True, napping: int = 3
) -> list[int]:
    """Every run of the directory, checked; returns the shard of each (by ID, sorted)."""
    async with await fusee.Engine.open(str(root), workflows=WORKFLOWS, shards=shards) as engine:
        placed = []
        for n in finished:
            run = engine.run(f"finished-{n}")
            assert await run.result() == n * 2 + 1
            placed.append((await run.status()).shard)
        assert await engine.run("parent-1").result() == 1003
        assert await engine.run("child-of-1").result() == 3
        for n in range(napping):
            # Its one-second timer was due long ago: it fires at this open.
            assert await asyncio.wait_for(engine.run(f"napping-{n}").result(), 10) == f"n={n} woke"
        sleepers = [f"sleeper-{n}" for n in range(3)] + (["sleeper-late"] if late else [])
        waiters = [(f"waiter-{n}", n) for n in range(3)] + ([("waiter-late", 9)] if late else [])
        for wid in sleepers:
            assert (await engine.run(wid).status()).status == "running", wid
        for wid, _ in waiters:
            assert (await engine.run(wid).status()).status == "running", wid
        for wid, _ in waiters:
            await engine.run(wid).signal("go", "now")
        for wid, n in waiters:
            assert await asyncio.wait_for(engine.run(wid).result(), 10) == f"{n}:now"
        return placed


@contextmanager
def power_cut_after(renames: int) -> Iterator[None]:
    """The process "loses power" at the rename after the first `renames` (an OSError
    raised instead, nothing renamed): a crash at that step of a tool's swap."""
    real = os.rename
    done = 0

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        nonlocal done
        if done == renames:
            raise OSError("the power went out")
        done += 1
        real(src, dst)

    os.rename = rename  # type: ignore[assignment]
    try:
        yield
    finally:
        os.rename = real
