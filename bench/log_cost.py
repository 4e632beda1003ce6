"""Local mode's cost: what a flush of the shared log costs a step, how well shards share
flushes, and how long a directory holding many parked runs takes to open. Run on demand:
`python bench/log_cost.py [--dir PARENT]` (not a timed test; about a minute, most of it
starting the 2 x 100,000 parked runs; `--parked 10000` for a short run).

Works in a fresh directory under `--dir` (default: the current directory; never a tmpfs,
where a flush costs nothing), removed afterwards. Prints, against the goals in docs/server.md (*Figures*):
- the disk's flush latency (`disk_check`, one second);
- ms per sequential step of one workflow, split into one flush (the disk check's p50)
  and the rest, Python: the engine plus waking the log's writer thread and being woken
  by it (goal: one flush plus well under 100 us); and the cost of those two wake-ups alone
  (a write request that finds nothing to write);
- steps per second of one workflow per shard, all started at once, with the mean records
  per log batch (from `inspect`) and the ratio against the lone workflow (goal: 1.1 to
  1.2 times one shard's time on a slow disk; on a fast one the Python dominates);
- the open of a directory holding 10,000 and 100,000 runs asleep for an hour: after a
  clean close (checkpoint and run index, no run loaded) and after a crash once they
  parked (a shard whose runs all parked checkpoints as it goes idle, so the crash costs
  no replay).
  Reference: about 16 us per parked run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from fusee_server import _native

import fusee

START_CHUNK = 500  # starts in flight at once: their Started records share flushes


@fusee.workflow("chain")
async def chain(ctx: fusee.Ctx, steps: int) -> int:
    total = 0
    for i in range(steps):
        total += await ctx.step("s", lambda i=i: i)
    return total


@fusee.workflow("sleeper")
async def sleeper(ctx: fusee.Ctx) -> None:
    await ctx.sleep("nap", "1h")


def fs_type(path: Path) -> str:
    """The file system under `path`: that of the longest mount point holding it."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                point, point_kind = line.split()[1:3]
                holds = path == Path(point) or Path(point) in path.parents
                if holds and len(point) > len(best):
                    best, kind = point, point_kind
    except OSError:
        pass
    return kind


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def log_counts(root: Path) -> tuple[int, int]:
    """Batches and records in the directory's log chain."""
    report = json.loads(_native.inspect(str(root)))
    log = report["log"]
    assert log.get("error") is None, log
    return int(log["batches"]), sum(log["records_per_shard"])


async def abandon(engine: fusee.Engine) -> None:
    """Stop as a crash would, after the write in flight lands: nothing is retired or
    checkpointed, so the log still holds every batch the run wrote."""
    engine.abandon()
    await engine.storage.abandon()  # type: ignore[attr-defined]


async def lone_chain(root: Path, steps: int, shards: int) -> tuple[float, int]:
    """Seconds for one workflow of `steps` sequential steps, and the log batches written."""
    engine = await fusee.Engine.open(str(root), workflows=[chain], shards=shards)
    began = time.perf_counter()
    run = await engine.start(chain, "lone", steps)
    await run.result()
    elapsed = time.perf_counter() - began
    await abandon(engine)
    batches, _ = log_counts(root)
    return elapsed, batches


def one_per_shard(engine: fusee.Engine) -> list[str]:
    ids: dict[int, str] = {}
    i = 0
    while len(ids) < engine.shard_count:
        wid = f"chain-{i}"
        ids.setdefault(engine.shard_index(wid), wid)
        i += 1
    return [ids[s] for s in range(engine.shard_count)]


async def chains_at_once(root: Path, steps: int, shards: int) -> tuple[float, int, int]:
    """Seconds for one workflow per shard, all started at once; batches and records."""
    engine = await fusee.Engine.open(str(root), workflows=[chain], shards=shards)
    ids = one_per_shard(engine)
    began = time.perf_counter()
    runs = await asyncio.gather(*(engine.start(chain, wid, steps) for wid in ids))
    await asyncio.gather(*(run.result() for run in runs))
    elapsed = time.perf_counter() - began
    await abandon(engine)
    batches, records = log_counts(root)
    return elapsed, batches, records


async def park_runs(root: Path, runs: int, shards: int, clean: bool) -> float:
    """Start `runs` sleepers, wait until every one is parked, then close (`clean`) or
    abandon the engine. Returns the seconds this took."""
    began = time.perf_counter()
    engine = await fusee.Engine.open(str(root), workflows=[sleeper], shards=shards, park_after="50ms")
    for first in range(0, runs, START_CHUNK):
        chunk = range(first, min(runs, first + START_CHUNK))
        await asyncio.gather(*(engine.start(sleeper, f"sleeper-{i:07d}") for i in chunk))
    while sum(len(s.runs) for s in engine.shards) > 0:
        await asyncio.sleep(0.02)
    if clean:
        await engine.close()
    else:
        await abandon(engine)
    return time.perf_counter() - began


async def timed_open(root: Path, runs: int, shards: int) -> tuple[float, int, int]:
    """Seconds to open the directory; loaded runs and index entries right after."""
    began = time.perf_counter()
    engine = await fusee.Engine.open(str(root), workflows=[sleeper], shards=shards, park_after="50ms")
    elapsed = time.perf_counter() - began
    loaded = sum(len(s.runs) for s in engine.shards)
    indexed = sum(len(s.index_entries) for s in engine.shards)
    await engine.close()
    return elapsed, loaded, indexed


async def recovery(root: Path, runs: int, shards: int) -> tuple[float, float, int, float]:
    """Seconds to open `runs` parked runs after a clean close and after a crash, how many
    were loaded right after the crash's open, and the seconds the two setups took."""
    setup = await park_runs(root / "clean", runs, shards, clean=True)
    clean_s, loaded, indexed = await timed_open(root / "clean", runs, shards)
    assert loaded == 0, f"{loaded} runs loaded at a clean open"
    assert indexed == runs, f"{indexed} runs in the index, not {runs}"
    setup += await park_runs(root / "crash", runs, shards, clean=False)
    crash_s, loaded, indexed = await timed_open(root / "crash", runs, shards)
    assert loaded + indexed == runs, f"{loaded} loaded and {indexed} indexed, not {runs}"
    shutil.rmtree(root)
    return clean_s, crash_s, loaded, setup


async def wake_round_trip_us(root: Path, shards: int, io_uring: bool, trips: int = 2000) -> tuple[float, str]:
    """Median microseconds of a write request that finds nothing to write, and the path
    the log took: on io_uring the loop hands the ring nothing and is woken by its own
    completion (one wake-up); on the writer thread the loop wakes the thread, which
    signals the eventfd the loop reads (two). What every flush pays besides the disk."""
    fusee_dir = await fusee.Engine.open(str(root), shards=shards)  # a directory with its log
    await fusee_dir.close()
    log = _native.Log(str(root / "wal"), shards)
    fd = log.start_writer(io_uring)
    path = log.write_path or "none"
    loop = asyncio.get_running_loop()
    woken: asyncio.Event = asyncio.Event()

    def readable() -> None:
        try:
            os.read(fd, 8)
        except BlockingIOError:
            return
        woken.set()

    loop.add_reader(fd, readable)
    times = []
    try:
        for _ in range(trips):
            woken.clear()
            began = time.perf_counter_ns()
            log.request_write()
            await woken.wait()
            times.append(time.perf_counter_ns() - began)
    finally:
        loop.remove_reader(fd)
        log.stop_writer()
    return percentile(times, 0.5) / 1000, path


def per_run(seconds: float, runs: int) -> str:
    return f"{runs:,} parked runs in {seconds * 1000:.0f} ms ({seconds * 1e6 / runs:.1f} us per run)"


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="parent of the scratch directory")
    parser.add_argument("--steps", type=int, default=300, help="steps of the lone workflow")
    parser.add_argument("--shard-steps", type=int, default=200, help="steps of each workflow, one per shard")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="the step figures are the best of these")
    parser.add_argument("--parked", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args()
    parent = args.dir.resolve()
    kind = fs_type(parent)
    if kind == "tmpfs":
        parser.error(f"{parent} is on tmpfs, where a flush costs nothing; pass --dir on a disk")
    scratch = Path(tempfile.mkdtemp(prefix="fusee-log-cost-", dir=parent))
    try:
        await run_all(args, scratch, kind)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def run_all(args: argparse.Namespace, scratch: Path, kind: str) -> None:
    latencies, direct = _native.disk_check(str(scratch), 1.0)
    flush_us = percentile(latencies, 0.5) / 1000
    print(
        f"disk-check: flush p50 {flush_us:.0f} us, p90 {percentile(latencies, 0.9) / 1000:.0f} us "
        f"({'O_DIRECT' if direct else 'buffered'}, {kind} under {scratch.parent})"
    )

    lone = [await lone_chain(scratch / f"lone-{r}", args.steps, args.shards) for r in range(args.rounds)]
    lone_s, lone_batches = min(lone)
    step_ms = lone_s * 1000 / args.steps
    python_us = step_ms * 1000 - flush_us
    print(
        f"sequential step, local ({args.steps} steps, one workflow): {step_ms:.3f} ms/step "
        f"= one flush (p50 {flush_us / 1000:.3f} ms) + {python_us:.0f} us of Python "
        f"(best of {args.rounds}; {lone_batches} log batches; goal: one flush + well under 100 us)"
    )
    for io_uring in (True, False):
        trip_us, path = await wake_round_trip_us(scratch / f"wake-{io_uring}", args.shards, io_uring)
        print(
            f"  of the Python: the write's hand-off on the {path} path, a write request that finds "
            f"nothing to write: {trip_us:.0f} us (median of 2,000); the engine's own share is "
            "engine_cost.py's step"
        )

    many = [
        await chains_at_once(scratch / f"many-{r}", args.shard_steps, args.shards) for r in range(args.rounds)
    ]
    many_s, batches, records = min(many)
    total = args.shards * args.shard_steps
    ratio = many_s / (lone_s * args.shard_steps / args.steps)
    print(
        f"{args.shards} shards at once: {total / many_s:,.0f} steps/s, mean batch {records / batches:.1f} "
        f"records ({batches} flushes); {ratio:.2f} times one shard's time for {args.shard_steps} steps "
        f"(best of {args.rounds}; goal on a slow disk: 1.1 to 1.2)"
    )

    clean, crash = [], []
    setup = 0.0
    for runs in args.parked:
        clean_s, crash_s, loaded, setup_s = await recovery(scratch / f"parked-{runs}", runs, args.shards)
        clean.append(per_run(clean_s, runs))
        crash.append(f"{per_run(crash_s, runs)}, {loaded:,} loaded right after")
        setup += setup_s
    print(f"recovery: {'; '.join(clean)} (reference: 16 us per parked run)")
    print(
        f"recovery after a crash once they parked (their shards checkpointed on going idle): {'; '.join(crash)} "
        f"(setting up all of them took {setup:.0f} s)"
    )


if __name__ == "__main__":
    asyncio.run(main())
