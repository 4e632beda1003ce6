"""What a limit adds to a step (docs/limits.md). Run on demand:
`python bench/limit_cost.py [--steps 2000] [--rounds 7] [--server-steps 500] [--attempts 200]
[--only local|server|invoked-regrant] [--regrants 30]`.

- Local: sequential steps with `limit=` against the same steps without, on a memory engine
  in one process (local mode's permit path), in alternating rounds.
- Server: the same against a `fusee server` (this process the only worker), the limit
  high enough that no step waits: the cost of asking the server for a permit and
  returning it.
- Grant latency: `concurrent=1` and three worker processes of one shard each contending
  for it; every attempt appends its begin and end times to a file, and the gap from one
  attempt's end to the next one's begin is the permit's way back to the server and out
  to the next waiter (to another worker, or to the same one).

- Invoked regrant (`--only invoked-regrant`, not run by default): `fusee server --invoke`
  POSTing to uvicorn serving handlers/asgi.py (the tests' cluster), `concurrent=1`; in
  each round a step on one shard holds the permit while a step on another shard asks for
  it, its shard is let go of (its invocation returns), and the gap from the holder's end
  to the waiter's begin is the server's grant, the shard's new invocation (reason
  `permit`), its engine's open and the step's asking again.

Prints the median µs per step of each and the difference, then the gaps' p50 and p90.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _server_procs import Child, Server, Worker, run_in  # noqa: E402

import fusee  # noqa: E402 (after the path above)

WORKERS = 3  # grant latency: worker processes of one shard each


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


@fusee.workflow("contend")
async def contend(ctx: fusee.Ctx, x: dict) -> int:
    """`x["n"]` sequential steps under `concurrent=1`, so that its worker has one waiter at
    a time (with a burst of runs on each worker instead, a returned permit went to the same
    worker's next waiter in 56 of 59 handoffs, which measures little across workers); each attempt
    appends "+1 TIME PID" as it begins and "-1 TIME PID" as it ends to `x["file"]`."""

    async def call() -> int:
        with open(x["file"], "a") as file:
            file.write(f"+1 {time.time()} {os.getpid()}\n")
        await asyncio.sleep(x["ms"] / 1000)
        with open(x["file"], "a") as file:
            file.write(f"-1 {time.time()} {os.getpid()}\n")
        return 1

    for i in range(x["n"]):
        await ctx.step(f"call{i}", call, limit="one")
    return x["n"]


WORKFLOWS = [plain, limited, contend]


async def one(engine: fusee.Engine, wf: fusee.Workflow, wid: str, n: int) -> float:
    began = time.perf_counter()
    await (await engine.start(wf, wid, n)).result()
    return (time.perf_counter() - began) / n * 1e6


async def step_cost(engine: fusee.Engine, steps: int, rounds: int, what: str) -> None:
    await engine.limit("bench", concurrent=1_000)
    await one(engine, plain, "warm-p", steps)
    await one(engine, limited, "warm-l", steps)
    without, with_ = [], []
    for r in range(rounds):
        pair = [(plain, without), (limited, with_)]
        for wf, out in pair if r % 2 == 0 else reversed(pair):
            out.append(await one(engine, wf, f"{wf.name}-{r}", steps))
    a, b = statistics.median(without), statistics.median(with_)
    print(f"{steps} sequential steps x {rounds} alternating rounds, {what}")
    print(f"without a limit: {a:.1f} us/step (median)")
    print(f"with a limit:    {b:.1f} us/step (median), +{b - a:.1f} us")


async def local(steps: int, rounds: int) -> None:
    engine = await fusee.Engine.open(workflows=WORKFLOWS)
    try:
        await step_cost(engine, steps, rounds, "memory engine")
    finally:
        await engine.close()


class LimitWorker(Worker):
    """`limit_cost.py --worker ADDRESS`: runs what its shards are given until its stdin
    closes (Worker's stop)."""

    def __init__(self, address: str) -> None:
        Child.__init__(self, [sys.executable, str(Path(__file__).resolve()), "--worker", address], stdin=True)


async def worker_process(address: str) -> None:
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    engine = await fusee.Engine.open(durability="server", address=address, workflows=WORKFLOWS)
    try:
        print("ready", *sorted(shard.index for shard in engine.shards), flush=True)
        await commands.read()  # the end of stdin: the benchmark is done or went away
    finally:
        await engine.close()


def p(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * q))]


def one_id_per_shard() -> list[str]:
    """A workflow ID on each of the server's shards (a shard is the CRC-32 of the ID
    modulo the shards), so one run on each worker."""
    ids: dict[int, str] = {}
    for i in itertools.count():
        ids.setdefault(zlib.crc32(f"c{i}".encode()) % WORKERS, f"c{i}")
        if len(ids) == WORKERS:
            return list(ids.values())
    raise AssertionError


async def grant_latency(scratch: Path, attempts: int, ms: float) -> None:
    server = await Server(scratch / "server-g", scratch / "g.sock", shards=WORKERS).ready()
    file = scratch / "attempts"
    file.touch()
    workers = []
    for _ in range(WORKERS):  # one at a time: each takes its shard before the next connects
        workers.append(LimitWorker(server.address("tcp", max_shards=1)))
        held = (await workers[-1].wait_for_async(r"^ready (.*)$")).group(1).split()
        assert len(held) == 1, f"a worker holds shards {held}"
    client = await fusee.Client.connect(server.address("tcp"))
    try:
        await client.limit("one", concurrent=1)
        x = {"file": str(file), "ms": ms, "n": attempts // WORKERS}
        runs = await asyncio.gather(*(client.start("contend", wid, x) for wid in one_id_per_shard()))
        assert [await run.result() for run in runs] == [x["n"]] * WORKERS
    finally:
        await client.close()
        for worker in reversed(workers):
            worker.stop()
        server.stop()
    events = sorted(
        (float(at), int(d), int(pid)) for d, at, pid in map(str.split, file.read_text().splitlines())
    )
    across, same = [], []
    for (end_at, d0, pid0), (begin_at, d1, pid1) in itertools.pairwise(events):
        if d0 == -1 and d1 == 1:
            (across if pid0 != pid1 else same).append((begin_at - end_at) * 1e6)
    most = inside = 0
    for _, d, _ in events:
        inside += d
        most = max(most, inside)
    assert most == 1, f"{most} attempts inside a limit of 1"
    assert len({pid for _, _, pid in events}) == WORKERS, "not every worker ran attempts"
    attempts = len(events) // 2
    print(f"{attempts} attempts of {ms:g} ms under concurrent=1, {WORKERS} worker processes, one server")
    for name, gaps in (("to another worker", across), ("to the same worker", same)):
        if gaps:
            print(
                f"end to next begin, {name}: {p(gaps, 0.5):.0f} us p50, {p(gaps, 0.9):.0f} us p90 ({len(gaps)})"
            )


async def server_mode(args: argparse.Namespace, scratch: Path) -> None:
    server = await Server(scratch / "server-s", scratch / "s.sock", shards=1).ready()
    try:
        engine = await fusee.Engine.open(
            durability="server", address=server.address("tcp"), workflows=WORKFLOWS
        )
        try:
            await step_cost(engine, args.server_steps, args.rounds, "server mode (TCP, one worker)")
        finally:
            await engine.close()
    finally:
        server.stop()
    print()
    await grant_latency(scratch, args.attempts, args.ms)


async def invoked_regrant(scratch: Path, rounds: int) -> None:
    from tests.support.cluster import Cluster
    from tests.support.waiting import eventually

    cluster: Cluster[Any] = Cluster(scratch / "cluster")
    try:
        cluster.start_handler()
        server = cluster.start_invoked(shards=2)
        client = await cluster.client()
        await client.limit("one", concurrent=1)
        gaps: list[float] = []
        skipped = 0

        async def waiting() -> bool:
            return (await client.limit_usage("one"))["waiting"] == 1

        ids = (f"r{i}" for i in itertools.count())
        for r in range(rounds):
            holder = next(i for i in ids if client.shard_of(i) == 0)
            waiter = next(i for i in ids if client.shard_of(i) == 1)
            files = [scratch / f"{r}-holder", scratch / f"{r}-waiter"]
            for f in files:
                f.touch()
            await client.start("limited", holder, {"limit": "one", "ms": 700, "file": str(files[0])})
            await eventually(lambda files=files: files[0].read_text(), timeout=10.0, every=0.005)
            await client.start("limited", waiter, {"limit": "one", "ms": 1, "file": str(files[1])})
            await eventually(waiting, timeout=10.0, every=0.005)
            await eventually(lambda: 1 not in server.held(), timeout=10.0, every=0.005)
            released = "-1" not in files[0].read_text()
            await eventually(
                lambda files=files: files[1].read_text().count("\n") == 2, timeout=10.0, every=0.005
            )
            if not released:
                skipped += 1  # its shard was still held when the permit came: not this path
                continue
            end = float(files[0].read_text().splitlines()[1].split()[1])
            begin = float(files[1].read_text().splitlines()[0].split()[1])
            gaps.append((begin - end) * 1000)
        await client.close()
    finally:
        cluster.close()
    print(
        f"invoked regrant: permit returned -> the waiting step begins in its shard's new invocation, "
        f"{len(gaps)} rounds ({skipped} skipped): {p(gaps, 0.5):.1f} ms p50, {p(gaps, 0.9):.1f} ms p90"
    )


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=2000, help="local mode's steps per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--server-steps", type=int, default=500, help="server mode's steps per round")
    parser.add_argument("--attempts", type=int, default=300, help="contending attempts, grant latency")
    parser.add_argument("--ms", type=float, default=2.0, help="each contending attempt's sleep")
    parser.add_argument("--local-only", action="store_true")
    parser.add_argument("--only", choices=["local", "server", "invoked-regrant"])
    parser.add_argument("--regrants", type=int, default=30, help="invoked regrant's rounds")
    parser.add_argument("--worker", metavar="ADDRESS", help=argparse.SUPPRESS)  # a worker process
    args = parser.parse_args()
    if args.worker is not None:
        asyncio.run(worker_process(args.worker))
        return 0
    if args.only in (None, "local"):
        asyncio.run(local(args.steps, args.rounds))
    if args.local_only or args.only == "local":
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="fusee-limit-cost-"))
    if args.only == "invoked-regrant":
        return run_in(scratch, invoked_regrant(scratch, args.regrants))
    print()
    return run_in(scratch, server_mode(args, scratch))


if __name__ == "__main__":
    sys.exit(main())
