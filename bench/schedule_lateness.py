"""How late a schedule's runs start: for each fire, the run's recorded start time minus
its scheduled time (the time in its ID). Run on demand:
`python bench/schedule_lateness.py [--fires 40] [--every 250ms] [--dir PARENT] [--server | --invoked]`
(not a timed test; `fires * every` seconds and a few more).

Local mode by default: an engine on a fresh data directory under `--dir` (default: the
system's temporary directory), removed afterwards. `--server`: a `fusee server` and one
long-lived worker process (tests/server_mode/worker.py), the schedule made through a
client. `--invoked`: `fusee server --invoke` POSTing to uvicorn serving
`handlers.asgi:app` (tests/support/cluster.py), no long-lived worker: each fire is an
invocation of the schedule's shard. Either way the schedule is `every` with
`overlap="allow-all"`, its workflow trivial, and nothing else runs. Prints lateness p50,
p90 and max in ms, and the p50 against this machine's wake-up floor (bench/_floors.py:
oversleep + 1 RTT + 1 flush, measured first in the same run; without the RTT in local
mode), the least a timer firing into a durable start can take.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support, when run as `python bench/x.py`
sys.path.insert(0, str(ROOT / "bench"))  # _floors
from _floors import Floors, times  # noqa: E402
from _floors import measure as measure_floors  # noqa: E402

import fusee  # noqa: E402 (after the path above)
from fusee.workflow.durations import to_ms  # noqa: E402


@fusee.workflow("steps")
async def steps(ctx: fusee.Ctx, n: int) -> list[str]:
    return [await ctx.step(f"s{i}", lambda i=i: f"s{i}") for i in range(n)]


def scheduled_ms(run_id: str) -> int:
    text = run_id.split("@", 1)[1].replace("Z", "+00:00")
    return int(datetime.fromisoformat(text).timestamp() * 1000)


async def measure(api: Any, fires: int, every: str) -> list[int]:
    s = await api.schedule("bench", {"every": every, "overlap": "allow-all"}, "steps", 1)
    # Nothing is asked meanwhile: through a server a call could delay a fire.
    await asyncio.sleep(fires * to_ms(every) / 1000 + 0.5)
    await s.delete()
    ids = sorted([row.id async for row in api.list(type="steps")])[:fires]
    late = []
    for rid in ids:
        started = (await api.run(rid).describe()).journal[0].now
        late.append(started - scheduled_ms(rid))
    return late


async def local(fires: int, every: str, parent: str | None) -> list[int]:
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        engine = await fusee.Engine.open(str(Path(tmp) / "data"), workflows=[steps])
        try:
            return await measure(engine, fires, every)
        finally:
            await engine.close()


async def server(fires: int, every: str, parent: str | None) -> list[int]:
    from tests.support.procs import Server, Worker

    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        srv = Server(Path(tmp) / "server")
        worker = Worker(srv.address())
        try:
            client = await fusee.Client.connect(srv.address())
            try:
                return await measure(client, fires, every)
            finally:
                await client.close()
        finally:
            worker.stop()
            srv.stop()


async def invoked(fires: int, every: str, parent: str | None) -> list[int]:
    from tests.support.cluster import Cluster, quiet

    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        cluster: Cluster[Any] = Cluster(Path(tmp))
        try:
            cluster.start_handler()
            cluster.start_invoked()
            client = await cluster.client()
            try:
                await quiet(client)  # the server's first invocations, done
                return await measure(client, fires, every)
            finally:
                await client.close()
        finally:
            cluster.close()


async def floors_then(run: Any, fires: int, every: str, parent: str | None) -> tuple[Floors, list[int]]:
    with tempfile.TemporaryDirectory(dir=parent) as tmp:
        floors = await measure_floors(Path(tmp))
    return floors, await run(fires, every, parent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--fires", type=int, default=40)
    parser.add_argument("--every", default="250ms")
    parser.add_argument("--dir", default=None, help="where the temporary data directory goes")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--server", action="store_true", help="a fusee server and one worker process")
    mode.add_argument("--invoked", action="store_true", help="fusee server --invoke and a uvicorn handler")
    args = parser.parse_args()
    began = time.monotonic()
    run, where = local, "local mode"
    if args.server:
        run, where = server, "server, one worker"
    elif args.invoked:
        run, where = invoked, "invoked handler (uvicorn)"
    floors, late = asyncio.run(floors_then(run, args.fires, args.every, args.dir))
    p50 = statistics.median(late)
    deciles = statistics.quantiles(late, n=10)
    # In one process a fire crosses no socket: its floor is the wake-up floor less an RTT.
    floor = floors.wake_up_ms if args.server or args.invoked else floors.wake_up_ms - floors.rtt_quiet_ms
    named = "wake-up floor" if args.server or args.invoked else "wake-up floor less the RTT"
    print(floors.describe())
    print(
        f"{where}: {len(late)} fires every {args.every}: lateness ms p50 {p50:.0f} "
        f"({times(p50, floor)}, the {named}: {floor:.2f} ms), "
        f"p90 {deciles[8]:.0f}, max {max(late)} ({time.monotonic() - began:.1f} s)"
    )


if __name__ == "__main__":
    main()
