"""Engine cost on memory storage: what the engine itself adds to a step, a start and a
parked run. Run on demand: `python bench/engine_cost.py` (not a timed test).

Prints three figures, against the goals of the engine issue:
- ms per sequential step (one workflow, 1,000 steps);
- starts per second for 10,000 runs of 4 steps over 4 shards (and the wall time), with
  Python's cyclic garbage collector on, then off;
- bytes per parked run: the engine's index (what stays in memory for a run that sleeps),
  and the same plus the memory backend's copy of its journal.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
import tracemalloc

import fusee


@fusee.workflow("chain")
async def chain(ctx: fusee.Ctx, steps: int) -> int:
    total = 0
    for i in range(steps):
        total += await ctx.step("add", lambda i=i: i)
    return total


@fusee.workflow("four")
async def four(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("a", lambda: n)
    b = await ctx.step("b", lambda: a + 1)
    c = await ctx.step("c", lambda: b + 1)
    return await ctx.step("d", lambda: c + 1)


@fusee.workflow("sleeper")
async def sleeper(ctx: fusee.Ctx) -> None:
    await ctx.sleep("nap", "1h")


async def sequential_step_ms(steps: int, rounds: int) -> float:
    best = float("inf")
    async with await fusee.Engine.open(workflows=[chain], shards=1) as engine:
        for r in range(rounds):
            began = time.perf_counter()
            run = await engine.start(chain, f"chain-{r}", steps)
            await run.result()
            best = min(best, (time.perf_counter() - began) * 1000 / steps)
    return best


async def many_runs(runs: int, shards: int, collector: bool = True) -> tuple[float, float]:
    """With `collector=False`, Python's cyclic garbage collector is off for the run: the
    difference is what the collector costs (it scans the live run states again and again)."""
    if not collector:
        gc.collect()
        gc.disable()
    try:
        return await _many_runs(runs, shards)
    finally:
        gc.enable()


async def _many_runs(runs: int, shards: int) -> tuple[float, float]:
    async with await fusee.Engine.open(workflows=[four], shards=shards) as engine:
        began = time.perf_counter()
        handles = [await engine.start(four, f"run-{i}", i) for i in range(runs)]
        started = time.perf_counter()
        for handle in handles:
            await handle.result()
        done = time.perf_counter()
    return runs / (started - began), done - began


def _storage_bytes(engine: fusee.Engine) -> int:
    """What the memory backend holds: its log and run-store bytes (the backend's own
    cost, not the engine's: its log, run store and checkpoint), as allocated: pymalloc
    rounds each block up to 16 bytes."""
    total = 0
    for store in engine.storage.stores:  # type: ignore[attr-defined]
        for chunk in (store.log, store.runs):
            total += sys.getsizeof(chunk) + sum(-(-sys.getsizeof(b) // 16) * 16 for b in chunk)
        if store.checkpoint_data is not None:
            total += sys.getsizeof(store.checkpoint_data)
    return total


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def parked_bytes(runs: int) -> tuple[float, float]:
    """Start `runs` runs that sleep an hour, let them park, and count what memory grew by
    (tracemalloc: Python allocations), less what the memory backend holds."""
    clock = fusee.VirtualClock()
    engine = await fusee.Engine.open(workflows=[sleeper], shards=4, park_after="50ms", clock=clock)
    ids = [f"sleeper-{i:07d}" for i in range(runs)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    storage_before = _storage_bytes(engine)
    for wid in ids:
        await engine.start(sleeper, wid)
    await _settle()
    clock.set(clock.now_ms() + 100)  # past park_after: every run parks
    await _settle()
    assert sum(len(s.runs) for s in engine.shards) == 0, "runs did not park"
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    storage = _storage_bytes(engine) - storage_before
    await engine.close()
    return (grown - storage) / runs, grown / runs


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--parked", type=int, default=10_000)
    args = parser.parse_args()
    step_ms = await sequential_step_ms(args.steps, rounds=5)
    print(
        f"sequential step, memory ({args.steps} steps, best of 5): {step_ms:.4f} ms/step "
        f"({step_ms * 1000:.1f} us; goal < 30 us)"
    )
    rate, wall = await many_runs(args.runs, shards=4)
    print(
        f"{args.runs} runs of 4 steps over 4 shards: {rate:,.0f} starts/s, all done in {wall:.2f} s (goal < 2 s)"
    )
    rate, wall = await many_runs(args.runs, shards=4, collector=False)
    print(f"  the same with the cyclic garbage collector off: {rate:,.0f} starts/s, all done in {wall:.2f} s")
    index, total = await parked_bytes(args.parked)
    print(
        f"parked run ({args.parked} runs): {index:.0f} bytes in the engine's index (goal < 150), "
        f"{total:.0f} bytes with the memory backend's copy of its journal"
    )


if __name__ == "__main__":
    asyncio.run(main())
