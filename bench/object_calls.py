"""Objects (docs/objects.md): what a call costs and what an idle key holds. Run on demand:
`python bench/object_calls.py` (not a timed test).

- A call, one after another to one key, on a data directory (local mode): p50 and p90,
  against this machine's floor, one durable flush (`fusee disk-check`'s p50, measured in
  the same run): a call's result is released after one flush.
- The same in memory (no disk): the engine's own cost of a call, against an update of a
  plain workflow (`run.update` with an `on_update` handler), the mechanism a call is.
- Idle keys: `--keys` keys (default 10,000) on a data directory, called once each, then
  left idle past their compaction and parking; the memory the engine still holds for them
  (tracemalloc, per key: Python's allocations; the log and the run store are on disk),
  against one index entry as the run index holds it; and the run store frame of a parked
  key (bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _floors import flush_ms

import fusee
from fusee._sealing import sealed_frame

counter = fusee.object("counter")


@counter.exclusive
async def bump(ctx: fusee.ObjectCtx, n: int) -> int:
    total = (ctx.state.get("total") or 0) + n
    ctx.state.set("total", total)
    return total


@fusee.workflow("plain")
async def plain(ctx: fusee.Ctx) -> None:
    total = [0]

    def add(n: int) -> int:
        total[0] += n
        return total[0]

    ctx.on_update("add", add)
    await ctx.wait_for("never")


def spread(times: list[float]) -> tuple[float, float]:
    times = sorted(times)
    return statistics.median(times), times[int(len(times) * 0.9)]


async def calls(engine: fusee.Engine, count: int) -> list[float]:
    ref = engine.object("counter", "one")
    await ref.call("bump", 1)
    out = []
    for i in range(count):
        began = time.perf_counter()
        await ref.call("bump", 1, id=f"c-{i}")
        out.append((time.perf_counter() - began) * 1000)
    return out


async def updates(engine: fusee.Engine, count: int) -> list[float]:
    run = await engine.start(plain, "p-1")
    await run.update("add", 1)
    out = []
    for i in range(count):
        began = time.perf_counter()
        await run.update("add", 1, id=f"u-{i}")
        out.append((time.perf_counter() - began) * 1000)
    return out


async def idle_keys(keys: int, scratch: Path) -> tuple[float, float, float, int, int]:
    """(bytes the engine holds per idle key, bytes of one index entry, keys still in
    memory, a parked key's store frame in bytes), on a data directory: the run store and
    the log are on disk, so what Python still holds is the engine's."""
    engine = await fusee.Engine.open(str(scratch / "idle"), objects=[counter], shards=4, park_after="100ms")
    await engine.object("counter", "warm").call("bump", 1)
    await asyncio.sleep(1.0)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for start in range(0, keys, 500):
        await asyncio.gather(
            *(engine.object("counter", f"k{i}").call("bump", i) for i in range(start, start + 500))
        )
    for _ in range(100):  # compacted, then parked
        await asyncio.sleep(0.1)
        if sum(len(s.runs) for s in engine.shards) == 0:
            break
    await asyncio.sleep(0.3)  # the last checkpoints
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    loaded = sum(len(s.runs) for s in engine.shards)
    tables = [s.index_entries._table for s in engine.shards]
    entries = sum(len(t) for t in tables)
    # An entry of the run index: its slot in the table (the dict's own bytes shared out)
    # and the two ints it is (the ID's hash and the packed entry).
    entry_bytes = sum(
        sys.getsizeof(t) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in t.items()) for t in tables
    )
    # The local store keeps the last checkpoint it wrote (the index, encoded) in memory.
    kept = [getattr(s.store, "last_checkpoint", None) for s in engine.shards]
    checkpoint_bytes = sum(len(k[1]) for k in kept if k is not None)
    described = await engine.run("counter/k1").describe()
    frame = len(sealed_frame(None, "counter/k1", described.summary.run, described.journal))
    await engine.close()
    return (after - before) / keys, entry_bytes / entries, checkpoint_bytes / keys, loaded, frame


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--keys", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as scratch:
        floor = flush_ms(Path(scratch))
        engine = await fusee.Engine.open(str(Path(scratch) / "data"), objects=[counter], shards=4)
        disk = spread(await calls(engine, args.calls // 4))
        await engine.close()
        per_key, entry, checkpoint, loaded, frame = await idle_keys(args.keys, Path(scratch))
    engine = await fusee.Engine.open(objects=[counter], workflows=[plain], shards=4)
    memory = spread(await calls(engine, args.calls))
    plain_update = spread(await updates(engine, args.calls))
    await engine.close()
    print(f"floor: one durable flush {floor:.3f} ms (disk-check p50)")
    print(
        f"a call on a data directory: p50 {disk[0]:.3f} ms, p90 {disk[1]:.3f} ms "
        f"({disk[0] / floor:.1f}x the flush)"
    )
    print(
        f"a call in memory: p50 {memory[0] * 1000:.0f} us, p90 {memory[1] * 1000:.0f} us; "
        f"a plain workflow's update {plain_update[0] * 1000:.0f} us ({memory[0] / plain_update[0]:.1f}x)"
    )
    print(
        f"{args.keys:,} idle keys: {loaded} still in memory; {per_key:.0f} B held per key: its index entry "
        f"{entry:.0f} B, the store's copy of its last checkpoint {checkpoint:.0f} B, the rest "
        f"{per_key - entry - checkpoint:.0f} B (the cache of ID hashes, at most 4,096 IDs); "
        f"a parked key's journal {frame} B"
    )


if __name__ == "__main__":
    asyncio.run(main())
