"""`engine.list(where=...)` over many runs with search attributes (docs/engine.md, *Search
attributes*). Run on demand: `python bench/list_where.py` (not a timed test).

Starts `--runs` runs (default 100,000) on 4 shards, each setting `tenant` (one of 100),
`state` and `amount`; half finish, half sleep and park. Then times listings, p50 and p90
of `--rounds` each (goal: under 50 ms p50 over 100,000 parked and finished runs):
- a selective filter, `{"tenant": 7, "amount": {"gte": 500}}` (about 0.5 % of the runs);
- the same with `limit=100`;
- a broad one, `{"state": "paid"}` (half the runs), whole and with `limit=100`;
- the floor of the broad one: building that many rows (`RunSummary`) and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import fusee
from fusee.engine.run_handle import RunSummary
from fusee.journal import Status


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, i: int) -> int:
    ctx.set_attributes({"tenant": i % 100, "state": "paid" if i % 2 else "open", "amount": i % 1000})
    if i % 2 == 0:
        await ctx.sleep("hold", "1h")  # parks
    return i


async def timed(engine: fusee.Engine, rounds: int, **options: Any) -> tuple[float, float, int]:
    times, count = [], 0
    for _ in range(rounds):
        began = time.perf_counter()
        count = sum([1 async for _ in engine.list(**options)])
        times.append((time.perf_counter() - began) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9)], count


def rows_floor_ms(count: int) -> float:
    began = time.perf_counter()
    _ = [RunSummary(f"o-{i}", 1, "order", Status.OK, i % 4) for i in range(count)]
    return (time.perf_counter() - began) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    engine = await fusee.Engine.open(workflows=[order], shards=4, park_after="50ms")
    began = time.perf_counter()
    for start in range(0, args.runs, 1000):
        await asyncio.gather(
            *(engine.start(order, f"o-{i}", i) for i in range(start, min(args.runs, start + 1000)))
        )
    loaded = lambda: sum(len(shard.runs) for shard in engine.shards)  # noqa: E731
    while loaded() > 0:
        await asyncio.sleep(0.1)
    print(f"{args.runs:,} runs started, finished or parked in {time.perf_counter() - began:.1f} s; 0 loaded")
    selective = {"tenant": 7, "amount": {"gte": 500}}
    for label, options in (
        ("selective", {"where": selective}),
        ("selective, limit=100", {"where": selective, "limit": 100}),
        ("broad", {"where": {"state": "paid"}}),
        ("broad, limit=100", {"where": {"state": "paid"}, "limit": 100}),
    ):
        p50, p90, count = await timed(engine, args.rounds, **options)
        print(f"{label:>22}: {count:>6,} rows in {p50:.1f} ms p50, {p90:.1f} ms p90")
    print(
        f"{'floor':>22}: building {args.runs // 2:,} rows alone takes {rows_floor_ms(args.runs // 2):.1f} ms"
    )
    await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
