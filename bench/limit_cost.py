"""What a limit adds to a step: sequential steps with `limit=` against the same steps
without, on a memory engine in one process (local mode's permit path), in alternating
rounds. Run on demand: `python bench/limit_cost.py [--steps 2000] [--rounds 7]`. Prints
the median µs per step of each, and the difference. Server mode's grant latency across
workers is not measured here (tests/server_mode/test_limits.py prints its figures)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fusee  # noqa: E402 (after the path above)


@fusee.workflow("plain")
async def plain(ctx: fusee.Ctx, n: int) -> int:
    for i in range(n):
        await ctx.step(f"s{i}", lambda: 1)
    return n


@fusee.workflow("limited")
async def limited(ctx: fusee.Ctx, n: int) -> int:
    for i in range(n):
        await ctx.step(f"s{i}", lambda: 1, limit="bench")
    return n


async def one(engine: fusee.Engine, wf: fusee.Workflow, wid: str, n: int) -> float:
    began = time.perf_counter()
    await (await engine.start(wf, wid, n)).result()
    return (time.perf_counter() - began) / n * 1e6


async def main(steps: int, rounds: int) -> None:
    engine = await fusee.Engine.open(workflows=[plain, limited])
    try:
        await engine.limit("bench", concurrent=1_000)
        await one(engine, plain, "warm-p", steps)
        await one(engine, limited, "warm-l", steps)
        without, with_ = [], []
        for r in range(rounds):
            pair = [(plain, without), (limited, with_)]
            for wf, out in pair if r % 2 == 0 else reversed(pair):
                out.append(await one(engine, wf, f"{wf.name}-{r}", steps))
        a, b = statistics.median(without), statistics.median(with_)
        print(f"{steps} sequential steps x {rounds} alternating rounds, memory engine")
        print(f"without a limit: {a:.1f} us/step (median)")
        print(f"with a limit:    {b:.1f} us/step (median), +{b - a:.1f} us")
    finally:
        await engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.rounds))
