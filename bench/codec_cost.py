"""What payload encryption costs (`Engine.open(codec=fusee.aes_gcm(keys))`, docs/engine.md,
*Payload encryption*). Run on demand: `python bench/codec_cost.py` (not a timed test).

Prints, in the same run:
- the floor: one AES-256-GCM seal and one open of a payload of each size, in µs
  (`cryptography`, what the codec calls), and one durable flush of this disk;
- ms per sequential step on a data directory (one workflow, 1,000 steps, each result
  a payload of that size), plain and encrypted, and the difference per step;
- the same on memory storage, where nothing hides the codec behind a flush.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from _floors import flush_ms

import fusee

SIZES = (32, 1024, 16 * 1024)


@fusee.workflow("chain")
async def chain(ctx: fusee.Ctx, x: dict) -> int:
    blob = "x" * x["size"]
    for _ in range(x["steps"]):
        await ctx.step("add", lambda: blob)
    return x["steps"]


def seal_open_us(size: int, rounds: int = 20_000) -> tuple[float, float]:
    codec = fusee.aes_gcm({"k1": os.urandom(32)})
    data = b'"' + b"x" * size + b'"'
    began = time.perf_counter()
    for _ in range(rounds):
        sealed = codec.seal(data)
    sealing = (time.perf_counter() - began) / rounds * 1e6
    began = time.perf_counter()
    for _ in range(rounds):
        codec.open(sealed)
    return sealing, (time.perf_counter() - began) / rounds * 1e6


async def step_ms(dir: str | None, size: int, steps: int, codec: fusee.AesGcm | None, rounds: int) -> float:
    best = float("inf")
    options = {"durability": "memory"} if dir is None else {}
    engine = await fusee.Engine.open(dir, workflows=[chain], shards=1, codec=codec, **options)
    try:
        for r in range(rounds):
            began = time.perf_counter()
            run = await engine.start(chain, f"chain-{r}", {"size": size, "steps": steps})
            await run.result()
            best = min(best, (time.perf_counter() - began) * 1000 / steps)
    finally:
        await engine.close()
    return best


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    codec = fusee.aes_gcm({"k1": os.urandom(32)})
    with tempfile.TemporaryDirectory(prefix="fusee-codec-bench-") as scratch:
        flush = flush_ms(Path(scratch))
        print(f"floor: one durable flush here {flush * 1000:.0f} µs")
        for size in SIZES:
            sealing, opening = seal_open_us(size)
            print(f"floor: {size:>6,} B payload: seal {sealing:.1f} µs, open {opening:.1f} µs")
        for size in SIZES:
            for where in ("directory", "memory"):
                dirs = [None, None] if where == "memory" else [f"{scratch}/p{size}", f"{scratch}/e{size}"]
                plain = await step_ms(dirs[0], size, args.steps, None, args.rounds)
                sealed = await step_ms(dirs[1], size, args.steps, codec, args.rounds)
                print(
                    f"{where:>9}, {size:>6,} B results: {plain:.3f} ms per step plain, {sealed:.3f} encrypted "
                    f"(+{(sealed - plain) * 1000:.0f} µs, {sealed / plain:.2f}x)"
                )


if __name__ == "__main__":
    asyncio.run(main())
