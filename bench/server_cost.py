"""Server mode's cost: what a step pays for going to a `fusee server` instead of a data
directory on this machine, how steps per second grow with worker processes sharing one
server, and what the server keeps in memory. Run on demand:
`python bench/server_cost.py [STEPS [ROUNDS]] [--window S] [--dir PARENT] [--quick]`
(not a timed test; about a minute; `--quick` is a smoke run of a few seconds).

The server is a separate process (`python -m fusee server` on loopback TCP and a Unix
socket). Its data directory and local mode's are in a fresh directory under `--dir`
(default: the system's temporary directory; a tmpfs would hide the flushes), removed
afterwards; the processes are stopped however the run ends (Ctrl-C, SIGTERM; after a
SIGKILL they stop too, but the directory stays). Prints, against the goals quoted in
the README (*Speed*):
- the reference table: a sequential step (one workflow of STEPS trivial steps, default 500)
  at p50, in local mode (one shard), over the Unix socket and over loopback TCP (a server
  of one shard; the worker is this process). ROUNDS rounds (default 7) alternate the
  three (each round in another order); a round's figure is the p50 of the time from one
  step function's call to the next, the table shows the median of the rounds and their
  range, and "Over local" each round's difference to local mode in the same round.
  Goal: TCP at most local + 60 us. Under it: p90 and mean, the voluntary context
  switches per step of this process and of the server (every thread), and the floor
  under "Over local" on this machine: a bare asyncio round trip to another process;
- steps per second with 1, 2 and 4 worker processes splitting a server's 4 shards
  (`max-shards`), each shard with `--in-flight` runs of `--run-steps` steps at once (a
  new one started as each ends: runs that never end cost the engine more every tick, so
  the rate would fall as the window goes on), steps counted over `--window` seconds
  after a warm-up and summed over the workers, with the CPU the
  server and the workers used (100% is one core); then the same load on one process in
  local mode, for reference;
- the server's resident memory (VmRSS) while one worker holds its four shards and all
  is idle (`--idle` seconds after the 1-worker window). Goal: under 64 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import itertools
import os
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from _pg_floor import TRIPS, Database, floor_us
from _server_procs import Child, Server, Worker, free_port, run_in, thread_switches
from fusee_server import _native

import fusee

PATHS = ("local", "unix", "tcp")
ROW_NAMES = {
    "local": "Local mode",
    "unix": "Unix socket",
    "tcp": "Loopback TCP",
    "postgresql": "Loopback TCP, PostgreSQL store",
}
RANGE_DASH = "\u2013"  # as the reference table writes a range
OVER_LOCAL_GOAL_US = 60.0  # a step over TCP at most local + this
RSS_GOAL_MIB = 64.0
WORKER_COUNTS = (1, 2, 4)
THROUGHPUT_SHARDS = 4
LOCAL_PREFIX = "dir:"  # a worker process's address for local mode instead
ECHO_BYTES = 128  # about a one-step APPEND frame
ECHO_TRIPS = 2000

STAMPS: list[int] = []  # perf_counter_ns at each call of a timed step's function
TICKS = 0  # step functions run in this worker process (the throughput count)
STEPPING = True  # cleared to let the throughput runs end


def stamp() -> None:
    STAMPS.append(time.perf_counter_ns())


def tick() -> bool:
    global TICKS
    TICKS += 1
    return STEPPING


@fusee.workflow("timed")
async def timed(ctx: fusee.Ctx, steps: int) -> int:
    """`steps` sequential steps, each stamping the time its function was called: the gap
    from one stamp to the next is one step (its record made durable, the next one run)."""
    for _ in range(steps):
        await ctx.step("s", stamp)
    return steps


@fusee.workflow("burst")
async def burst(ctx: fusee.Ctx, steps: int) -> int:
    """`steps` sequential steps, fewer once the worker is told to stop."""
    done = 0
    while done < steps and await ctx.step("t", tick):
        done += 1
    return done


WORKFLOWS = [timed, burst]


def fs_type(path: Path) -> str:
    """The file system under `path`: that of the longest mount point holding it."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                point, point_kind = line.split()[1:3]
                if (path == Path(point) or Path(point) in path.parents) and len(point) > len(best):
                    best, kind = point, point_kind
    except OSError:
        pass
    return kind


def p50(values: list[float]) -> float:
    return statistics.median(values)


# -- 1. one sequential step: local mode, Unix socket, loopback TCP -----------------------


@dataclass
class Round:
    step_us: float  # p50 of the round's steps
    p90_us: float
    mean_us: float
    switches: float  # voluntary context switches per step, this process
    server_switches: float  # and the server's


async def open_engine(path: str, local_dir: Path, server: Server) -> fusee.Engine:
    if path == "local":
        return await fusee.Engine.open(str(local_dir), workflows=WORKFLOWS, shards=1)
    address = server.tcp if path == "postgresql" else server.address(path)
    return await fusee.Engine.open(durability="server", address=address, workflows=WORKFLOWS)


async def step_round(path: str, local_dir: Path, server: Server, steps: int, warmup: int, r: int) -> Round:
    """Open an engine on `path` (`server` is the one serving it), warm it up, time one
    workflow of `steps` steps, close."""
    engine = await open_engine(path, local_dir, server)
    try:
        await (await engine.start(timed, f"warm-{path}-{r}", warmup)).result()
        STAMPS.clear()
        gc.collect()
        me, theirs = thread_switches("self"), server.voluntary_switches()
        run = await engine.start(timed, f"timed-{path}-{r}", steps + 1)
        await run.result()
        me, theirs = thread_switches("self") - me, server.voluntary_switches() - theirs
    finally:
        await engine.close()
    gaps = sorted((b - a) / 1000 for a, b in itertools.pairwise(STAMPS))
    assert len(gaps) == steps, f"{len(gaps)} steps timed, not {steps}"
    return Round(p50(gaps), gaps[int(steps * 0.9)], statistics.fmean(gaps), me / steps, theirs / steps)


def us_range(values: list[float], sign: bool = False) -> str:
    """The range of `values` as the reference table writes it: 27.0\u201332.5, or +12.0 to +18.0."""
    f = "{:+.1f}" if sign else "{:.1f}"
    low, high = f.format(min(values)), f.format(max(values))
    return low if low == high else f"{low}{' to ' if sign else RANGE_DASH}{high}"


async def step_rounds(
    args: argparse.Namespace, scratch: Path, servers: dict[str, Server]
) -> dict[str, list[Round]]:
    """Rounds alternating the paths (`local` and those `servers` serve), each round in
    another order, so none always follows the same one."""
    paths = ["local", *servers]
    rounds: dict[str, list[Round]] = {path: [] for path in paths}
    n = len(paths)
    for r in range(args.rounds):
        for path in paths[r % n :] + paths[: r % n]:
            server = servers.get(path, next(iter(servers.values())))
            rounds[path].append(
                await step_round(path, scratch / "local", server, args.steps, args.warmup_steps, r)
            )
    return rounds


def print_steps(rounds: dict[str, list[Round]]) -> float:
    """The table's rows, and under them p90, mean and context switches; returns the
    median of the rounds' difference over local mode of the last path."""
    paths = list(rounds)
    print("| Path | Step p50 | Over local |\n| --- | ---: | ---: |")
    local = [x.step_us for x in rounds["local"]]
    last_over = 0.0
    for path in paths:
        steps = [x.step_us for x in rounds[path]]
        over = ""
        if path != "local":
            diffs = [s - base for s, base in zip(steps, local, strict=True)]
            over = f"{p50(diffs):+.1f} µs ({us_range(diffs, sign=True)})"
            last_over = p50(diffs)
        print(f"| {ROW_NAMES[path]} | {p50(steps):.1f} µs ({us_range(steps)}) | {over} |")
    named = {path: ROW_NAMES[path].lower() for path in paths}
    spread = ", ".join(
        f"{named[path]} {p50([x.p90_us for x in rounds[path]]):.1f} and "
        f"{statistics.fmean(x.mean_us for x in rounds[path]):.1f} µs"
        for path in paths
    )
    print(f"  (the median of the rounds' p50, and their range; p90 and mean: {spread})")
    switches = "; ".join(
        f"{named[path]} {p50([x.switches for x in rounds[path]]):.1f} here"
        + (
            ""
            if path == "local"
            else f" + {p50([x.server_switches for x in rounds[path]]):.1f} in the server"
        )
        for path in paths
    )
    print(f"  voluntary context switches per step (every thread), median of the rounds: {switches}")
    return last_over


async def step_table(args: argparse.Namespace, scratch: Path, disk: str) -> None:
    """The reference table: local mode, the Unix socket and loopback TCP."""
    server = await Server(scratch / "server-1", scratch / "s1.sock", shards=1).ready()
    try:
        rounds = await step_rounds(args, scratch, {"unix": server, "tcp": server})
    finally:
        server.stop()
    floor = await echo_floor(scratch)
    print(
        f"sequential step: {args.steps} steps of one workflow, {args.rounds} rounds alternating local mode, "
        f"the Unix socket and loopback TCP; one shard; {disk}"
    )
    tcp_over = print_steps(rounds)
    named = {path: ROW_NAMES[path].lower() for path in PATHS}
    trips = ", ".join(f"{named[path]} {floor[path]:.1f} µs" for path in floor)
    print(
        f'  the floor under "Over local" here: a bare asyncio round trip of {ECHO_BYTES} bytes to '
        f"another process and back, p50 of {ECHO_TRIPS:,}: {trips}"
    )
    verdict = "met" if tcp_over <= OVER_LOCAL_GOAL_US else "NOT MET"
    print(
        f"goal: a step over TCP at most local + {OVER_LOCAL_GOAL_US:.0f} µs: {tcp_over:+.1f} µs "
        f"(median of the rounds): {verdict}"
    )


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


class _Pinger(asyncio.Protocol):
    def __init__(self) -> None:
        self.left = 0
        self.done: asyncio.Future[None] | None = None

    def data_received(self, data: bytes) -> None:
        self.left -= len(data)
        if self.left <= 0 and self.done is not None:
            self.done.set_result(None)


async def echo_process(unix: str) -> None:
    """`--echo PATH`: echo every byte on loopback TCP and on the Unix socket `PATH`
    until stdin closes."""
    loop = asyncio.get_running_loop()
    tcp = await loop.create_server(_Echo, "127.0.0.1", 0)
    await loop.create_unix_server(_Echo, unix)
    print("echo", tcp.sockets[0].getsockname()[1], flush=True)
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    await stdin.read()


async def round_trip_us(path: str, unix: Path, port: int) -> float:
    """p50 of a bare asyncio round trip of ECHO_BYTES to another process and back: the
    floor under what the wire adds to a step on this machine."""
    loop = asyncio.get_running_loop()
    if path == "unix":
        transport, pinger = await loop.create_unix_connection(_Pinger, str(unix))
    else:
        transport, pinger = await loop.create_connection(_Pinger, "127.0.0.1", port)
    data, times = b"x" * ECHO_BYTES, []
    try:
        for _ in range(ECHO_TRIPS + ECHO_TRIPS // 10):
            pinger.left, pinger.done = ECHO_BYTES, loop.create_future()
            began = time.perf_counter_ns()
            transport.write(data)
            await pinger.done
            times.append((time.perf_counter_ns() - began) / 1000)
    finally:
        transport.close()
    return p50(times[ECHO_TRIPS // 10 :])


async def echo_floor(scratch: Path) -> dict[str, float]:
    unix = scratch / "echo.sock"
    echo = Child([sys.executable, str(Path(__file__).resolve()), "--echo", str(unix)], stdin=True)
    try:
        port = int((await echo.wait_for_async(r"^echo (\d+)$")).group(1))
        return {path: await round_trip_us(path, unix, port) for path in ("unix", "tcp")}
    finally:
        echo.stop()


# -- 2. and 3. worker processes over one server of four shards; its memory ----------------


@dataclass
class Window:
    steps_per_s: float
    per_worker: list[float]
    server_cpu: float  # share of one core over the window
    worker_cpu: list[float]
    servers_cpu: list[float] = field(default_factory=list)  # each server's, the owner first
    rss_kib: int = 0  # the (owning) server's, idle, after the window (1 worker only)
    hwm_kib: int = 0
    start_rss_kib: int = 0
    servers_rss_kib: list[int] = field(default_factory=list)


async def disk_servers(scratch: Path, workers: int) -> list[Server]:
    """A fresh server of four shards on a data directory of its own."""
    server = Server(scratch / f"server-{workers}w", scratch / f"s{workers}.sock", THROUGHPUT_SHARDS)
    return [await server.ready()]


async def workers_window(
    args: argparse.Namespace,
    scratch: Path,
    workers: int,
    servers: Callable[[], Awaitable[list[Server]]] | None = None,
    rss: bool = False,
) -> Window:
    """Fresh servers of four shards (`servers`' first one owns them; by default one on a
    data directory) and `workers` worker processes splitting them, reaching every server
    through one address list; all step at once; each counts its steps over the same
    window. With `workers` 0: one process in local mode instead (four shards, its own data
    directory), no server. With `rss`, every server's memory is read after the window."""
    started_servers = (
        await (servers or functools.partial(disk_servers, scratch, workers))() if workers else []
    )
    server = started_servers[0] if started_servers else None
    started: list[Worker] = []
    try:
        start_rss = server.status_kib("VmRSS") if server else 0
        if server:
            shards = THROUGHPUT_SHARDS // workers
            address = ",".join(s.tcp for s in started_servers) + f"?max-shards={shards}"
        else:
            address = f"{LOCAL_PREFIX}{scratch / 'local-4'}"
        script = Path(__file__).resolve()
        for _ in range(max(workers, 1)):
            # One at a time: each takes its shards before the next connects.
            started.append(Worker(script, address, args.in_flight, args.run_steps))
            held = (await started[-1].wait_for_async(r"^ready (.*)$")).group(1).split()
            assert len(held) == THROUGHPUT_SHARDS // max(workers, 1), f"a worker holds shards {held}"
        for worker in started:
            worker.send(f"go {args.warmup} {args.window}")
        await asyncio.sleep(args.warmup)
        cpu_before, began = [s.cpu_s() for s in started_servers], time.monotonic()
        counts = [
            (await w.wait_for_async(r"^steps (\S+) (\S+) (\S+)$", args.window + 60)).groups() for w in started
        ]
        elapsed = time.monotonic() - began
        cpu = [(s.cpu_s() - before) / elapsed for s, before in zip(started_servers, cpu_before, strict=True)]
        per_worker = [int(n) / float(s) for n, s, _ in counts]
        window = Window(
            sum(per_worker), per_worker, cpu[0] if cpu else 0.0, [float(c) for _, _, c in counts], cpu
        )
        for worker in started:
            worker.send("quiesce")
        for worker in started:
            await worker.wait_for_async(r"^quiet$", 60)
        if server and (rss or workers == 1):
            await asyncio.sleep(args.idle)
            window.rss_kib = server.status_kib("VmRSS")
            window.hwm_kib = server.status_kib("VmHWM")
            window.start_rss_kib = start_rss
            window.servers_rss_kib = [s.status_kib("VmRSS") for s in started_servers]
    finally:
        for worker in reversed(started):
            worker.stop()
        for each in reversed(started_servers):
            each.stop()
    return window


async def worker_table(args: argparse.Namespace, scratch: Path) -> Window:
    """Prints steps per second for 1, 2 and 4 worker processes, and for one process in
    local mode; returns the 1-worker window."""
    print(
        f"steps per second: a server of {THROUGHPUT_SHARDS} shards over loopback TCP, worker processes "
        f"splitting them (max-shards), {args.in_flight} runs of {args.run_steps} steps at once per shard "
        f"(a new one as each ends), counted over "
        f"{args.window:g} s after {args.warmup:g} s ({os.cpu_count()} cores)"
    )
    first: Window | None = None
    for workers in WORKER_COUNTS:
        window = await workers_window(args, scratch, workers)
        first = first or window
        each = ", ".join(f"{rate:,.0f}" for rate in window.per_worker)
        cpu = " + ".join(f"{c:.0%}" for c in window.worker_cpu)
        print(
            f"  {workers} worker{'s' if workers > 1 else ' '} (max-shards={THROUGHPUT_SHARDS // workers}): "
            f"{window.steps_per_s:,.0f} steps/s"
            + (f" ({each})" if workers > 1 else "")
            + f"; CPU: server {window.server_cpu:.0%}, workers {cpu}"
        )
    local = await workers_window(args, scratch, 0)
    print(
        f"  for reference, local mode in one process ({THROUGHPUT_SHARDS} shards, the same load): "
        f"{local.steps_per_s:,.0f} steps/s; CPU {local.worker_cpu[0]:.0%}"
    )
    assert first is not None
    return first


def print_rss(window: Window, idle_s: float) -> None:
    mib = window.rss_kib / 1024
    verdict = "met" if mib < RSS_GOAL_MIB else "NOT MET"
    print(
        f"server RSS, one worker holding its {THROUGHPUT_SHARDS} shards, idle {idle_s:g} s after the 1-worker "
        f"window: {mib:.1f} MiB (at its start {window.start_rss_kib / 1024:.1f} MiB, peak "
        f"{window.hwm_kib / 1024:.1f} MiB); goal: under {RSS_GOAL_MIB:.0f} MiB: {verdict}"
    )


# -- --store postgresql: the same figures on the PostgreSQL store -------------------------


async def pg_servers(db: Database, count: int, shards: int = THROUGHPUT_SHARDS) -> list[Server]:
    """`count` fresh servers on a new database of `shards`: the first owns the shards, the
    others stand by."""
    url = await db.fresh()
    first = await Server(Path(), Path(), shards, store=url, port=free_port()).ready()
    rest = [
        Server(Path(), Path(), shards, store=url, port=free_port(), standby=True) for _ in range(count - 1)
    ]
    for each in rest:
        await each.ready()
    return [first, *rest]


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


async def store_tables(args: argparse.Namespace, scratch: Path, disk: str) -> None:
    """The step table, steps per second and memory with the PostgreSQL store, each beside
    the disk store measured in the same run, and the database's own floor."""
    db = Database(args.store, scratch)
    try:
        floor = await floor_us(await db.fresh())
        servers = {
            "tcp": await Server(scratch / "server-1", scratch / "s1.sock", shards=1).ready(),
            "postgresql": (await pg_servers(db, 1, shards=1))[0],
        }
        try:
            rounds = await step_rounds(args, scratch, servers)
        finally:
            for server in servers.values():
                server.stop()
        print(
            f"sequential step: {args.steps} steps of one workflow, {args.rounds} rounds alternating local "
            f"mode, a server on a data directory and a server on PostgreSQL, both over loopback TCP; one "
            f"shard; the disk: {disk}; the database: {db.where()}"
        )
        print_steps(rounds)
        on_pg = p50([x.step_us for x in rounds["postgresql"]])
        over = p50([a.step_us - b.step_us for a, b in zip(rounds["postgresql"], rounds["tcp"], strict=True)])
        print(
            f"  the database's floor from asyncio, p50 of {TRIPS:,}: SELECT 1 {floor['select']:.1f} µs, a "
            f"one-row UPDATE committed {floor['commit']:.1f} µs; a step on PostgreSQL: {on_pg:.1f} µs, "
            f"{on_pg / floor['commit']:.2f}x that commit, {over:+.1f} µs over the disk server"
        )
        print(
            f"steps per second: {THROUGHPUT_SHARDS} shards over loopback TCP, worker processes splitting "
            f"them, {args.in_flight} runs of {args.run_steps} steps at once per shard, counted over "
            f"{args.window:g} s after {args.warmup:g} s ({os.cpu_count()} cores); CPU: 100% is one core"
        )
        print("| Servers | Workers | Disk store | PostgreSQL store | CPU, servers | Servers' RSS, idle |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for count, workers in [(1, w) for w in WORKER_COUNTS] + [(2, 4), (3, 4)]:
            on_disk = await workers_window(args, scratch, workers) if count == 1 else None
            window = await workers_window(
                args, scratch, workers, functools.partial(pg_servers, db, count), True
            )
            cpu = " + ".join(f"{c:.0%}" for c in window.servers_cpu)
            print(
                f"| {count} | {workers} | {f'{on_disk.steps_per_s:,.0f}' if on_disk else '(one server)'} | "
                f"{window.steps_per_s:,.0f} | {cpu} | {', '.join(mib(k) for k in window.servers_rss_kib)} |"
            )
        print(
            "  (one server owns every shard and serves them; the others stand by, ready to take them "
            "over: docs/postgresql.md)"
        )
    finally:
        db.stop()


# -- a worker process ---------------------------------------------------------------------


def ids_on(engine: fusee.Engine, index: int) -> Iterator[str]:
    """Fresh workflow IDs that fall on shard `index`."""
    for i in itertools.count():
        wid = f"burst-{os.getpid()}-{i}"
        if engine.shard_index(wid) == index:
            yield wid


async def keep_busy(engine: fusee.Engine, ids: Iterator[str], steps: int) -> None:
    """One slot: a run of `steps` steps, and as it ends the next, until told to stop."""
    while STEPPING:
        await (await engine.start(burst, next(ids), steps)).result()


async def worker_process(address: str, per_shard: int, run_steps: int) -> None:
    """`--worker ADDRESS`: hold what the server grants (or, for `dir:PATH`, every shard
    of a local directory), print `ready SHARDS`; on `go WARMUP WINDOW` keep `per_shard`
    runs of `run_steps` steps going on each held shard and print `steps COUNT SECONDS
    CPU` for the window; on `quiesce` let them end and print `quiet`; close on `stop` or
    when stdin closes (the benchmark went away)."""
    global STEPPING
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    if address.startswith(LOCAL_PREFIX):
        directory = address[len(LOCAL_PREFIX) :]
        engine = await fusee.Engine.open(directory, workflows=WORKFLOWS, shards=THROUGHPUT_SHARDS)
    else:
        engine = await fusee.Engine.open(durability="server", address=address, workflows=WORKFLOWS)
    held = sorted(shard.index for shard in engine.shards)
    print("ready", *held, flush=True)
    try:
        line = (await commands.readline()).decode().split()
        if not line or line[0] != "go":
            return
        warmup, window = float(line[1]), float(line[2])
        slots = []
        for index in held:
            ids = ids_on(engine, index)
            slots += [asyncio.ensure_future(keep_busy(engine, ids, run_steps)) for _ in range(per_shard)]
        await asyncio.sleep(warmup)
        count, began, cpu = TICKS, time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(window)
        after = resource.getrusage(resource.RUSAGE_SELF)
        count, elapsed = TICKS - count, time.perf_counter() - began
        used = (after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime) / elapsed
        print(f"steps {count} {elapsed:.6f} {used:.4f}", flush=True)
        if (await commands.readline()).decode().strip() != "quiesce":
            return
        STEPPING = False
        await asyncio.gather(*slots)
        print("quiet", flush=True)
        await commands.readline()  # `stop`, or the end of stdin
    finally:
        await engine.close()


# -- main ---------------------------------------------------------------------------------


async def run_all(args: argparse.Namespace, scratch: Path) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    began = time.monotonic()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"server_cost: Python {sys.version.split()[0]}, {os.cpu_count()} cores, load average {load} at the "
        "start (other processes on the machine move these figures)"
    )
    kind = fs_type(scratch)
    latencies, direct = _native.disk_check(str(scratch), args.disk_check)
    flush_us = p50([x / 1000 for x in latencies])
    disk = (
        f"{kind} under {scratch.parent}, flush p50 {flush_us:.0f} µs ({'O_DIRECT' if direct else 'buffered'})"
    )
    if args.store:
        await store_tables(args, scratch, disk)
    else:
        await step_table(args, scratch, disk)
        first = await worker_table(args, scratch)
        print_rss(first, args.idle)
    print(f"({time.monotonic() - began:.0f} s in all)")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("steps", type=int, nargs="?", default=500, help="steps of the timed workflow (500)")
    parser.add_argument("rounds", type=int, nargs="?", default=7, help="rounds alternating the paths (7)")
    parser.add_argument("--warmup-steps", type=int, default=50, help="an untimed workflow after each open")
    parser.add_argument("--in-flight", type=int, default=64, help="runs stepping at once per shard (64)")
    parser.add_argument("--run-steps", type=int, default=50, help="steps of each of those runs (50)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before the window")
    parser.add_argument("--window", type=float, default=8.0, help="seconds steps are counted over")
    parser.add_argument("--idle", type=float, default=2.0, help="seconds idle before the RSS is read")
    parser.add_argument("--disk-check", type=float, default=0.5, help="seconds of the flush latency check")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="parent of the scratch")
    parser.add_argument(
        "--store",
        metavar="postgresql[://URL]",
        default="",
        help="the figures on the PostgreSQL store beside the disk's: a private cluster, or the one at URL",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: every figure, few seconds each")
    parser.add_argument("--worker", metavar="ADDRESS", help=argparse.SUPPRESS)  # a worker process
    parser.add_argument("--echo", metavar="PATH", help=argparse.SUPPRESS)  # the round trip's far end
    args = parser.parse_args()
    if args.quick:
        args.steps, args.rounds, args.warmup_steps = min(args.steps, 100), min(args.rounds, 2), 10
        args.in_flight, args.warmup, args.window, args.idle, args.disk_check = 16, 0.3, 0.7, 0.5, 0.1
    if args.worker is None and args.echo is None and (args.steps < 2 or args.rounds < 1):
        parser.error("need at least 2 steps and 1 round")
    if (
        args.store
        and args.store != "postgresql"
        and not args.store.startswith(("postgresql://", "postgres://"))
    ):
        parser.error(f"--store {args.store!r}: expected postgresql (a private cluster) or postgresql://URL")
    return args


def main() -> int:
    args = arguments()
    if args.worker is not None:
        asyncio.run(worker_process(args.worker, args.in_flight, args.run_steps))
        return 0
    if args.echo is not None:
        asyncio.run(echo_process(args.echo))
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="fusee-server-cost-", dir=args.dir.resolve()))
    if len(str(scratch / "s1.sock")) > 100:
        shutil.rmtree(scratch)
        sys.exit(f"--dir {args.dir}: too long a path for a Unix socket under it")
    return run_in(scratch, run_all(args, scratch))


if __name__ == "__main__":
    sys.exit(main())
