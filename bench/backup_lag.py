"""Continuous backup (docs/backup.md): how far behind the log it runs under load, and how
fast a restore writes. Run on demand: `python bench/backup_lag.py [--seconds 10]
[--mib 256] [--target DIR-or-s3-URL] [--dir PARENT]` (not a timed test; about a minute).

- Upload lag: local mode, four shards, a steady stream of runs of one step each, the
  backup to `--target` (default: a directory beside the data). Every 20 ms the durable
  positions are sampled; afterwards each sample's lag is the time until the first restore
  point whose positions cover it. Printed as p50/p90/max, with the upload interval (1 s)
  it is bound by: a record waits for the next round, then for that round's uploads.
- Restore per GiB: a directory of about `--mib` MiB of journals (runs with large step
  results) backed up, then restored into a fresh directory; against the floor of a plain
  copy of the target's objects measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from fusee_server.backup import manifest as M
from fusee_server.backup.restore import restore
from fusee_server.backup.targets import target as target_of

import fusee


@fusee.workflow("one-step")
async def one_step(ctx: fusee.Ctx, size: int) -> int:
    blob = await ctx.step("make", lambda: "x" * size)
    return len(blob)


def spread(values: list[float]) -> str:
    values = sorted(values)
    return (
        f"p50 {statistics.median(values):.0f} ms, p90 {values[int(len(values) * 0.9)]:.0f} ms, "
        f"max {values[-1]:.0f} ms"
    )


async def lag(root: Path, url: str, seconds: float) -> None:
    samples: list[tuple[float, list[int]]] = []
    async with await fusee.Engine.open(str(root), workflows=[one_step], shards=4, backup=url) as engine:
        log = engine.storage.log  # type: ignore[attr-defined]
        stop = time.time() + seconds

        async def sampler() -> None:
            while time.time() < stop:
                samples.append((time.time() * 1000, [log.durable(i) for i in range(4)]))
                await asyncio.sleep(0.02)

        async def writer(k: int) -> int:
            n = 0
            while time.time() < stop:
                await (await engine.start(one_step, f"w{k}-{n}", 64)).result()
                n += 1
            return n

        done = await asyncio.gather(sampler(), *(writer(k) for k in range(8)))
        runs = sum(n for n in done if n)
    manifest = M.load(target_of(url))
    assert manifest is not None
    points = [p for t in manifest.timelines for p in t.points]
    lags = []
    for at, positions in samples:
        covering = [
            p.at_ms for p in points if all(q >= r for q, r in zip(p.positions, positions, strict=True))
        ]
        if covering:
            lags.append(max(0.0, min(covering) - at))
    print(
        f"upload lag under load ({runs / seconds:.0f} runs/s of one step, 4 shards, {len(samples)} samples): "
        f"{spread(lags)}; upload interval 1000 ms"
    )


async def restore_rate(parent: Path, mib: int) -> None:
    root, dest = parent / "big", parent / "backup-big"
    size = 256 << 10
    runs = max(1, (mib << 20) // size)
    async with await fusee.Engine.open(str(root), workflows=[one_step], shards=4, backup=str(dest)) as engine:

        async def one(i: int) -> None:
            await (await engine.start(one_step, f"big-{i}", size)).result()

        for first in range(0, runs, 32):
            await asyncio.gather(*(one(i) for i in range(first, min(runs, first + 32))))
    stored = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    began = time.perf_counter()
    shutil.copytree(dest, parent / "copy")
    floor = time.perf_counter() - began
    began = time.perf_counter()
    await asyncio.to_thread(restore, target_of(str(dest)), parent / "restored")
    took = time.perf_counter() - began
    gib = stored / (1 << 30)
    print(
        f"restore: {stored / 1e6:.0f} MB of backup in {took:.2f} s = {took / gib:.1f} s per GiB; floor (a plain "
        f"copy of the objects) {floor / gib:.1f} s per GiB: {took / floor:.1f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--target", default=None)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fusee-backup-bench-", dir=args.dir) as scratch:
        parent = Path(scratch)
        url = args.target or str(parent / "backup")
        asyncio.run(lag(parent / "data", url, args.seconds))
        asyncio.run(restore_rate(parent, args.mib))
        print(f"(scratch in {parent}, on {os.statvfs(parent).f_bsize}-byte blocks)")


if __name__ == "__main__":
    main()
