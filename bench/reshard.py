"""`fusee reshard` (docs/operations.md, *Changing the shard count*): how long changing the
count of a directory of parked runs takes, and whether every run is intact. Run on
demand: `python bench/reshard.py [--runs 100000] [--dir PARENT]` (not a timed test; about
a minute at 100,000 runs).

Local mode, four shards, `--runs` runs that sleep ten years started and parked, the engine
closed. Then `fusee reshard` 4 -> 8 -> 3, each through the library call the command makes,
and after each every run listed again: the same IDs, run numbers, types and statuses, each
on the shard its ID routes to. Printed beside each time, measured in the same run, the
floor under it: an open and a clean close of the same directory (the tool's first stage)
plus a plain copy of its shard folders (what the copy stage writes at the least).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

from fusee_server.reshard import reshard

import fusee

START_CHUNK = 500


@fusee.workflow("sleeper")
async def sleeper(ctx: fusee.Ctx) -> None:
    await ctx.sleep("nap", "3650d")


async def populate(root: Path, runs: int) -> None:
    async with await fusee.Engine.open(str(root), workflows=[sleeper], shards=4, park_after="50ms") as engine:
        for first in range(0, runs, START_CHUNK):
            chunk = range(first, min(runs, first + START_CHUNK))
            await asyncio.gather(*(engine.start(sleeper, f"sleeper-{i:07d}") for i in chunk))
        while sum(len(s.runs) for s in engine.by_index.values()):
            await asyncio.sleep(0.05)


async def listing(root: Path) -> set[tuple[str, int, str, str]]:
    async with await fusee.Engine.open(str(root), workflows=[sleeper]) as engine:
        runs = set()
        async for run in engine.list():
            assert run.shard == zlib.crc32(run.id.encode()) % engine.shard_count, run
            runs.add((run.id, run.run, run.type, str(run.status)))
        return runs


async def open_close(root: Path) -> float:
    began = time.perf_counter()
    await (await fusee.Engine.open(str(root))).close()
    return time.perf_counter() - began


def copy_folders(root: Path, scratch: Path) -> float:
    began = time.perf_counter()
    for folder in sorted(root.glob("shard-*")):
        shutil.copytree(folder, scratch / folder.name)
    elapsed = time.perf_counter() - began
    shutil.rmtree(scratch)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fusee-reshard-", dir=args.dir) as parent:
        root = Path(parent) / "data"
        began = time.perf_counter()
        asyncio.run(populate(root, args.runs))
        before = asyncio.run(listing(root))
        assert len(before) == args.runs, len(before)
        print(f"setup: {args.runs:,} parked runs on 4 shards in {time.perf_counter() - began:.1f} s ({root})")
        for count in (8, 3):
            floor = asyncio.run(open_close(root)) + copy_folders(root, Path(parent) / "copy")
            report = reshard(root, count)
            after = asyncio.run(listing(root))
            intact = "every run intact" if after == before else f"MISMATCH: {len(before ^ after)} runs differ"
            print(
                f"reshard {report.before} -> {report.after}: {report.seconds:.2f} s for {report.runs:,} runs "
                f"({report.bytes / 1e6:.1f} MB of journals, {report.seconds / report.runs * 1e6:.1f} us per run); "
                f"floor {floor:.2f} s (open+close, and a copy of the shard folders): "
                f"{report.seconds / floor:.1f}x; {intact}"
            )
            if after != before:
                sys.exit(1)


if __name__ == "__main__":
    main()
