"""CPU per woken run (issue 19's goal: the invoked handler at most 1.5x local mode's).
Run on demand: `python bench/wake_cpu.py [--rounds 5] [--many 100] [--dir PARENT]
[--profile DIR]`; about a minute on two cores. Not a timed test.

The setup is bench/invoke_cost.py's (its `start_cluster`: `fusee server --invoke`, uvicorn
serving the handler, this process the client), and its `nap` workflow: a 1 s sleep, then a
step. Per round, for 1 and for MANY sleepers started at once (each client's `result()`
asked for at once, waiting at the server through the sleep, as in invoke_cost.py's row 5):
once every start's invocation is over (nothing invoking, nothing overdue) and before the
first timer is due, the CPU of every thread of the handler and of the server is read
(/proc/PID/task/*/schedstat, its first field: ns on a CPU), and again once every run's
result is in and nothing is invoking. The same runs then in local mode (`Engine.open(dir)`
in this process, the same 4 shards), this process's threads read over the same window.

The figure is the marginal CPU per woken run: (cpu(MANY) - cpu(1)) / (MANY - 1), which
leaves out what a wake-up window costs whatever the count (one invocation per shard, the
metrics polled to see the end). Medians over the rounds, alternating the counts; one
warm-up round first (the handler's first invocations import what they use). A thread that
ends inside the window takes its CPU with it: the count of such threads is printed.

`--profile DIR`: the server and the handler under cProfile (stats in DIR when they stop,
see invoke_cost.py); the CPU figures are then cProfile's. With FUSEE_BENCH_PROFILE_WINDOWS=N
in the environment the handler's profile covers only the windows of N sleepers (1 or MANY).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _invoke_procs import nap
from _server_procs import run_in
from invoke_cost import SHARDS, SLEEP_MS, Cluster, start_cluster

import fusee

GOAL_RATIO = 1.5  # the handler's marginal CPU per woken run against local mode's


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """ns on a CPU so far, per live thread of `pid` (the first field of its schedstat)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found[task.name] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return found


@dataclass
class Window:
    """CPU ns of each process over one wake-up window, and threads that ended in it."""

    cpu_ns: dict[str, int]
    threads_gone: int
    invocations: int = 0  # the handler's, answered in the window
    not_granted: int = 0  # of them, those granted no shard (answered without opening)


class Meter:
    """Reads processes' per-thread CPU at a window's start and end."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before: dict[str, dict[str, int]] = {}

    def start(self) -> None:
        self.before = {name: thread_cpu_ns(pid) for name, pid in self.pids.items()}

    def stop(self) -> Window:
        cpu, gone = {}, 0
        for name, pid in self.pids.items():
            now, then = thread_cpu_ns(pid), self.before[name]
            # Threads born in the window count from 0; ended ones are lost (counted).
            cpu[name] = sum(ns - then.get(tid, 0) for tid, ns in now.items())
            gone += len(then.keys() - now.keys())
        return Window(cpu, gone)


async def invoked_window(cluster: Cluster, meter: Meter, count: int, prefix: str) -> Window:
    client = cluster.client
    await cluster.quiet()
    started = asyncio.Event()
    begun = 0
    dues: list[float] = []

    async def one(wid: str) -> None:
        nonlocal begun
        run = await client.start("nap", wid, SLEEP_MS)
        begun += 1
        if begun == count:
            started.set()
        due, _ = await run.result()
        dues.append(float(due))

    began = time.time()
    runs = asyncio.gather(*(one(f"{prefix}-{i}") for i in range(count)))
    await started.wait()
    # Every start's invocation over; the shards with a timer count as due, none overdue.
    await cluster.quiet(due_allowed=SHARDS)
    mark = cluster.mark()
    meter.start()
    profiling = os.environ.get("FUSEE_BENCH_PROFILE_WINDOWS") == str(count)
    if profiling:
        os.kill(meter.pids["handler"], signal.SIGUSR1)
    opened = time.time()
    await runs
    await cluster.quiet()
    window = meter.stop()
    if profiling:
        os.kill(meter.pids["handler"], signal.SIGUSR2)
    assert cluster.handler is not None
    with cluster.handler.lock:
        lines = cluster.handler.lines[mark:]
    window.invocations = sum(line.startswith("bench invocation ") for line in lines)
    window.not_granted = sum(" leased granted=[] " in line for line in lines)
    if opened * 1000 >= min(dues):
        raise RuntimeError(
            f"the window opened {opened - began:.2f} s after the starts, after a timer was due"
        )
    return window


async def local_window(engine: fusee.Engine, meter: Meter, count: int, prefix: str) -> Window:
    started = asyncio.Event()
    begun = 0

    async def one(wid: str) -> None:
        nonlocal begun
        run = await engine.start(nap, wid, SLEEP_MS)
        begun += 1
        if begun == count:
            started.set()
        await run.result()

    began = time.monotonic()
    runs = asyncio.gather(*(one(f"{prefix}-{i}") for i in range(count)))
    await started.wait()
    await asyncio.sleep(0.2)  # each run's first part to its sleep: started, not woken
    if time.monotonic() - began > SLEEP_MS / 1000 * 0.8:
        raise RuntimeError("the local starts took most of the sleep")
    meter.start()
    await runs
    return meter.stop()


def marginal_us(many: Window, one: Window, name: str, count: int) -> float:
    return (many.cpu_ns[name] - one.cpu_ns[name]) / (count - 1) / 1000


async def run_all(args: argparse.Namespace, scratch: Path) -> None:
    cluster = await start_cluster(scratch, args.profile, "asyncio")
    assert cluster.handler is not None and cluster.server is not None
    invoked = Meter({"handler": cluster.handler.pid, "server": cluster.server.pid, "client": os.getpid()})
    local = Meter({"local": os.getpid()})
    engine = await fusee.Engine.open(str(scratch / "local"), workflows=[nap], shards=SHARDS)
    per: dict[str, list[float]] = {"handler": [], "server": [], "client": [], "local": []}
    gone = 0
    try:
        await cluster.quiet()
        for round in range(args.rounds + 1):  # round 0: the warm-up
            found: dict[int, tuple[Window, Window]] = {}
            counts = (1, args.many) if round % 2 else (args.many, 1)
            for count in counts:
                inv = await invoked_window(cluster, invoked, count, f"nap-{round}-{count}")
                loc = await local_window(engine, local, count, f"local-{round}-{count}")
                found[count] = (inv, loc)
            if round == 0:
                continue
            (inv_many, loc_many), (inv_one, loc_one) = found[args.many], found[1]
            for name in ("handler", "server", "client"):
                per[name].append(marginal_us(inv_many, inv_one, name, args.many))
            per["local"].append(marginal_us(loc_many, loc_one, "local", args.many))
            gone += sum(w.threads_gone for pair in found.values() for w in pair)
            print(
                f"round {round}: per woken run handler {per['handler'][-1]:.0f} us, server "
                f"{per['server'][-1]:.0f} us, local {per['local'][-1]:.0f} us "
                f"(windows, 1 and {args.many}: handler {inv_one.cpu_ns['handler'] / 1e6:.1f} and "
                f"{inv_many.cpu_ns['handler'] / 1e6:.1f} ms, local {loc_one.cpu_ns['local'] / 1e6:.1f} "
                f"and {loc_many.cpu_ns['local'] / 1e6:.1f} ms; handler invocations, 1 and {args.many}: "
                f"{inv_one.invocations} and {inv_many.invocations}, of which granted nothing "
                f"{inv_one.not_granted} and {inv_many.not_granted})",
                file=sys.stderr,
                flush=True,
            )
    finally:
        await engine.close()
        await cluster.client.close()
    med = {name: statistics.median(values) for name, values in per.items()}
    ratio = med["handler"] / med["local"]
    print(
        f"CPU per woken run (marginal, 1 to {args.many} sleepers of {SLEEP_MS} ms, schedstat over "
        f"every thread; medians of {args.rounds} rounds):\n"
        f"  invoked: handler {med['handler']:.0f} us, server {med['server']:.0f} us "
        f"(the client, this process, {med['client']:.0f} us)\n"
        f"  local mode (one process): {med['local']:.0f} us\n"
        f"  handler / local: {ratio:.2f}x (goal at most {GOAL_RATIO:g}x: "
        f"{'met' if ratio <= GOAL_RATIO else 'MISSED'}); handler + server / local: "
        f"{(med['handler'] + med['server']) / med['local']:.2f}x\n"
        f"  per round, handler/local: {', '.join(f'{h / loc:.2f}' for h, loc in zip(per['handler'], per['local'], strict=True))}; "
        f"threads that ended inside a window (their CPU lost): {gone}; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}"
        + (f"; under cProfile (stats in {args.profile})" if args.profile else "")
    )


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--many", type=int, default=100, help="sleepers against 1 (default 100)")
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()), help="parent of the scratch directory"
    )
    parser.add_argument("--profile", type=Path, help="the server and the handler under cProfile, stats here")
    args = parser.parse_args()
    if args.rounds < 1 or args.many < 2:
        parser.error("--rounds at least 1, --many at least 2")
    if args.profile is not None:
        args.profile = args.profile.resolve()
        args.profile.mkdir(parents=True, exist_ok=True)
    return args


def main() -> int:
    args = arguments()
    scratch = Path(tempfile.mkdtemp(prefix="fusee-wake-cpu-", dir=args.dir.resolve()))
    return run_in(scratch, run_all(args, scratch))


if __name__ == "__main__":
    sys.exit(main())
