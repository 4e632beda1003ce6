"""How late a schedule's runs start: for each fire, the run's recorded start time minus
its scheduled time (the time in its ID). Run on demand:
`python bench/schedule_lateness.py [--fires 40] [--every 250ms] [--dir PARENT] [--server]`
(not a timed test; `fires * every` seconds and a few more).

Local mode by default: an engine on a fresh data directory under `--dir` (default: the
system's temporary directory), removed afterwards. `--server`: a `fusee server` and one
long-lived worker process (tests/server_mode/worker.py), the schedule made through a
client. Either way the schedule is `every` with `overlap="allow-all"`, its workflow one
trivial step, and nothing else runs. Prints lateness p50, p90 and max in ms. Invoked
workers are measured by tests/invoke/test_schedules_invoked.py (`-s` prints them).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--fires", type=int, default=40)
    parser.add_argument("--every", default="250ms")
    parser.add_argument("--dir", default=None, help="where the temporary data directory goes")
    parser.add_argument("--server", action="store_true", help="a fusee server and one worker process")
    args = parser.parse_args()
    began = time.monotonic()
    run = server if args.server else local
    late = asyncio.run(run(args.fires, args.every, args.dir))
    where = "server, one worker" if args.server else "local mode"
    deciles = statistics.quantiles(late, n=10)
    print(
        f"{where}: {len(late)} fires every {args.every}: lateness ms p50 {statistics.median(late):.0f}, "
        f"p90 {deciles[8]:.0f}, max {max(late)} ({time.monotonic() - began:.1f} s)"
    )


if __name__ == "__main__":
    main()
