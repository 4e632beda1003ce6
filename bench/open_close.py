"""Opening one shard of parked runs and closing it again with nothing changed: what an
engine that comes up for one request and goes away again pays each time. Run on demand:
`python bench/open_close.py [--runs 2500] [--rounds 7] [--dir PARENT]` (not a timed test;
a few seconds).

Local mode, in a fresh directory under `--dir` (default: the system's temporary
directory; a tmpfs would hide the flushes), removed afterwards. One shard; `--runs` runs
that sleep 7 days are started, left to park, and the engine closed. Then `--rounds`
times: open the directory, close it, nothing else. Prints, in ms, the best and median of
the open and of the close (and per parked run, in us), and how many checkpoint files a
close with nothing changed wrote (by name, mtime and size in `shard-000/`, see
docs/FORMAT.md). Then the same on memory storage (one storage object reopened), and the
first open after a crash: a child process parks the runs and is SIGKILLed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fusee

PARK_AFTER = "50ms"  # short, so every run parks within a few sweeps
START_CHUNK = 500  # starts in flight at once: their Started records share flushes


@fusee.workflow("sleeper")
async def sleeper(ctx: fusee.Ctx) -> None:
    await ctx.sleep("nap", "7d")


async def parked(engine: fusee.Engine, clock: fusee.VirtualClock | None = None) -> None:
    """Until every run parked; a virtual clock is moved past park_after each time (its
    sweeps run on it). `engine.shards` is an internal (guarded): without it, sleep well
    past park_after and the sweeps that park."""
    shards = getattr(engine, "shards", None)
    while True:
        if clock is not None:
            clock.set(clock.now_ms() + 1000)
        if shards is None:
            await asyncio.sleep(1.0)
            return
        if sum(len(s.runs) for s in shards) == 0:
            return
        await asyncio.sleep(0.02)


async def populate(root: Path, runs: int) -> fusee.Engine:
    engine = await fusee.Engine.open(str(root), workflows=[sleeper], shards=1, park_after=PARK_AFTER)
    for first in range(0, runs, START_CHUNK):
        chunk = range(first, min(runs, first + START_CHUNK))
        await asyncio.gather(*(engine.start(sleeper, f"sleeper-{i:07d}") for i in chunk))
    await parked(engine)
    return engine


def checkpoints(root: Path) -> dict[str, tuple[int, int]]:
    """The shard's checkpoint files: name -> (mtime_ns, size)."""
    found = {}
    for path in (root / "shard-000").glob("checkpoint-*.fck"):
        st = path.stat()
        found[path.name] = (st.st_mtime_ns, st.st_size)
    return found


def ms(values: list[float]) -> str:
    return f"best {min(values) * 1000:.2f} ms, median {statistics.median(values) * 1000:.2f} ms"


def per_run(values: list[float], runs: int) -> str:
    return f"{statistics.median(values) * 1e6 / runs:.2f} us per run (median)"


async def cycles(
    open_engine: Any, rounds: int, root: Path | None
) -> tuple[list[float], list[float], list[list[str]]]:
    """Open and close `rounds` times: the open's and the close's seconds, and (with a
    directory) the checkpoint files each open+close wrote or rewrote."""
    opens, closes, written = [], [], []
    for _ in range(rounds):
        before = checkpoints(root) if root is not None else {}
        began = time.perf_counter()
        engine = await open_engine()
        opened = time.perf_counter()
        await engine.close()
        closed = time.perf_counter()
        opens.append(opened - began)
        closes.append(closed - opened)
        if root is not None:
            after = checkpoints(root)
            written.append(sorted(name for name, stamp in after.items() if before.get(name) != stamp))
    return opens, closes, written


async def local(parent: Path | None, runs: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="fusee-open-close-", dir=parent) as scratch:
        root = Path(scratch) / "data"
        began = time.perf_counter()
        await (await populate(root, runs)).close()
        print(
            f"setup: {runs:,} runs started, parked and closed in {time.perf_counter() - began:.1f} s ({root})"
        )
        print(f"  checkpoints after the setup's close: {sorted(checkpoints(root))}")

        async def reopen() -> fusee.Engine:
            return await fusee.Engine.open(str(root), workflows=[sleeper], shards=1, park_after=PARK_AFTER)

        opens, closes, written = await cycles(reopen, rounds, root)
        print(f"local open, {runs:,} parked runs, 1 shard: {ms(opens)}; {per_run(opens, runs)}")
        print(f"local close, nothing changed: {ms(closes)}; {per_run(closes, runs)}")
        counts = [len(names) for names in written]
        print(
            f"checkpoints written by a close with nothing changed: {statistics.median(counts):g} "
            f"(each round: {counts}; the first wrote {written[0]})"
        )
        print(f"  checkpoints after the last close: {sorted(checkpoints(root))}")
        engine = await reopen()  # untimed: every run is still there, and still asleep
        listed = [summary async for summary in engine.list(type="sleeper", status="running")]
        await engine.close()
        assert len(listed) == runs, f"{len(listed)} sleepers running, not {runs}"


async def memory(runs: int, rounds: int) -> None:
    # No public way to hand a storage to a new engine but `Engine.open(storage=...)`; the
    # memory one is reached through `engine.storage` (guarded). A virtual clock, so the
    # sleepers park at once and a reopen does not find them due.
    clock = fusee.VirtualClock()
    engine = await fusee.Engine.open(workflows=[sleeper], shards=1, park_after=PARK_AFTER, clock=clock)
    storage = getattr(engine, "storage", None)
    if storage is None:
        await engine.close()
        print("memory: skipped (no engine.storage to reopen)")
        return
    await asyncio.gather(*(engine.start(sleeper, f"sleeper-{i:07d}") for i in range(runs)))
    await parked(engine, clock)
    await engine.close()

    async def reopen() -> fusee.Engine:
        return await fusee.Engine.open(
            workflows=[sleeper], shards=1, park_after=PARK_AFTER, clock=clock, storage=storage
        )

    opens, closes, _ = await cycles(reopen, rounds, None)
    print(f"memory open, {runs:,} parked runs, 1 shard: {ms(opens)}; {per_run(opens, runs)}")
    print(f"memory close, nothing changed: {ms(closes)}; {per_run(closes, runs)}")


async def crashed_child(root: Path, runs: int) -> None:
    """In the child: park the runs, wait for the checkpoint an idle shard writes (so the
    crash is the steady state of a parked shard, not a race with it), then die as a kill
    would."""
    await populate(root, runs)
    deadline = time.monotonic() + 10
    while not checkpoints(root) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)  # the checkpoint's rename and directory flush
    os.kill(os.getpid(), signal.SIGKILL)


async def after_crash(parent: Path | None, runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="fusee-open-crash-", dir=parent) as scratch:
        root = Path(scratch) / "data"
        child = subprocess.run([sys.executable, __file__, "--crash-child", str(root), "--runs", str(runs)])
        if child.returncode != -signal.SIGKILL:
            print(f"after a crash: skipped (the child exited with {child.returncode}, not SIGKILL)")
            return
        at_crash = sorted(checkpoints(root))
        began = time.perf_counter()
        engine = await fusee.Engine.open(str(root), workflows=[sleeper], shards=1, park_after=PARK_AFTER)
        opened = time.perf_counter() - began
        await engine.close()
        print(
            f"first open after a SIGKILL once the runs parked: {opened * 1000:.2f} ms "
            f"({opened * 1e6 / runs:.2f} us per run; checkpoints at the crash: {at_crash})"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--runs", type=int, default=2500, help="parked runs in the shard")
    parser.add_argument("--rounds", type=int, default=7, help="open+close cycles timed")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the scratch directories")
    parser.add_argument("--crash-child", type=Path, help=argparse.SUPPRESS)  # internal
    args = parser.parse_args()
    if args.crash_child is not None:
        await crashed_child(args.crash_child, args.runs)
        return
    await local(args.dir, args.runs, args.rounds)
    await memory(args.runs, args.rounds)
    await after_crash(args.dir, args.runs)


if __name__ == "__main__":
    asyncio.run(main())
